"""Result storage: results/runs/<task>/<model>/<method>/<hash>/{config.yaml, samples.jsonl, summary.json}.

The hash is over the resolved config minus keys that do not change results (logging, progress,
where results go, and `task.limit`, so that raising the limit reuses the rows already computed).
Rows are appended and flushed one by one; a restarted run skips the ids already present, so an
interrupted run loses at most the sample in flight and never writes a row twice.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
from pathlib import Path

from omegaconf import OmegaConf

# Keys (dotted) that do not affect results and so stay out of the run hash.
NOT_HASHED = ("runner.wandb", "runner.progress", "runner.results_dir", "runner.name", "task.limit")


def config_hash(cfg) -> str:
    plain = OmegaConf.to_container(cfg, resolve=True)
    for dotted in NOT_HASHED:
        node = plain
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.get(p, {}) if isinstance(node, dict) else {}
        if isinstance(node, dict):
            node.pop(leaf, None)
    blob = json.dumps(plain, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:10]


class RunDir:
    def __init__(self, cfg):
        self.hash = config_hash(cfg)
        self.path = Path(cfg.runner.results_dir) / cfg.task.name / cfg.model.name / cfg.method.name / self.hash
        self.path.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(cfg, self.path / "config.yaml", resolve=True)
        self.samples_path = self.path / "samples.jsonl"
        self.summary_path = self.path / "summary.json"

    def rows(self) -> list[dict]:
        """Rows already written. A torn last line (killed mid-write) is dropped, not fatal."""
        if not self.samples_path.exists():
            return []
        out = []
        with open(self.samples_path) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
        return out

    def done_ids(self) -> set[str]:
        return {r["id"] for r in self.rows()}

    def repair(self) -> None:
        """Rewrite the file without a torn trailing line so appends start on a fresh line."""
        if not self.samples_path.exists():
            return
        raw = self.samples_path.read_text()
        if raw and not raw.endswith("\n"):
            good = self.rows()
            tmp = self.samples_path.with_suffix(".tmp")
            tmp.write_text("".join(json.dumps(r) + "\n" for r in good))
            os.replace(tmp, self.samples_path)

    def append(self, row: dict) -> None:
        with open(self.samples_path, "a") as f:
            f.write(json.dumps(row, default=_json_default) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def write_summary(self, summary: dict) -> None:
        tmp = self.summary_path.with_suffix(".tmp")
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
