"""Slurm asks for what a run needs (issue 35): the launcher's gpus_per_node comes from the model's
config (llama3_70b: 4), the run splits over them (runner.devices follows model.gpus), and a sweep
over models of different needs is launched as one array per need. Composed on the CPU."""
from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir

from analysis.launch import by_gpus, model_gpus
from runners.cli import CONF_DIR


def _compose(*overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return compose("config", overrides=["hydra/launcher=slurm", *overrides], return_hydra_config=True)


@pytest.mark.parametrize("model, gpus", [("llama3_70b", 4), ("llama3", 1), ("smollm2", 1)])
def test_slurm_launcher_asks_for_the_models_gpus(model, gpus):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    cfg = _compose(f"model={model}", "method=tidal")
    assert cfg.hydra.launcher.gpus_per_node == gpus
    assert cfg.runner.devices == gpus
    assert "runner.devices=" not in str(cfg.hydra.launcher.setup)


def test_runner_devices_can_still_be_set():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    cfg = _compose("model=llama3", "runner.devices=2")
    assert cfg.runner.devices == 2 and cfg.hydra.launcher.gpus_per_node == 1


def test_a_model_sweep_of_mixed_needs_is_one_array_per_need():
    assert model_gpus("llama3_70b") == 4 and model_gpus("llama3") == 1
    runs = by_gpus([["task=niah", "model=llama3,llama3_70b,llama31_8b", "method=tidal"]])
    assert runs == [["task=niah", "model=llama3,llama31_8b", "method=tidal"],
                    ["task=niah", "model=llama3_70b", "method=tidal"]]
    same = [["model=llama3,llama31_8b", "method.budget=1,2"]]
    assert by_gpus(same) == same


def test_the_70b_reselection_sweep_of_the_paper_profile_is_one_4_gpu_array():
    from analysis.papers.tidal import SENSITIVITY_SWEEPS

    sweeps = [s for s in SENSITIVITY_SWEEPS["paper"] if "model=llama3_70b" in s]
    assert sweeps, "the paper profile of tidal.table7-12 includes Llama-3-70B (Table 9)"
    layers = next(o for o in sweeps[0] if o.startswith("method.reselect_layer="))
    assert len(layers.split(",")) == 78      # L2 (null) .. L79: one array
    assert by_gpus([sweeps[0]]) == [sweeps[0]]
