"""Bad input through run.py: one line on stderr, exit code 2, before any model loads and before a run
directory exists."""
from __future__ import annotations

import os
import shutil
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
    (["task.lengths=[0]"], "task.lengths must be positive"),
    (["task.limit=2.5"], "task.limit"),
    (["runner.device=tpu"], "runner.device must be"),
    (["runner.on_error=maybe"], "runner.on_error"),
    (["hydra/launcher=nope"], "hydra/launcher/nope'; available: basic, local, slurm"),
    (["-m", "method=full", "hydra/launcher=submitit_local", "hydra.launcher.nope=1"], "unknown config key"),
    (["+foo=1"], "unknown config key 'foo'"),              # added keys are refused like `foo=1`
    (["+task.nope=1"], "unknown config key 'task.nope'"),
    (["-m", "method=quest", "++method.nope=1,2"], "unknown config key 'method.nope'"),
    (["-m", "method=quest,tidal", "method.budget=64"], "write it ++method.budget=..."),   # Hydra's sweep base
]
# Found after the tokenizer, still before the model: prompts that cannot be built, models not there.
LATE_CASES = [
    (["task.lengths=[40]"], "too short for the passkey prompt"),
    (["model.path=/nonexistent/model"], "model.path=/nonexistent/model does not exist"),
]


def _run(args, tmp_path, env=None):
    # the case's own arguments last: they win over these defaults
    return subprocess.run([sys.executable, str(ROOT / "run.py"), f"runner.results_dir={tmp_path / 'runs'}",
                           "runner.wandb.mode=disabled", f"hydra.run.dir={tmp_path / 'hydra'}", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)


def _assert_one_line(proc, needle, tmp_path):
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ") and needle in lines[0], lines[0]
    assert not (tmp_path / "runs").exists()  # nothing ran: no run directory, not even a config.yaml


@pytest.mark.parametrize("args,needle", CASES + LATE_CASES)
def test_bad_input_is_one_line_exit_2(args, needle, tmp_path):
    _assert_one_line(_run(args, tmp_path), needle, tmp_path)


@pytest.mark.skipif(bool(shutil.which("sbatch")), reason="this machine has Slurm")
def test_slurm_sweep_without_slurm_says_use_submitit_local(tmp_path):
    proc = _run(["-m", "method=full,quest", "hydra/launcher=slurm"], tmp_path)
    _assert_one_line(proc, "no sbatch/srun on this machine; use hydra/launcher=submitit_local", tmp_path)


@pytest.mark.parametrize("args, needle", [(["task=longbench"], "LongBench"),
                                          (["task=ruler", "task.tasks=[qa_1]", "task.lengths=[1024]"], "qa_1"),
                                          (["task=pg19"], "task.data_dir"),
                                          (["task=pg19_compare", "task.prefix=512", "task.steps=8"], "pg19-test"),
                                          (["task=niah", "task.haystack=pg19"], "task.haystack_dir"),
                                          (["task=booksum"], "booksum"),
                                          (["task=aime", "task.max_new_tokens=256"], "AIME")])
def test_missing_hub_data_fails_fast_without_retry_noise(args, needle, tmp_path):
    """Hub data that is neither cached nor reachable: the endpoint probe (here: a closed local port,
    so the test means the same on a machine with network) puts the hub in offline mode, and the task
    fails in one line, without a minute of retry warnings and before the model loads."""
    env = {**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "hf")}
    env.pop("HF_HUB_OFFLINE", None)
    proc = _run(args, tmp_path, env=env)
    _assert_one_line(proc, needle, tmp_path)
    assert "Retrying" not in proc.stderr


def test_a_directory_without_a_model_says_which_files_it_lacks(tmp_path):
    empty = tmp_path / "model"
    empty.mkdir()
    (empty / "README.md").write_text("not a model\n")
    proc = _run(["model=llama3", f"model.path={empty}", "task.lengths=[1024]"], tmp_path)
    _assert_one_line(proc, f"model.path={empty} holds no model: it lacks config.json, weights", tmp_path)
    assert "tokenizer.json" in proc.stderr and "it has: README.md" in proc.stderr


def test_independent_problems_are_reported_together_and_offline_is_no_network(tmp_path):
    """The headline command on a machine without network and without trained heads: both problems in
    one line (one round trip), the hub's state said in words, not as OfflineModeIsEnabled."""
    env = {**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "hf")}
    env.pop("HF_HUB_OFFLINE", None)
    proc = _run(["method=lychee", "method.heads=methods/heads/no-such-file.json", "model=llama3",
                 "model.hub_id=sparse-harness-test/no-such-model", "task.lengths=[1024]"], tmp_path, env=env)
    _assert_one_line(proc, "2 problems: (1) ", tmp_path)
    assert "no-such-file.json" in proc.stderr and "there is no network" in proc.stderr
    assert "OfflineModeIsEnabled" not in proc.stderr


def test_unreachable_hub_model_names_model_path(tmp_path):
    """A hub model that is neither cached nor reachable: one line naming model.path, exit 2."""
    args = ["model=llama3", "model.hub_id=sparse-harness-test/no-such-model", "task.lengths=[1024]",
            "runner.wandb.mode=disabled", f"runner.results_dir={tmp_path}"]
    proc = subprocess.run([sys.executable, str(ROOT / "run.py"), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "model.path" in lines[0], proc.stderr
