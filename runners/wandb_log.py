"""W&B mirror of a run's rows and summary. Local results stay the source of truth.

`runner.wandb.mode`: disabled (no wandb import at all), offline (default: writes under
`runner.wandb.dir`, no account, no network; `wandb sync` later uploads), online.

- Rows are logged as they land, so an interrupted run has logged what it computed.
- The W&B run id is the run's config hash, resumed on every rerun: a rerun continues the same W&B run.
  Offline, W&B cannot append to a directory it wrote, so a rerun writes a new offline directory that
  first logs again every row already on disk (steps 1..k, in file order) and then the new ones, and
  removes the earlier directories of that id once it has finished: one offline directory per run id,
  holding the run's whole history (`wandb sync` of it after an earlier one was synced adds the new
  steps only).
- A rerun that computes nothing new, of a run whose summary was already logged, opens no W&B run.
- Steps only grow across reruns (the base counts every row line already on disk), as W&B requires
  of a resumed run.
- Name, group and tags derive from the config and the command line's overrides, never random: the
  jobs of a `method.reselect_layer=7,14` sweep are named `...-reselect_layer=7` and `...=14`.
"""
from __future__ import annotations

import json
import os

from omegaconf import OmegaConf

from runners.results import NOT_HASHED

MAX_TABLE_ROWS = 2000
TIMING_COLUMNS = ("prefill_s", "tail_s", "decode_ms_per_token", "nll_s", "peak_mem_gib")
# Overrides that do not change results (the run hash leaves them out: runners.results.NOT_HASHED) stay
# out of the name; every other one (runner.dtype, runner.batch_size ...) is part of it, so that two
# runs with two W&B ids never share a name.
SKIP_OVERRIDES = ("hydra", "+hydra", "~hydra", "runner.seed")


def job_overrides() -> list[str]:
    """The command line's overrides of this job (one combination of a sweep); [] outside Hydra."""
    try:
        from hydra.core.hydra_config import HydraConfig

        if HydraConfig.initialized():
            return list(HydraConfig.get().overrides.task)
    except Exception:   # no Hydra context (tests, the demo): a name without overrides
        pass
    return []


def run_name(cfg, overrides: list[str] | None = None) -> str:
    """method[-kBUDGET]-task-model-sSEED, then every other overridden key as short_key=value."""
    budget = cfg.method.get("budget")
    parts = [cfg.method.name] + ([f"k{budget}"] if budget is not None else []) + [cfg.task.name, cfg.model.name,
                                                                                    f"s{cfg.runner.seed}"]
    for o in overrides or []:
        key, _, value = o.lstrip("+~").partition("=")
        if key in ("method", "task", "model", "runner", "method.budget") or key.startswith(SKIP_OVERRIDES) \
                or key.startswith(NOT_HASHED):
            continue
        parts.append(f"{key.rsplit('.', 1)[-1]}={value.replace(' ', '')}")
    return "-".join(str(p) for p in parts)


class WandbLogger:
    def __init__(self, cfg, run_id: str, base_step: int = 0, history=None):
        self.cfg = cfg
        self.wcfg = cfg.runner.wandb
        self.run_id = run_id
        self.base_step = base_step
        self.history = history        # callable: the rows on disk before this process (offline relog)
        self.steps = 0
        self.run = None
        self.replaces: list = []      # earlier offline directories of this id, removed after finish

    def _earlier_offline(self) -> list:
        from pathlib import Path

        if self.wcfg.mode != "offline":
            return []
        return sorted(Path(self.wcfg.dir).glob(f"wandb/offline-run-*-{self.run_id}"))

    @property
    def enabled(self) -> bool:
        return self.wcfg.mode != "disabled"

    def _start(self):
        if self.run is not None:
            return self.run
        import wandb

        os.makedirs(self.wcfg.dir, exist_ok=True)
        os.environ.setdefault("WANDB_SILENT", "true")
        self.replaces = self._earlier_offline()
        self.run = wandb.init(
            project=self.wcfg.project, entity=self.wcfg.entity, mode=self.wcfg.mode, dir=self.wcfg.dir,
            id=self.run_id, resume="allow", name=run_name(self.cfg, job_overrides()),
            group=self.wcfg.group or f"{self.cfg.task.name}-{self.cfg.model.name}",
            tags=[self.cfg.method.name, self.cfg.task.name, self.cfg.model.name, *list(self.wcfg.tags or [])],
            config=OmegaConf.to_container(self.cfg, resolve=True), job_type="eval", reinit="finish_previous",
            settings=wandb.Settings(console="off", silent=True),
        )
        if self.replaces:   # offline rerun: this directory replaces the earlier ones, so it logs their rows too
            earlier = list(self.history() if self.history else [])
            for i, r in enumerate(earlier, 1):
                self.run.log(_row_data(r), step=i)
            self.base_step = len(earlier)
        return self.run

    def row(self, row: dict) -> None:
        """One sample's metrics and latency, as soon as its row is on disk."""
        if not self.enabled:
            return
        run = self._start()
        self.steps += 1
        run.log(_row_data(row), step=self.base_step + self.steps)

    def finish(self, rows: list[dict], failures: list[dict], summary: dict, previous: dict | None) -> dict | None:
        """Summary and the samples table; returns what summary.json records of it (None: disabled)."""
        if not self.enabled:
            return None
        n = len(rows) + len(failures)
        record = {"id": self.run_id, "project": self.wcfg.project, "mode": self.wcfg.mode, "logged_rows": n,
                  "steps": self.base_step + self.steps}
        prev = (previous or {}).get("wandb") or {}
        if self.run is None and prev.get("id") == self.run_id and prev.get("logged_rows") == n:
            return {**record, "steps": max(record["steps"], int(prev.get("steps") or 0))}   # nothing new to log
        run = self._start()
        try:
            for key, value in _flatten(summary.get("metrics", {})).items():
                run.summary[key] = value
            for key, value in summary.get("timings", {}).items():
                run.summary[f"timings/{key}"] = value
            run.summary["run_id"] = summary["run_id"]
            run.summary["n_failed"] = summary.get("n_failed", 0)
            columns = ["id", "status", "params", "prediction", "references", "metrics", "input_tokens",
                       "output_tokens", *TIMING_COLUMNS, "error"]
            import wandb

            table = wandb.Table(columns=columns)
            for r in (rows + failures)[:MAX_TABLE_ROWS]:
                table.add_data(*[_cell(r, c) for c in columns])
            run.log({"samples": table}, step=self.base_step + self.steps + 1)
        finally:
            run.finish()
            self.run = None
        import shutil

        for path in self.replaces:   # their rows are in the directory just finished
            shutil.rmtree(path, ignore_errors=True)
        record["steps"] = self.base_step + self.steps + 1
        return record


def _row_data(row: dict) -> dict:
    data = {"sample/ok": int(row.get("status", "ok") == "ok")}
    for k, v in (row.get("metrics") or {}).items():
        if isinstance(v, (int, float)):
            data[f"sample/{k}"] = v
    for k in TIMING_COLUMNS:
        v = (row.get("timings") or {}).get(k)
        if isinstance(v, (int, float)):
            data[f"sample/{k}"] = v
    return data


def _cell(row: dict, column: str):
    if column in TIMING_COLUMNS:
        return (row.get("timings") or {}).get(column)
    if column == "status":
        return row.get("status", "ok")
    value = row.get(column)
    return json.dumps(value) if isinstance(value, (dict, list)) else value


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "/"))
        else:
            out[key] = v
    return out
