"""Runs that survive faults, tested on real runs of run.py (a tiny random-weight model, so each process
spends its time where faults happen: starting, computing, writing rows).

- SIGKILL at random points, with torn last lines, then a resume: the rows equal an uninterrupted run's.
- Two processes on one run directory: one row per id, the work split between them.
- A multirun killed mid-way and relaunched: exactly one row per (config, sample).
- A sample that raises (a CUDA OOM, simulated on the CPU) is a failed row; the rerun retries it only.
"""
from __future__ import annotations

import json
import os
import random
import signal
import time

import pytest
import torch
from helpers_runs import TINY, compose, count_lines, grid, run_py, stable

from runners import run as run_module
from runners.results import RunDir
from runners.store import read_rows

FAST = ["runner.wandb.mode=disabled", "runner.progress=false"]


def _reference(tmp_path, *extra):
    cfg = compose(*TINY, *grid(), *FAST, f"runner.results_dir={tmp_path / 'reference'}", *extra)
    run_module.run(cfg, report=False)
    return cfg, stable(RunDir(cfg).rows())


def _finish(proc, timeout=300):
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return out, err


def _one_line_per_id(path):
    ids = [json.loads(line)["id"] for line in path.read_text().splitlines()]   # every line parses
    assert len(ids) == len(set(ids)), "an id was written twice"
    return ids


@pytest.mark.long   # real runs, tens of seconds: outside `make test`, in `make test-long` and CI
@pytest.mark.slow
def test_sigkill_at_random_points_then_resume_equals_an_uninterrupted_run(tmp_path):
    _, reference = _reference(tmp_path)
    n = len(reference)
    args = [*TINY, *grid(), *FAST, f"runner.results_dir={tmp_path / 'runs'}"]
    samples = RunDir(compose(*args)).samples_path
    rng = random.Random(13)
    kills = torn = 0
    while kills < 6:
        have = count_lines(samples)
        if have >= n - 2:
            break
        target = have + rng.randint(1, 5)
        proc = run_py(args, tmp_path)
        while count_lines(samples) < target and proc.poll() is None:
            time.sleep(0.002)
        time.sleep(rng.uniform(0, 0.08))       # somewhere inside the next sample: compute, write, fsync
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        kills += 1
        size = samples.stat().st_size if samples.exists() else 0
        if size and rng.random() < 0.5:        # a kill in the middle of a write (rare for real: forced)
            raw = samples.read_bytes()
            start = raw.rstrip(b"\n").rfind(b"\n") + 1
            os.truncate(samples, rng.randint(start + 1, size - 2))
            torn += 1
    assert kills >= 3 and torn >= 1
    _, err = _finish(run_py(args, tmp_path))
    assert "resuming" in err and "failed" not in err
    assert _one_line_per_id(samples) and stable(read_rows(samples)) == reference
    summary = json.loads(samples.with_name("summary.json").read_text())
    assert summary["n_samples"] == n and summary["complete"] and summary["n_failed"] == 0


@pytest.mark.long   # real runs, tens of seconds: outside `make test`, in `make test-long` and CI
@pytest.mark.slow
def test_two_processes_on_one_run_directory_split_it_without_duplicates(tmp_path):
    _, reference = _reference(tmp_path)
    args = [*TINY, *grid(), *FAST, f"runner.results_dir={tmp_path / 'runs'}"]
    samples = RunDir(compose(*args)).samples_path
    first = run_py(args, tmp_path)
    while count_lines(samples) < 2:
        assert first.poll() is None, first.communicate()[1][-3000:]
        time.sleep(0.01)
    # Freeze the first writer mid-run (a duplicate Slurm task, a user rerunning while it runs), outside
    # its (millisecond) lock: the second must skip the sample the first holds and go on with the rest.
    _freeze_outside_lock(first, samples.parent / ".lock")
    second = run_py(args, tmp_path)
    deadline = time.time() + 240
    while count_lines(samples) < 6 and second.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    first.send_signal(signal.SIGCONT)
    _finish(second)
    _finish(first)
    ids = _one_line_per_id(samples)
    rows = read_rows(samples)
    assert sorted(ids) == sorted(reference) and stable(rows) == reference
    writers = {r["writer"] for r in rows}
    assert len(writers) == 2, "both processes wrote rows"
    assert not (samples.parent / "samples.duplicate").exists()


def _freeze_outside_lock(proc, lock_path):
    import fcntl

    with open(lock_path, "rb") as lock:
        for _ in range(1000):
            proc.send_signal(signal.SIGSTOP)
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)   # free: the frozen writer is not inside
                fcntl.flock(lock, fcntl.LOCK_UN)
                return
            except BlockingIOError:
                proc.send_signal(signal.SIGCONT)
                time.sleep(0.005)
    raise AssertionError("the first writer never left its lock")


