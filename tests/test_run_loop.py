"""The run loop on the embedded model: rows, summary, resume after an interruption, W&B offline."""
from __future__ import annotations

import json

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from runners import run as run_module
from runners.results import RunDir
from runners.cli import CONF_DIR

pytestmark = pytest.mark.slow


def _cfg(tmp_path, *extra):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=[
            "task.lengths=[256]", "task.depths=[0.2,0.5,0.8]", "task.decode_tail=4", "task.max_new_tokens=6",
            f"runner.results_dir={tmp_path / 'runs'}", *extra])


class Interrupt(Exception):
    pass


def test_interrupted_run_resumes_without_repeats_or_losses(tmp_path, monkeypatch):
    cfg = _cfg(tmp_path, "runner.wandb.mode=disabled")
    real_append = RunDir.append
    calls = {"n": 0}

    def flaky_append(self, row):
        if calls["n"] == 2:
            raise Interrupt()  # killed while the third sample was in flight
        calls["n"] += 1
        real_append(self, row)

    monkeypatch.setattr(RunDir, "append", flaky_append)
    with pytest.raises(Interrupt):
        run_module.run(cfg)
    monkeypatch.setattr(RunDir, "append", real_append)
    first = RunDir(cfg).rows()
    assert len(first) == 2

    summary = run_module.run(cfg)
    rows = RunDir(cfg).rows()
    ids = [r["id"] for r in rows]
    assert len(rows) == 3 and len(set(ids)) == 3
    assert rows[:2] == first  # the rows written before the interruption are kept as they were
    assert summary["n_samples"] == 3
    saved = json.loads(RunDir(cfg).summary_path.read_text())
    assert saved["metrics"]["n"] == 3 and "by_length" in saved["metrics"]
    row = rows[0]
    for key in ("params", "prediction", "references", "metrics", "semantics", "protocol", "timings", "attended"):
        assert key in row

    # a finished run run again computes nothing and keeps its rows as they were
    again = run_module.run(cfg)
    assert again["n_samples"] == 3 and RunDir(cfg).rows() == rows


def test_raising_the_limit_reuses_rows(tmp_path):
    """task.limit is not in the run hash: a larger limit continues the same run directory."""
    small = _cfg(tmp_path, "runner.wandb.mode=disabled", "task.limit=1")
    run_module.run(small)
    first = RunDir(small).rows()
    full = _cfg(tmp_path, "runner.wandb.mode=disabled")
    assert RunDir(full).path == RunDir(small).path
    summary = run_module.run(full)
    rows = RunDir(full).rows()
    assert summary["n_samples"] == 3 and rows[0] == first[0] and len({r["id"] for r in rows}) == 3


def test_wandb_offline_needs_no_network(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "")
    cfg = _cfg(tmp_path, "runner.wandb.mode=offline", f"runner.wandb.dir={tmp_path / 'wandb'}", "task.limit=1")
    run_module.run(cfg)
    runs = list((tmp_path / "wandb").glob("wandb/offline-run-*"))
    assert runs, "no offline W&B run directory was written"
