"""The conformance suite every registered method passes, driven by the registry and conf/method/:
a new method (one file + its generated YAML) is tested here without editing any test.

Per method and per variant its config declares (`Config.variants`), on tiny random Llama and Qwen3
models: budget >= context equals full attention (where `Config.full_equivalent` defines it); bad
options are refused in one line; stats and semantics serialise; a method object reused across
samples, its buffers filled with NaN in between, gives what a fresh one gives (nothing stale leaks,
unwritten slots are masked); every tensor a decode step keeps or mutates is declared in `buffers()`;
some variant of each method (all but full) attends fewer tokens than it has seen, so the sparse path is
what the other checks test.
The CUDA-graph and kernel-path checks are in tests/test_methods_gpu.py."""
from __future__ import annotations

import dataclasses
import json
import typing

import pytest
import torch
from omegaconf import OmegaConf
from test_methods_common import one_thread, tiny_model  # noqa: F401

from common.errors import ConfigError
from methods import REGISTRY, ModelInfo, build
from methods.config import CONF_DIR, generated
from runners.engine import Engine

NAMES = REGISTRY.names()
CASES = [(name, i) for name in NAMES for i in range(len(REGISTRY.get(name).Config.variants()))]
INFO = ModelInfo(arch="llama", num_layers=6, num_heads=4, num_kv_heads=2, head_dim=16, hidden_size=64,
                 max_position=512)
PROMPT, TOTAL = 40, 60


def cfg_of(name: str, variant: int, **extra) -> dict:
    return {"name": name, **REGISTRY.get(name).Config.variants()[variant], **extra}


def run(model, method, ids: torch.Tensor, eng: Engine | None = None) -> torch.Tensor:
    """Prefill ids[:, :PROMPT], then decode the rest token by token: logits [B, 1 + rest, V]."""
    eng = eng or Engine(model, method)
    eng.reset(ids.shape[0], ids.shape[1])
    out = [eng.prefill(ids[:, :PROMPT])]
    for t in range(PROMPT, ids.shape[1]):
        out.append(eng.decode(ids[:, t]))
    return torch.stack(out, 1)


def ids_for(seed: int) -> torch.Tensor:
    return torch.randint(0, 128, (2, TOTAL), generator=torch.Generator().manual_seed(seed))


# --- the registry and conf/method agree --------------------------------------------------------------

def test_every_yaml_is_a_registered_method_and_back():
    yamls = sorted(p.stem for p in CONF_DIR.glob("*.yaml"))
    assert yamls == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_yaml_is_generated_from_the_typed_config(name):
    path, text = generated(REGISTRY.get(name))
    assert path.read_text() == text, f"{path} is stale: run `python -m methods`"
    assert OmegaConf.to_container(OmegaConf.load(path)) == {"name": name, **REGISTRY.get(name).Config.defaults()}


# --- bad options: one line, naming the key ---------------------------------------------------------------

def _bad_values(cls):
    hints = typing.get_type_hints(cls.Config)
    for f in dataclasses.fields(cls.Config):
        kinds = [a for a in typing.get_args(hints[f.name]) or (hints[f.name],) if a is not type(None)]
        kind, meta = kinds[0], f.metadata
        if kind is int:
            yield f.name, 1.5
            yield f.name, "abc"
            if meta.get("min") is not None:
                yield f.name, meta["min"] - 1
        elif kind is bool:
            yield f.name, "yes"
        elif kind is str and meta.get("choices"):
            yield f.name, "no-such-choice"
    yield "no_such_option", 1


@pytest.mark.parametrize("name,key,value", [(n, k, v) for n in NAMES for k, v in _bad_values(REGISTRY.get(n))])
def test_bad_option_refused_in_one_line(name, key, value):
    with pytest.raises(ConfigError) as e:
        build(OmegaConf.create({"name": name, key: value}), INFO)
    msg = str(e.value)
    assert f"method.{key}" in msg and "\n" not in msg, msg


# --- behaviour on tiny models ---------------------------------------------------------------------------

@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("name,variant", CASES)
def test_budget_covering_context_equals_full(name, variant, family):
    model = tiny_model(6, family)
    info = ModelInfo.from_hf_config(model.config)
    probe = build(OmegaConf.create(cfg_of(name, variant)), info)
    overrides = probe.cfg.full_equivalent(TOTAL)
    if overrides is None:
        pytest.skip(f"{name} defines no setting equal to full attention")
    ids = ids_for(1)
    ref = run(model, build(OmegaConf.create({"name": "full"}), info), ids)
    got = run(model, build(OmegaConf.create(cfg_of(name, variant, **overrides)), info), ids)
    assert (ref - got).abs().max().item() <= 1e-5


