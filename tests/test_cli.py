"""Bad input through run.py: one line on stderr, exit code 2, before any model loads."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CASES = [
    (["method=nope"], "method/nope"),
    (["task=nope"], "task/nope"),
    (["model=nope"], "model/nope"),
    (["method.nope=1"], "unknown config key"),
    (["task.lengths=[100000]"], "exceeds"),
    (["runner.wandb.mode=sometimes"], "runner.wandb.mode"),
    (["-m", "task.lengths=[1024],[9000]"], "exceeds"),  # a bad combination inside a sweep
]


@pytest.mark.parametrize("args,needle", CASES)
def test_bad_input_is_one_line_exit_2(args, needle, tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "run.py"), *args, f"runner.results_dir={tmp_path}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ") and needle in lines[0]
    assert not any(tmp_path.iterdir())  # nothing ran


def test_unreachable_hub_model_names_model_path(tmp_path):
    """A hub model that is neither cached nor reachable: one line naming model.path, exit 2."""
    args = ["model=llama3", "model.hub_id=sparse-harness-test/no-such-model", "task.lengths=[1024]",
            "runner.wandb.mode=disabled", f"runner.results_dir={tmp_path}"]
    proc = subprocess.run([sys.executable, str(ROOT / "run.py"), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "model.path" in lines[0], proc.stderr