@pytest.mark.long   # real runs, tens of seconds: outside `make test`, in `make test-long` and CI
@pytest.mark.slow
def test_a_multirun_killed_midway_and_relaunched_has_one_row_per_config_and_sample(tmp_path):
    results = tmp_path / "runs"
    sweep = ["-m", *TINY, "task.lengths=[256]", "task.depths=[0.1,0.9],[0.5],[0.3,0.7]", "task.repeats=3",
             "task.max_new_tokens=4", "task.decode_tail=4", *FAST, f"runner.results_dir={results}",
             "hydra/launcher=local"]
    proc = run_py(sweep, tmp_path)
    root = results / "passkey" / "smollm2" / "full"
    while proc.poll() is None:                  # kill once the second job has written a row
        files = list(root.glob("*/samples.jsonl")) if root.exists() else []
        if len([f for f in files if count_lines(f) > 0]) >= 2:
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert len(list(root.glob("*/summary.json"))) < 3, "the sweep finished before the kill"
    _finish(run_py(sweep, tmp_path))
    runs = sorted(root.iterdir())
    assert len(runs) == 3
    for d in runs:
        summary = json.loads((d / "summary.json").read_text())
        depths = summary["config"]["task"]["depths"]
        ids = _one_line_per_id(d / "samples.jsonl")
        assert sorted(ids) == sorted(f"len256-depth{x:g}-r{r}" for x in depths for r in range(3))
        assert summary["complete"]


def test_a_sample_that_raises_is_a_failed_row_and_only_it_is_retried(tmp_path, monkeypatch, capsys):
    from runners.engine import Engine

    cfg = compose(*TINY, *grid(depths=3, repeats=2), *FAST, f"runner.results_dir={tmp_path}")
    real = Engine.generate
    calls = []

    def oom_on_2nd_and_5th(self, ids, **kw):
        calls.append(1)
        if len(calls) in (2, 5):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return real(self, ids, **kw)

    monkeypatch.setattr(Engine, "generate", oom_on_2nd_and_5th)
    summary = run_module.run(cfg)
    out = RunDir(cfg)
    failed = out.failures()
    assert len(calls) == 6 and summary["n_failed"] == 2 and summary["n_samples"] == 4
    assert summary["metrics"]["n"] == 4 and not summary["complete"]        # metrics exclude failed rows
    assert [f["status"] for f in failed] == ["failed", "failed"]
    assert all(f["error"].startswith("OutOfMemoryError: CUDA out of memory") for f in failed)
    assert {f["id"] for f in failed}.isdisjoint(r["id"] for r in out.rows())
    err = capsys.readouterr()
    assert "warning: sample" in err.err and "2 of 6 samples failed" in err.err and "2 failed" in err.out
    saved = json.loads(out.summary_path.read_text())
    assert saved["n_failed"] == 2 and {f["id"] for f in saved["failed"]} == {f["id"] for f in failed}

    calls.clear()
    monkeypatch.setattr(Engine, "generate", lambda self, ids, **kw: (calls.append(1), real(self, ids, **kw))[1])
    again = run_module.run(cfg)
    assert len(calls) == 2                                                 # the failed ones, nothing else
    assert again["n_failed"] == 0 and again["n_samples"] == 6 and again["complete"]
    assert not out.failed_path.exists()                                    # superseded, then compacted away
    assert "2 failed before: retrying them" in capsys.readouterr().err
    _one_line_per_id(out.samples_path)


def test_nan_nll_is_a_failed_row_not_a_number(tmp_path):
    from types import SimpleNamespace

    from runners.batch import run_batch_safely
    from tasks.base import Sample

    class NanEngine:
        device = torch.device("cpu")
        method = SimpleNamespace(stats=dict)

        def nll(self, ids, mode, stride):
            return torch.full((ids.shape[0], ids.shape[1] - 1), float("nan"))

    task = SimpleNamespace(mode="nll", score_nll=lambda s, x: {"ppl": float(x.mean())})
    batch = [Sample(id="a", input_ids=[1, 2, 3]), Sample(id="b", input_ids=[4, 5, 6])]
    rows = run_batch_safely(NanEngine(), task, batch, None, [], None, on_error="record")
    assert [(r["id"], r["status"]) for r in rows] == [("a", "failed"), ("b", "failed")]
    assert rows[0]["error"].startswith("FloatingPointError: 4 non-finite token NLL")
    with pytest.raises(FloatingPointError):
        run_batch_safely(NanEngine(), task, batch, None, [], None, on_error="raise")
