"""Sweeps: the launcher configs compose, and a small multirun of run.py through hydra-submitit-launcher's
local executor (the Slurm code path without a cluster) lands every run's rows where the analysis
catalogue finds them."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.filterwarnings("error:(?s).*validated against ConfigStore schema")   # the deprecated name matching
@pytest.mark.parametrize("launcher, target", [
    ("local", "BasicLauncher"), ("submitit_local", "LocalLauncher"), ("slurm", "SlurmLauncher")])
def test_launcher_configs_compose(launcher, target):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"hydra/launcher={launcher}"], return_hydra_config=True)
    GlobalHydra.instance().clear()
    lc = cfg.hydra.launcher
    assert lc._target_.endswith(target)
    if launcher == "slurm":   # the knobs a cluster user sets, with defaults, schema-checked by the plugin
        for key in ("partition", "gpus_per_node", "cpus_per_task", "timeout_min", "mem_gb", "array_parallelism",
                    "setup", "max_num_timeout"):
            assert key in lc
        assert lc.gpus_per_node == 1 and lc.timeout_min > 0 and isinstance(list(lc.setup), list)


@pytest.mark.long   # real runs, tens of seconds: outside `make test`, in `make test-long` and CI
@pytest.mark.slow
def test_submitit_local_multirun_lands_every_run(tmp_path):
    results, sweep = tmp_path / "runs", tmp_path / "multirun"
    cmd = [sys.executable, "run.py", "-m", "method=full", "task=passkey", "task.lengths=[256]",
           "task.depths=[0.25],[0.75]", "task.decode_tail=0", "task.max_new_tokens=4", "task.limit=1",
           "runner.wandb.mode=disabled", "runner.progress=false", f"runner.results_dir={results}",
           "hydra/launcher=submitit_local", f"hydra.sweep.dir={sweep}"]
    proc = subprocess.run(cmd, check=False, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = sorted((results / "passkey" / "smollm2" / "full").iterdir())
    assert len(runs) == 2                                   # one directory per sweep combination
    depths = set()
    for d in runs:
        rows = [json.loads(line) for line in (d / "samples.jsonl").read_text().splitlines()]
        assert len(rows) == 1 and rows[0]["metrics"].keys() == {"accuracy"}
        summary = json.loads((d / "summary.json").read_text())
        depths.add(tuple(summary["config"]["task"]["depths"]))
    assert depths == {(0.25,), (0.75,)}
    assert list(sweep.glob(".submitit/*")), "the jobs went through submitit"

    # the analysis side finds both runs by value and counts them complete
    from analysis.runs import Store, expand

    cells = expand([["task=passkey", "model=smollm2", "method=full", "task.lengths=[256]",
                     "task.depths=[0.25],[0.75]", "task.decode_tail=0", "task.max_new_tokens=4"]],
                   ["task.limit=1"], lambda v: ("", "full", v["task.depths"][0]))
    store = Store(results)
    assert [store.fill(c).status for c in cells] == ["done", "done"]


def test_sweep_table_maps_swept_values_to_results(tmp_path, capsys):
    """The table a sweep prints at its end, from the jobs' job.json files (a fake sweep: no model)."""
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    from runners.sweep import SweepTable, headline

    def summary(score, frac, warn):
        return {"metrics": {"n": 4, "scale": "percent", "score": score}, "n_samples": 4, "n_failed": 0,
                "attended": {"mean_fraction": frac, **({"warning": "dense"} if warn else {})},
                "results_dir": f"results/runs/ruler/smollm2/tidal/h{score}", "run_id": f"h{score}"}

    class Ret:   # hydra.core.utils.JobReturn's fields the callback reads
        def __init__(self, value, status="COMPLETED"):
            self._return_value, self.status = value, type("S", (), {"name": status})()

    cb = SweepTable()
    jobs = [(["method=tidal", "method.budget=256", "task=ruler"], Ret(summary(40.0, 0.07, False))),
            (["method=tidal", "method.budget=4096", "task=ruler"], Ret(summary(55.0, 1.0, True))),
            (["method=tidal", "method.budget=64", "task=ruler"], None)]          # died before its end
    for num, (overrides, ret) in enumerate(jobs):
        cfg = OmegaConf.create({"hydra": {"mode": RunMode.MULTIRUN, "job": {"num": num},
                                          "overrides": {"task": overrides},
                                          "runtime": {"output_dir": str(tmp_path / str(num))}}})
        cb.on_job_start(cfg)
        if ret is not None:
            cb.on_job_end(cfg, ret)
    cb.on_multirun_end(OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}}))
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("|")]
    assert lines[0] == "| job | method.budget | metric | n | attended | results |"
    assert lines[2] == "| 0 | 256 | score=40 | 4 | 7% | results/runs/ruler/smollm2/tidal/h40.0 |"
    assert lines[3] == "| 1 | 4096 | score=55 | 4 | 100% (dense!) | results/runs/ruler/smollm2/tidal/h55.0 |"
    assert lines[4].startswith("| 2 | 64 | (failed: no summary) |")
    assert (tmp_path / "sweep.md").read_text().splitlines() == lines
    assert headline({"metrics": {"n": 2, "ppl": 9.5}})["metric"] == "ppl"
