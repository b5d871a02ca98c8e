"""The run loop on the embedded model: rows, summary, resume after an interruption, progress, W&B
offline, and the same rows from the same seed."""
from __future__ import annotations

import json

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from runners import run as run_module
from runners.cli import CONF_DIR
from runners.results import RunDir

pytestmark = pytest.mark.slow


def _cfg(tmp_path, *extra):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=[
            "task.lengths=[256]", "task.depths=[0.2,0.5,0.8]", "task.decode_tail=4", "task.max_new_tokens=6",
            f"runner.results_dir={tmp_path / 'runs'}", *extra])


class Interrupt(Exception):
    pass


def test_interrupted_run_resumes_without_repeats_or_losses(tmp_path, monkeypatch, capsys):
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

    capsys.readouterr()
    summary = run_module.run(cfg)
    err = capsys.readouterr().err
    assert "2 of 3 samples kept, 1 to run" in err             # a resumed run says what it kept
    assert "3/3" in err                                       # the bar knows its total without task.limit
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


def test_wandb_offline_logs_rows_once_per_config(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "")
    wandb_dir = tmp_path / "wandb"
    small = _cfg(tmp_path, "runner.wandb.mode=offline", f"runner.wandb.dir={wandb_dir}", "task.limit=1")
    run_module.run(small)
    runs = list(wandb_dir.glob("wandb/offline-run-*"))
    assert len(runs) == 1, "no offline W&B run directory was written"
    run_hash = RunDir(small).hash
    assert runs[0].name.endswith(run_hash)                    # the W&B run id is the config hash
    first = json.loads(RunDir(small).summary_path.read_text())["wandb"]
    assert first["id"] == run_hash and first["logged_rows"] == 1

    run_module.run(small)                                     # nothing new: no second W&B run to sync
    assert len(list(wandb_dir.glob("wandb/offline-run-*"))) == 1

    more = _cfg(tmp_path, "runner.wandb.mode=offline", f"runner.wandb.dir={wandb_dir}", "task.limit=2")
    run_module.run(more)                                      # new rows: the same W&B run, resumed
    runs = list(wandb_dir.glob("wandb/offline-run-*"))
    assert len(runs) == 1 and runs[0].name.endswith(run_hash)   # one offline directory per id, holding both rows
    second = json.loads(RunDir(more).summary_path.read_text())["wandb"]
    assert second["logged_rows"] == 2 and second["steps"] > first["steps"]   # steps only grow


@pytest.mark.long   # two embedded runs (15 s): outside `make test`, in `make test-long` and CI
def test_same_seed_same_rows(tmp_path):
    """Two runs of one config (fresh directories, same seed) write the same rows: predictions,
    metrics, token counts, attended-token statistics; only timings, timestamps and the writer differ.
    Sampled decoding with the same seed repeats its tokens too."""
    from helpers_runs import stable

    from runners.engine import Engine

    a = _cfg(tmp_path / "a", "runner.wandb.mode=disabled", "method=tidal", "method.budget=64")
    b = _cfg(tmp_path / "b", "runner.wandb.mode=disabled", "method=tidal", "method.budget=64")
    run_module.run(a, report=False)
    run_module.run(b, report=False)
    rows_a, rows_b = RunDir(a).rows(), RunDir(b).rows()
    assert len(rows_a) == 3 and stable(rows_a) == stable(rows_b)

    import torch

    import methods
    from runners import models

    model, tok = models.load(a.model, torch.device("cpu"), torch.float32)
    engine = Engine(model, methods.build(a.method, methods.ModelInfo.from_hf_config(model.config)))
    ids = torch.tensor([tok("The capital of France is")["input_ids"]])

    def sample(seed):
        return engine.generate(ids, max_new_tokens=12, temperature=1.0, top_p=0.95, seed=seed).tokens

    assert sample(7) == sample(7) != sample(8)


def test_summary_records_the_commit_the_run_started_at(tmp_path, monkeypatch):
    """A commit made while a long run goes on is not the code that ran: the summary (and so the
    exported rows) records the tree at the run's start."""
    cfg = _cfg(tmp_path, "runner.wandb.mode=disabled")
    head = {"commit": "aaaaaaa"}
    monkeypatch.setattr(run_module, "environment", lambda: {"git_commit": head["commit"]})
    real_append = RunDir.append

    def append_then_commit(self, row):
        head["commit"] = "bbbbbbb"          # someone commits while the run is in its loop
        return real_append(self, row)

    monkeypatch.setattr(RunDir, "append", append_then_commit)
    run_module.run(cfg)
    saved = json.loads(RunDir(cfg).summary_path.read_text())
    assert saved["environment"]["git_commit"] == "aaaaaaa"


def test_a_budget_that_covers_the_prompt_is_flagged(tmp_path, capsys):
    """quest at a budget above the 256-token prompt attends everything: the summary and stderr say so."""
    cfg = _cfg(tmp_path, "runner.wandb.mode=disabled", "method=quest", "method.budget=1024", "task.limit=1")
    summary = run_module.run(cfg)
    captured = capsys.readouterr()
    assert summary["attended"]["mean_fraction"] >= 0.95 and summary["attended"]["n"] == 1
    assert "warning: quest attended" in captured.err and "not sparsity" in captured.err
    assert "attended: " in captured.out                      # the table shows the fraction too
    saved = json.loads(RunDir(cfg).summary_path.read_text())
    assert saved["attended"]["warning"] == summary["attended"]["warning"]
