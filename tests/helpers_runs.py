"""A tiny random-weight model for run-loop tests: the embedded model's tokenizer and prompts, two small
layers instead of thirty (weights=random seeds itself, so every process builds the same weights)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = ["model.weights=random", "model.arch.hidden_size=64", "model.arch.intermediate_size=128",
        "model.arch.num_hidden_layers=2", "model.arch.num_attention_heads=4", "model.arch.num_key_value_heads=2",
        "model.arch.head_dim=16"]
# Fields that differ between two runs of the same config by nature: when, how fast, which process.
VOLATILE = ("timings", "timestamp", "writer")


def grid(depths: int = 8, repeats: int = 5) -> list[str]:
    ds = ",".join(f"{d / (depths - 1):.3g}" for d in range(depths))
    return ["task.lengths=[256]", f"task.depths=[{ds}]", f"task.repeats={repeats}", "task.max_new_tokens=4",
            "task.decode_tail=4"]


def compose(*overrides):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        return hydra_compose(config_name="config", overrides=list(overrides))


def stable(rows: list[dict]) -> dict[str, dict]:
    return {r["id"]: {k: v for k, v in r.items() if k not in VOLATILE} for r in rows}


def run_py(args: list[str], tmp_path: Path, **kw) -> subprocess.Popen:
    """run.py in a child process (its Hydra output dir under tmp_path, not in the checkout)."""
    cmd = [sys.executable, str(ROOT / "run.py"), *args, f"hydra.run.dir={tmp_path / 'hydra'}",
           f"hydra.sweep.dir={tmp_path / 'multirun'}"]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def count_lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0
