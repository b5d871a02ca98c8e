"""Synthetic result runs for the analysis tests: run directories as run.py writes them (samples.jsonl
+ summary.json or, for an interrupted run, config.yaml), built from a cell's override values."""
from __future__ import annotations

import json
from pathlib import Path

import yaml

import analysis.papers  # noqa: F401  (registers the implementations)
from analysis import catalogue
from analysis.runs import expand


def nested(values: dict) -> dict:
    cfg: dict = {}
    for k, v in values.items():
        parts = [k, "name"] if "." not in k else k.split(".")
        node = cfg
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = v
    cfg["runner"] = {"seed": 42, "results_dir": "elsewhere", "wandb": {"mode": "offline"}}
    return cfg


def fake_run(results: Path, values: dict, hits: list[int], summary: bool = True) -> Path:
    d = results / values["task"] / values["model"] / values["method"] / f"h{abs(hash(str(values))) % 10**8}"
    d.mkdir(parents=True)
    with open(d / "samples.jsonl", "w") as f:
        f.writelines(json.dumps({"id": f"s{i}", "params": {"depth": i % 10}, "metrics": {"accuracy": float(hit)},
                                 "device": "cpu", "dtype": "torch.float32", "timestamp": 1.0e9 + i}) + "\n"
                     for i, hit in enumerate(hits))
    if summary:
        (d / "summary.json").write_text(json.dumps({"config": nested(values), "n_samples": len(hits),
                                                    "environment": {"git_commit": "abc1234"}}))
    else:
        (d / "config.yaml").write_text(yaml.safe_dump(nested(values)))
    return d


def table1_cells() -> dict:
    impl = catalogue.get("tidal.table1").impl
    return {(c.row, c.col): c for c in expand(impl.sweeps["embedded"], [], impl.label)}




def fake_metrics_run(results: Path, values: dict, rows: list[dict], params: list[dict] | None = None,
                     summary: bool = True) -> Path:
    """A run of `values` (finished unless summary=False) whose sample i carries the metrics dict rows[i]
    and the params dict params[i] (default {})."""
    d = results / values["task"] / values["model"] / values["method"] / f"h{abs(hash(str(values))) % 10**8}"
    d.mkdir(parents=True)
    with open(d / "samples.jsonl", "w") as f:
        f.writelines(json.dumps({"id": f"s{i}", "params": params[i] if params else {}, "metrics": m, "device": "cpu",
                                 "dtype": "torch.float32", "timestamp": 1.0e9 + i}) + "\n" for i, m in enumerate(rows))
    if summary:
        (d / "summary.json").write_text(json.dumps({"config": nested(values), "n_samples": len(rows),
                                                    "environment": {"git_commit": "abc1234"}}))
    else:
        (d / "config.yaml").write_text(yaml.safe_dump(nested(values)))
    return d
