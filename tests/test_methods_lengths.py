"""The task length rule: what a run may read is what its *method* can read (MethodConfig.max_context).

A method that says "any length" (None: a bounded cache with in-cache positions) must really be
bounded: its buffers do not grow with the sequence, and it runs past the model's positions. Task
validation and the run loop's generation check follow the method; every other method keeps the
one-line refusal before a model loads."""
from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf
from test_methods_common import one_thread, tiny_model  # noqa: F401
from test_methods_conformance import INFO, cfg_of

from common.errors import ConfigError, HarnessError
from methods import REGISTRY, ModelInfo, build
from runners.engine import Engine

ANY = [n for n in REGISTRY.names() if build(OmegaConf.create(cfg_of(n, 0)), INFO).cfg.max_context(INFO) is None]


def test_the_bounded_methods_say_so():
    assert {"streaming_llm"} <= set(ANY)
    for name in REGISTRY.names():
        limit = build(OmegaConf.create(cfg_of(name, 0)), INFO).cfg.max_context(INFO)
        assert limit is None or 0 < limit <= INFO.max_position


def _bytes(method) -> int:
    return sum(t.numel() * t.element_size() for t in method.buffers().values() if t is not None)


@pytest.mark.parametrize("name", ANY)
def test_any_length_methods_have_bounded_buffers_and_run_past_the_positions(name):
    method = build(OmegaConf.create(cfg_of(name, 0)), INFO)
    method.setup(INFO, 1, 256, torch.device("cpu"), torch.float32)
    small = _bytes(method)
    method.setup(INFO, 1, 1 << 16, torch.device("cpu"), torch.float32)
    assert _bytes(method) == small, "buffers grow with the sequence length"
    model = tiny_model(6)  # 512 positions
    info = ModelInfo.from_hf_config(model.config)
    ids = torch.randint(0, 128, (1, 600), generator=torch.Generator().manual_seed(0))
    eng = Engine(model, build(OmegaConf.create(cfg_of(name, 0)), info))
    eng.reset(1, 600)
    logits = [eng.prefill(ids[:, :560])] + [eng.decode(ids[:, t]) for t in range(560, 600)]
    assert torch.isfinite(torch.stack(logits)).all()


def _compose(overrides):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from runners.cli import CONF_DIR

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return compose(config_name="config", overrides=overrides)
    finally:
        GlobalHydra.instance().clear()


@pytest.mark.parametrize("task", [["task=passkey_digits"], ["task=niah", "task.lengths=[20000]"],
                                  ["task=passkey", "task.lengths=[20000]"], ["task=ruler", "task.lengths=[16384]"]])
def test_task_lengths_follow_the_method(task):
    from runners.validate import validate

    validate(_compose([*task, "method=streaming_llm"]))        # bounded cache, in-cache positions
    for method in ("full", "h2o", "quest"):                      # original positions: the model's limit
        with pytest.raises(ConfigError) as e:
            validate(_compose([*task, f"method={method}"]))
        assert "\n" not in str(e.value)


def test_run_loop_generation_check_follows_the_method():
    from runners.batch import run_batch
    from tasks.base import Sample

    model = tiny_model(6)
    info = ModelInfo.from_hf_config(model.config)

    class _Task:
        mode = "generate"

        def score(self, sample, text):
            return {}

    class _Tok:
        def decode(self, ids, skip_special_tokens=True):
            return ""

    sample = Sample(id="s", input_ids=[1] * 500, max_new_tokens=20)
    full = Engine(model, build(OmegaConf.create({"name": "full"}), info))
    with pytest.raises(HarnessError, match="512 positions full can read"):
        next(run_batch(full, _Task(), [sample], _Tok(), [], info))
    streaming = Engine(model, build(OmegaConf.create({"name": "streaming_llm", "sink": 4, "window": 64}), info))
    row = next(run_batch(streaming, _Task(), [sample], _Tok(), [], info))
    assert row["input_tokens"] == 500 and row["output_tokens"] == 20
