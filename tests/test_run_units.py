"""Run-loop pieces without a model: task.limit per grid cell, W&B run names, device names, the hub's
offline switch, the demo's side-by-side report."""
from __future__ import annotations

import pytest
from helpers_runs import compose
from omegaconf import OmegaConf

from common.errors import ConfigError


def _passkey(tok, **kw):
    import tasks
    from tasks.base import ModelSpec

    cfg = OmegaConf.create({"name": "passkey", "limit": None, "seed": 42, "lengths": [256, 512],
                            "depths": [0.0, 0.5, 1.0], "repeats": 2, "max_new_tokens": 4, "decode_tail": 0, **kw})
    return tasks.build(cfg, tok, ModelSpec(name="smollm2", max_length=8192))


def test_limit_applies_to_each_length(smol_tokenizer):
    every = [s.id for s in _passkey(smol_tokenizer).limited()]
    assert len(every) == 12
    four = [s.id for s in _passkey(smol_tokenizer, limit=4).limited()]
    # the first 4 of each length, in the task's order: the README's lengths=[...] limit=4 reaches every length
    assert four == [i for i in every if i.startswith("len256")][:4] + [i for i in every if i.startswith("len512")][:4]
    assert [s.id for s in _passkey(smol_tokenizer, limit=0).limited()] == []
    assert len(list(_passkey(smol_tokenizer, limit=100).limited())) == 12


@pytest.mark.parametrize("bad", [[0], [-5], [2.5], "1024"])
def test_lengths_must_be_positive_token_counts(bad):
    from tasks.base import ModelSpec, Task

    with pytest.raises(ConfigError, match="task.lengths"):
        Task.validate(OmegaConf.create({"name": "x", "limit": None, "lengths": bad}), ModelSpec("m", 100))


def test_run_names_carry_the_swept_keys():
    from runners.wandb_log import run_name

    cfg = compose("method=tidal", "method.budget=256", "task=niah")
    a = run_name(cfg, ["method=tidal", "method.budget=256", "method.reselect_layer=7", "task=niah",
                       "runner.wandb.mode=offline", "task.lengths=[4096, 8192]"])
    b = run_name(cfg, ["method=tidal", "method.budget=256", "method.reselect_layer=14", "task=niah"])
    assert a == "tidal-k256-niah-smollm2-s42-reselect_layer=7-lengths=[4096,8192]"
    assert b == "tidal-k256-niah-smollm2-s42-reselect_layer=14"
    assert run_name(cfg) == "tidal-k256-niah-smollm2-s42"
    # what changes the results (and so the W&B id) is in the name: fp32 and fp16 runs do not share one
    assert run_name(cfg, ["runner.dtype=fp16", "runner.progress=false", "task.limit=2"]) == \
        "tidal-k256-niah-smollm2-s42-dtype=fp16"


@pytest.mark.parametrize("name, ok", [("auto", True), ("cpu", True), ("cuda", True), ("cuda:1", True),
                                      ("mps", True), ("tpu", False), ("cuda:x", False), ("", False)])
def test_device_names(name, ok):
    from runners.models import check_device_name

    if ok:
        check_device_name(name)
    else:
        with pytest.raises(ConfigError, match="runner.device"):
            check_device_name(name)


def test_offline_switch_reaches_libraries_already_imported(monkeypatch):
    import datasets.config
    import huggingface_hub.constants

    from runners import hub

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(hub, "_state", {})
    monkeypatch.setattr(hub, "_reachable", lambda: False)
    assert hub.offline_if_unreachable()
    assert huggingface_hub.constants.HF_HUB_OFFLINE and datasets.config.HF_HUB_OFFLINE
    assert huggingface_hub.is_offline_mode()
    import os

    assert os.environ["HF_HUB_OFFLINE"] == "1"
    monkeypatch.setattr(hub, "_state", {})
    monkeypatch.setattr(hub, "_reachable", lambda: (_ for _ in ()).throw(AssertionError("probed")))
    assert hub.offline_if_unreachable()          # HF_HUB_OFFLINE=1 set: no probe


def test_demo_explains_each_miss(monkeypatch, capsys):
    from runners import demo

    monkeypatch.setattr(demo, "_hf_check", lambda cfg, rows: print(f"  HF check of {[r['id'] for r in rows]}"))

    def row(i, depth, pred, ok):
        return {"id": i, "params": {"length": 1024, "depth": depth}, "references": ["12345"], "device": "cpu",
                "prediction": pred, "metrics": {"accuracy": float(ok)}}

    full = [row("a", 0.2, " 12345.", 1), row("b", 0.5, " 12345.", 1), row("c", 1.0, " a key", 0),
            row("d", 1.0, " a lock", 0)]
    sparse = [row("a", 0.2, " 12345.", 1), row("b", 0.5, " the pass", 0), row("c", 1.0, " a key", 0),
              row("d", 1.0, " 12345", 1)]
    fcfg, scfg = compose("method=full"), compose("method=tidal", "method.budget=256")
    demo.show(fcfg, full, scfg, sparse, {"metrics": {"accuracy": 0.5}, "results_dir": "F"},
              {"metrics": {"accuracy": 0.5}, "results_dir": "S"})
    out = capsys.readouterr().out
    assert "2 miss(es) of full attention: the 135M model's own" in out and "tidal k=256 misses 1 of them too" in out
    assert "HF check of ['c', 'd']" in out
    assert "tidal k=256 gets 1 of them right" in out
    assert "1 miss(es) of tidal k=256 alone: the cost of attending 256 keys" in out
    assert "MISS 'the pass'" in out
    # the hint names this interpreter (the venv's on a fresh machine), never a bare `python` without torch
    assert f"`{demo._python()} -m runners.demo method.budget=512`" in out
    assert demo._python() == "python" or demo._python().endswith("python")


