"""The table a sweep prints at its end (a Hydra callback, conf/config.yaml `hydra.callbacks`).

Each job writes `job.json` into its sweep subdirectory (results/multirun/<date>/<time>/<num>/): its
overrides, then its status and the headline of its summary. When the sweep ends, the launching
process reads them back (the jobs may have run in other processes: submitit, Slurm) and prints one
line per job: the swept keys, the metric, n, the attended fraction and the run directory, which
maps the opaque config hashes of results/runs/ to what was swept. The same table is written to
`sweep.md` beside the jobs.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

try:
    from hydra.experimental.callback import Callback
except ImportError:   # pragma: no cover - Hydra is a dependency; this keeps the module importable alone
    Callback = object

# The metric a task's summary leads with, first found wins; else its first numeric scalar but n.
HEADLINE = ("score", "accuracy", "average", "acc", "ppl", "exact_match", "pass@1")


class SweepTable(Callback):
    def on_job_start(self, config, **kwargs: Any) -> None:
        _write(config, {"num": _num(config), "overrides": list(config.hydra.overrides.task), "status": "running"})

    def on_job_end(self, config, job_return, **kwargs: Any) -> None:
        record = {"num": _num(config), "overrides": list(config.hydra.overrides.task),
                  "status": getattr(job_return.status, "name", str(job_return.status)).lower()}
        value = job_return._return_value if hasattr(job_return, "_return_value") else None
        if isinstance(value, dict):
            record.update(headline(value))
        _write(config, record)

    def on_multirun_end(self, config, **kwargs: Any) -> None:
        sweep = Path(str(config.hydra.sweep.dir))
        lines = table(read_jobs(sweep))
        if not lines:
            return
        (sweep / "sweep.md").write_text("\n".join(lines) + "\n")
        print("\n".join([f"\nsweep: {sweep} ({len(lines) - 2} jobs; also in sweep.md)", *lines]))


def headline(summary: dict) -> dict:
    metrics = summary.get("metrics") or {}
    numeric = {k: v for k, v in metrics.items()
               if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "n"}
    name = next((k for k in HEADLINE if k in numeric), next(iter(numeric), None))
    attended = (summary.get("attended") or {}).get("mean_fraction")
    return {"metric": name, "value": numeric.get(name), "n": summary.get("n_samples"),
            "failed": summary.get("n_failed"), "attended": attended,
            "warning": bool((summary.get("attended") or {}).get("warning")),
            "results_dir": summary.get("results_dir"), "run_id": summary.get("run_id")}


def read_jobs(sweep: Path) -> list[dict]:
    jobs = []
    for path in sweep.glob("*/job.json"):
        try:
            jobs.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    return sorted(jobs, key=lambda j: int(j.get("num") or 0))


def swept_keys(jobs: list[dict]) -> list[str]:
    """The override keys whose values differ between jobs, in command-line order."""
    values: dict[str, set] = {}
    for j in jobs:
        for o in j.get("overrides") or []:
            key, _, value = o.partition("=")
            values.setdefault(key, set()).add(value)
    for key, seen in values.items():   # a key some jobs lack differs too
        if any(key not in {o.partition("=")[0] for o in j.get("overrides") or []} for j in jobs):
            seen.add(None)
    return [k for k, v in values.items() if len(v) > 1]


def table(jobs: list[dict]) -> list[str]:
    """A markdown table, one row per job: swept keys, metric, n, attended fraction, run directory."""
    if not jobs:
        return []
    keys = swept_keys(jobs)
    head = ["job", *keys, "metric", "n", "attended", "results"]
    rows = []
    for j in jobs:
        over = dict(o.partition("=")[::2] for o in j.get("overrides") or [])
        if j.get("metric") is None and j.get("status") != "completed":
            metric = "(failed: no summary)"    # "running" left behind: the job exited before its end
        else:
            value = j.get("value")
            metric = f"{j['metric']}={value:.4g}" if isinstance(value, (int, float)) else str(j.get("metric"))
        n = f"{j.get('n')}" + (f" ({j['failed']} failed)" if j.get("failed") else "")
        att = j.get("attended")
        att = "" if att is None else f"{att:.0%}" + (" (dense!)" if j.get("warning") else "")
        rows.append([str(j.get("num")), *[over.get(k, "") for k in keys], metric, n, att, j.get("results_dir") or ""])
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    return lines + ["| " + " | ".join(r) + " |" for r in rows]


def _num(config) -> int:
    return int(config.hydra.job.get("num") or 0)


def _write(config, record: dict) -> None:
    from hydra.types import RunMode

    if config.hydra.get("mode") != RunMode.MULTIRUN:
        return   # a single run prints its own table
    out = Path(str(config.hydra.runtime.output_dir))
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f"job.json.tmp{id(record)}"
    tmp.write_text(json.dumps(record, indent=1, default=str))
    tmp.replace(out / "job.json")
