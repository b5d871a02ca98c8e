"""W&B mirror of a run's rows and summary. Local results stay the source of truth.

`runner.wandb.mode`: disabled (no wandb import at all), offline (default: writes under
`runner.wandb.dir`, no account, no network; `wandb sync` later uploads), online.
Name, group and tags derive from the config, never random.
"""
from __future__ import annotations

import json
import os

from omegaconf import OmegaConf

MAX_TABLE_ROWS = 2000


def run_name(cfg) -> str:
    budget = cfg.method.get("budget")
    parts = [cfg.method.name] + ([f"k{budget}"] if budget is not None else []) + [cfg.task.name, cfg.model.name,
                                                                                    f"s{cfg.runner.seed}"]
    return "-".join(str(p) for p in parts)


class WandbLogger:
    def __init__(self, cfg):
        self.cfg = cfg
        self.wcfg = cfg.runner.wandb

    def log(self, rows: list[dict], summary: dict) -> None:
        if self.wcfg.mode == "disabled":
            return
        import wandb

        os.makedirs(self.wcfg.dir, exist_ok=True)
        os.environ.setdefault("WANDB_SILENT", "true")
        run = wandb.init(
            project=self.wcfg.project, entity=self.wcfg.entity, mode=self.wcfg.mode, dir=self.wcfg.dir,
            name=run_name(self.cfg), group=self.wcfg.group or f"{self.cfg.task.name}-{self.cfg.model.name}",
            tags=[self.cfg.method.name, self.cfg.task.name, self.cfg.model.name, *list(self.wcfg.tags or [])],
            config=OmegaConf.to_container(self.cfg, resolve=True), job_type="eval", reinit="finish_previous",
            settings=wandb.Settings(console="off", silent=True),
        )
        try:
            for key, value in _flatten(summary.get("metrics", {})).items():
                run.summary[key] = value
            for key, value in summary.get("timings", {}).items():
                run.summary[f"timings/{key}"] = value
            run.summary["run_id"] = summary["run_id"]
            columns = ["id", "params", "prediction", "references", "metrics", "input_tokens", "output_tokens"]
            table = wandb.Table(columns=columns)
            for r in rows[:MAX_TABLE_ROWS]:
                table.add_data(*[json.dumps(r.get(c)) if isinstance(r.get(c), (dict, list)) else r.get(c)
                                 for c in columns])
            run.log({"samples": table})
        finally:
            run.finish()


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "/"))
        else:
            out[key] = v
    return out