@pytest.mark.parametrize("name,variant", CASES)
def test_stats_and_semantics_serialise(name, variant):
    model = tiny_model(6)
    method = build(OmegaConf.create(cfg_of(name, variant)), ModelInfo.from_hf_config(model.config))
    run(model, method, ids_for(2))
    sem = json.loads(json.dumps(method.semantics()))
    assert sem["method"] == name
    assert set(method.cfg.defaults()) <= set(sem)           # every option is recorded
    stats = json.loads(json.dumps(method.stats()))
    assert len(stats["attended_per_layer"]) == model.config.num_hidden_layers
    assert all(0 < n <= TOTAL for n in stats["attended_per_layer"].values())


# The dense baseline attends every token by definition; every other method must show its sparse path.
DENSE = {"full": "the dense baseline"}
# Sparse in the prefill only, dense decode as its paper: its sparse path shows as a prefill that differs
# from full attention's (decode-time `record` counts cannot show it).
PREFILL_SPARSE = {"minference": "sparse prefill patterns, dense decode (MInference)"}


@pytest.mark.parametrize("name", NAMES)
def test_a_variant_attends_fewer_tokens_than_seen(name):
    """Issue 36: a method tested only at a budget it never reaches passes every check above with a broken
    sparse path. Some variant of each method must attend, at the last decode step of these sequences
    (TOTAL tokens seen), fewer tokens than it has seen: so its eviction or selection runs in every test."""
    if name in DENSE:
        pytest.skip(DENSE[name])
    model = tiny_model(6)
    info = ModelInfo.from_hf_config(model.config)
    attended, ref = [], run(model, build(OmegaConf.create({"name": "full"}), info), ids_for(2))
    for variant in range(len(REGISTRY.get(name).Config.variants())):
        method = build(OmegaConf.create(cfg_of(name, variant)), info)
        got = run(model, method, ids_for(2))
        if name in PREFILL_SPARSE:
            attended.append(f"prefill logits differ from full's by {(got - ref)[:, 0].abs().max().item():.1e}")
            if (got - ref)[:, 0].abs().max().item() > 1e-4:
                return
            continue
        attended.append(method.stats()["attended_mean"])
        if attended[-1] < TOTAL:
            return
    pytest.fail(f"{name}: every variant attends all {TOTAL} tokens seen ({attended}): add one whose budget binds")


def _poisoned_rerun(method, cfg_or_cls, info, model) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits of sample B after sample A and poisoned buffers, logits of B on a fresh method)."""
    eng = Engine(model, method)
    run(model, method, ids_for(3), eng)
    for t in method.buffers().values():
        if t is not None:
            t.fill_(float("nan") if t.is_floating_point() else 1234567)
    got = run(model, method, ids_for(4), eng)
    return got, run(model, cfg_or_cls(), ids_for(4))


@pytest.mark.parametrize("name,variant", CASES)
def test_reused_method_with_poisoned_buffers_equals_fresh(name, variant):
    """Sample A, then every declared buffer filled with NaN (floats) or garbage (ints), then sample
    B through the same engine and method: equal to B on a fresh method. Stale state or an unmasked
    read of an unwritten slot shows up as a difference or a NaN."""
    model = tiny_model(6)
    info = ModelInfo.from_hf_config(model.config)
    cfg = OmegaConf.create(cfg_of(name, variant))
    got, ref = _poisoned_rerun(build(cfg, info), lambda: build(cfg, info), info, model)
    assert torch.isfinite(got).all()
    assert (got - ref).abs().max().item() <= 1e-6


def _tensors(obj, path="method", seen=None):
    """(path, tensor) for every tensor reachable from a method: attributes, dicts, lists, and the
    objects of methods/ it holds (stores); not the config, model info or the step."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        yield path, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _tensors(v, f"{path}[{k!r}]", seen)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _tensors(v, f"{path}[{i}]", seen)
    elif hasattr(obj, "__dict__") and type(obj).__module__.split(".")[0] in ("methods", __name__):
        for k, v in vars(obj).items():
            if k not in ("cfg", "info", "step"):
                yield from _tensors(v, f"{path}.{k}", seen)