def test_prevalidate_checks_hydra_overrides(capsys):
    from runners import cli

    with pytest.raises(SystemExit) as e:
        cli.prevalidate(["hydra/launcher=nope"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "hydra/launcher/nope" in err[0]
    cli.prevalidate(["hydra/launcher=submitit_local", "hydra.launcher.timeout_min=5"])   # fine: no exit
    assert capsys.readouterr().err == ""


def test_one_line_errors_join_lines():
    from runners.run import one_line

    assert one_line(ConfigError("cannot fetch x\n  (Offline)\n\nset task.data_dir")) == \
        "cannot fetch x (Offline) set task.data_dir"


# --- model.max_position: positions past the model's, as the Cascading reference ran Qwen2-7B ---------------

CASCADE_PAST = ["method=cascade", "method.cache_size=512", "method.stride=64", "model.arch.max_position_embeddings=512"]


def test_max_position_lets_a_method_use_positions_past_the_model(tmp_path):
    """Without the option a cascade whose in-cache positions pass the model's 512 is refused before a
    model loads; with it the run goes through the loop (tiny random model, RoPE past 512) and the
    method was built with the raised limit."""
    from helpers_runs import TINY

    from runners import run as run_module
    from runners.validate import validate

    base = [*TINY, *CASCADE_PAST, "task.lengths=[700]", "task.depths=[0.5]", "task.repeats=1",
            "task.max_new_tokens=2", "runner.wandb.mode=disabled", "runner.progress=false",
            f"runner.results_dir={tmp_path}"]
    with pytest.raises(ConfigError, match="positions"):
        validate(compose(*base))
    cfg = compose(*base, "model.max_position=1024")
    summary = run_module.run(cfg, report=False)
    assert summary["n_samples"] == 1 and summary["complete"] and summary["n_failed"] == 0, summary


@pytest.mark.parametrize("bad", ["0", "-3", "true", "'65536'"])
def test_max_position_must_be_a_positive_integer(bad):
    from runners.validate import validate

    with pytest.raises(ConfigError, match="model.max_position"):
        validate(compose(f"model.max_position={bad}"))


def test_max_position_refused_where_rope_scaling_reads_the_length():
    from runners.validate import validate

    validate(compose("model=llama31_8b", "model.max_position=262144"))          # llama3 rope: any position
    with pytest.raises(ConfigError, match="rope_type 'yarn'"):
        validate(compose("model=yarn_llama2_7b", "model.max_position=262144"))


def test_max_position_is_hashed_only_when_set():
    """Runs from before the key keep their directories (null drops out of the hash); setting it is a new run."""
    from runners.results import config_hash

    cfg = compose()
    before = OmegaConf.create(OmegaConf.to_container(cfg))
    del before.model["max_position"]
    assert config_hash(cfg) == config_hash(before)
    assert config_hash(compose("model.max_position=16384")) != config_hash(cfg)


def test_attended_fraction_warns_when_a_sparse_method_attends_everything():
    from runners import coverage

    def row(attended, prompt, out=5):
        return {"attended": {"attended_mean": attended}, "input_tokens": prompt, "output_tokens": out}

    covered = [row(4100, 4096), row(3990, 3990)]            # budget 4096 on ~4K-token prompts
    s = coverage.summarize(covered, "lychee", {"budget": 4096})
    assert s["n"] == 2 and s["mean_fraction"] >= 0.95
    assert "measures full attention, not sparsity" in s["warning"] and "method.budget=4096" in s["warning"]
    sparse = coverage.summarize([row(300, 4096), row(280, 3990)], "lychee", {"budget": 256})
    assert sparse["mean_fraction"] < 0.1 and "warning" not in sparse
    # dense by design: recorded, not warned
    assert "warning" not in coverage.summarize(covered, "full", {"budget": None})
    assert "warning" not in coverage.summarize(covered, "minference", {"decode": "dense"})
    # rows without decode statistics (prefill-only tasks): nothing to say
    assert coverage.summarize([{"attended": {}, "input_tokens": 10}], "quest", {"budget": 8}) is None


def test_prefill_bar_counts_tokens_only_for_long_prompts():
    from runners.loop import PrefillBar

    bar = PrefillBar(min_tokens=100)
    bar(50, 80)
    assert bar.bar is None                                  # short prompt: no bar
    bar(40, 120)
    assert bar.bar is not None and bar.bar.n == 40 and bar.bar.total == 120
    bar(120, 120)
    assert bar.bar is None                                  # closed at the end of the prompt


def test_prefill_bar_counts_the_engines_prefill_chunks():
    import torch

    from runners.loop import PrefillBar

    class Engine:   # the engine's prefill: forward(ids, "prefill") per chunk of the prompt
        def forward(self, ids, phase, logits="last"):
            return phase

        def prefill(self, ids, chunk):
            return [self.forward(ids[:, s:s + chunk], "prefill") for s in range(0, ids.shape[1], chunk)]

    engine, seen = Engine(), []
    bar = PrefillBar(min_tokens=100)
    detach = bar.attach(engine)
    bar.start(250)
    real = PrefillBar.__call__
    PrefillBar.__call__ = lambda self, done, total: (seen.append((done, total)), real(self, done, total))
    try:
        assert engine.prefill(torch.zeros(1, 250), 100) == ["prefill"] * 3
        assert engine.forward(torch.zeros(1, 1), "decode") == "decode"    # decode steps are not counted
    finally:
        PrefillBar.__call__ = real
    assert seen == [(100, 250), (200, 250), (250, 250)] and bar.bar is None
    detach()
    assert "forward" not in vars(engine)                   # the engine's own method again
