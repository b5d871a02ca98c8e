"""Result storage: results/runs/<task>/<model>/<method>/<hash>/{config.yaml, samples.jsonl, failed.jsonl,
summary.json}.

The hash is over the resolved config minus keys that do not change results (logging, progress,
where results go, what to do on a sample's error, and `task.limit`, so that raising the limit reuses
the rows already computed). Rows go through `runners.store.RowStore`: appended and fsync'ed one by
one under a lock; a restarted run skips the ids already present, retries the ids that failed, and
repairs what a kill left behind (see store.py), so an interrupted run loses at most the sample in
flight and never writes a row twice.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
from pathlib import Path

from omegaconf import OmegaConf

from runners.store import RowStore, read_failures, read_rows

# Keys (dotted) that do not affect results and so stay out of the run hash.
NOT_HASHED = ("runner.wandb", "runner.progress", "runner.results_dir", "runner.name", "runner.on_error",
              "task.limit", "runner.devices", "model.gpus")   # placement: each layer runs the same kernels
# Keys added after runs existed, hashed only when set (null = the behaviour before the key).
HASHED_WHEN_SET = (("model", "max_position"),)


def config_hash(cfg) -> str:
    plain = OmegaConf.to_container(cfg, resolve=True)
    for dotted in NOT_HASHED:
        node = plain
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.get(p, {}) if isinstance(node, dict) else {}
        if isinstance(node, dict):
            node.pop(leaf, None)
    for group, key in HASHED_WHEN_SET:
        if isinstance(plain.get(group), dict) and plain[group].get(key, 0) is None:
            plain[group].pop(key)
    blob = json.dumps(plain, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:10]


class RunDir:
    """A run's directory. Reading needs nothing; writing starts with open() (creates the directory,
    becomes a writer) and ends with close()."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.hash = config_hash(cfg)
        self.path = Path(cfg.runner.results_dir) / cfg.task.name / cfg.model.name / cfg.method.name / self.hash
        self.samples_path = self.path / "samples.jsonl"
        self.failed_path = self.path / "failed.jsonl"
        self.summary_path = self.path / "summary.json"
        self.store: RowStore | None = None

    def open(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        tmp = self.path / f"config.yaml.tmp{os.getpid()}"
        OmegaConf.save(self.cfg, tmp, resolve=True)
        os.replace(tmp, self.path / "config.yaml")
        self.store = RowStore(self.path)
        self.store.open()

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
            self.store = None

    def rows(self) -> list[dict]:
        """Finished rows, one per id (see store.read_rows)."""
        return read_rows(self.samples_path)

    def done_ids(self) -> set[str]:
        return {r["id"] for r in self.rows()}

    def failures(self) -> list[dict]:
        """Failed rows of samples not finished since, one per id."""
        return read_failures(self.failed_path, self.done_ids())

    def claim(self, sample_id: str) -> bool:
        return self.store.claim(sample_id)

    def append(self, row: dict) -> bool:
        return self.store.append(row)

    def record_failure(self, row: dict) -> None:
        self.store.fail(row)

    def line_count(self) -> int:
        """Lines in samples.jsonl and failed.jsonl (rows ever written since the last compaction)."""
        n = 0
        for path in (self.samples_path, self.failed_path):
            if path.exists():
                with open(path, "rb") as f:
                    n += sum(1 for _ in f)
        return n

    def previous_summary(self) -> dict | None:
        try:
            return json.loads(self.summary_path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    def write_summary(self, summary: dict) -> None:
        tmp = self.summary_path.with_name(f"summary.json.tmp{os.getpid()}")
        tmp.write_text(json.dumps(summary, indent=2, default=_json_default))
        os.replace(tmp, self.summary_path)


def _json_default(o):
    if hasattr(o, "tolist"):
        return o.tolist()
    return str(o)


def environment() -> dict:
    import torch
    import transformers

    env = {"python": platform.python_version(), "torch": torch.__version__,
           "transformers": transformers.__version__, "platform": platform.platform(),
           "git_commit": git_commit()}
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
        env["cuda"] = torch.version.cuda
    return env


def git_commit() -> str | None:
    if os.environ.get("HARNESS_COMMIT"):  # a copy of the tree without .git (e.g. a GPU box)
        return os.environ["HARNESS_COMMIT"]
    try:
        root = Path(__file__).resolve().parents[1]
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=5)
        return out.stdout.strip() or None
    except Exception:
        return None