def _violations(method, model) -> list[str]:
    """What a decode step does to tensors it did not declare (see the test below)."""
    eng = Engine(model, method)
    ids = ids_for(5)
    eng.reset(2, TOTAL)
    eng.prefill(ids[:, :PROMPT])
    eng.decode(ids[:, PROMPT])
    before = {id(t): (p, t, t.clone()) for p, t in _tensors(method)}
    eng.decode(ids[:, PROMPT + 1])
    declared = {t.untyped_storage().data_ptr() for t in method.buffers().values() if t is not None}
    out = []
    for p, t in _tensors(method):
        if id(t) not in before or t.untyped_storage().data_ptr() in declared:
            continue
        old = before[id(t)][2]
        if not (torch.equal(old, t) or (old.is_floating_point() and torch.allclose(old, t, equal_nan=True))):
            out.append(f"a decode step mutated {p}, which buffers() does not declare")
        elif method.graph_safe:
            out.append(f"graph_safe, but keeps undeclared tensor {p} across steps")
    return out


@pytest.mark.parametrize("name,variant", CASES)
def test_decode_step_keeps_and_mutates_only_declared_buffers(name, variant):
    """A captured CUDA graph replays raw pointers: a tensor that lives across steps must be one the
    method declares (so the engine re-captures when it moves). Checked for every method: no
    undeclared tensor is mutated by a decode step; for graph-safe methods, no undeclared tensor
    survives from one step to the next at all."""
    model = tiny_model(6)
    method = build(OmegaConf.create(cfg_of(name, variant)), ModelInfo.from_hf_config(model.config))
    assert _violations(method, model) == []


class _Leaky(REGISTRY.get("full")):
    """Not registered: a method with the two faults the suite exists to catch. Its `acc` buffer is
    mutated every decode step but not declared, and its `bias` buffer is declared but never reset
    between samples."""

    def setup(self, info, batch, max_len, device, dtype):
        super().setup(info, batch, max_len, device, dtype)
        self.acc = torch.zeros(1)
        if getattr(self, "bias", None) is None:
            self.bias = torch.zeros(1)

    def buffers(self):
        return {**super().buffers(), "bias": self.bias}

    def attend(self, layer, q, k, v, rope):
        self.acc += 1
        return super().attend(layer, q, k, v, rope) + self.bias


def test_the_checks_catch_a_leaky_method():
    model = tiny_model(6)
    info = ModelInfo.from_hf_config(model.config)
    leaky = _Leaky({"name": "full"})
    assert any("method.acc" in v for v in _violations(leaky, model))
    got, _ = _poisoned_rerun(_Leaky({"name": "full"}), lambda: _Leaky({"name": "full"}), info, model)
    assert not torch.isfinite(got).all()


@pytest.mark.parametrize("name,variant", [c for c in CASES if REGISTRY.get(c[0]).decode_idempotent])
def test_decode_idempotent_claim_holds(name, variant):
    """A method that says `decode_idempotent` has its CUDA graph warmed up without saving its
    buffers: running a decode step twice at one position must leave what running it once leaves."""
    model = tiny_model(6)
    method = build(OmegaConf.create(cfg_of(name, variant)), ModelInfo.from_hf_config(model.config))
    eng = Engine(model, method)
    ids = ids_for(6)
    eng.reset(2, TOTAL)
    eng.prefill(ids[:, :PROMPT])
    position = torch.tensor([PROMPT])
    states = []
    with torch.inference_mode():
        for _ in range(2):
            eng.decode_logits(ids[:, PROMPT], position)
            states.append({k: t.clone() for k, t in method.buffers().items() if t is not None})
    for key in states[0]:
        assert torch.equal(states[0][key].nan_to_num(0), states[1][key].nan_to_num(0)), f"{name}: {key} changed"


@pytest.mark.parametrize("name,variant", CASES)
def test_batch_equals_one_at_a_time(name, variant):
    """Sequences batched together (runner.batch_size > 1: equal-length prompts) get exactly what
    each gets alone: no state crosses the batch dimension."""
    model = tiny_model(6)
    info = ModelInfo.from_hf_config(model.config)
    ids = torch.randint(0, 128, (3, TOTAL), generator=torch.Generator().manual_seed(7))
    batched = run(model, build(OmegaConf.create(cfg_of(name, variant)), info), ids)
    for b in range(3):
        alone = run(model, build(OmegaConf.create(cfg_of(name, variant)), info), ids[b:b + 1])
        assert (batched[b:b + 1] - alone).abs().max().item() <= 1e-5, b
