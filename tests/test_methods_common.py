"""Shared helpers for the method oracle tests (a Driver feeding random q, k, v per layer, brute-force
masked attention), and the cross-option checks of the existing methods. The checks every method
gets for free live in tests/test_methods_conformance.py."""
from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf
from tiny_models import COMMON, tiny

from methods import ModelInfo, Step, build
from methods.parts.rope import Rope
from runners.engine import Engine
from common.errors import ConfigError


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny tensors: intra-op threads only add sync cost (30x slower on a loaded 2-core box)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def tiny_model(layers: int = 6, family: str = "llama"):
    """A tiny random model with enough layers for dense + selection + sparse layers."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

    if layers == COMMON["num_hidden_layers"]:
        return tiny(family)
    torch.manual_seed(0)
    cls = {"llama": LlamaConfig, "qwen3": Qwen3Config}[family]
    cfg = cls(**{**COMMON, "num_hidden_layers": layers})
    cfg._attn_implementation = "eager"
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()


def make(cfg: dict, model):
    info = ModelInfo.from_hf_config(model.config)
    return build(OmegaConf.create(cfg), info), info


def decode_logits(model, cfg: dict, ids: torch.Tensor, n_prefill: int) -> torch.Tensor:
    """Prefill ids[:, :n_prefill] through the method's prefill path, then feed the rest one token at
    a time through the decode path; logits [B, 1 + rest, V] (the prefill's last, then each step)."""
    method, _ = make(cfg, model)
    eng = Engine(model, method)
    eng.reset(ids.shape[0], ids.shape[1])
    out = [eng.prefill(ids[:, :n_prefill])]
    for t in range(n_prefill, ids.shape[1]):
        out.append(eng.decode(ids[:, t]))
    return torch.stack(out, 1)


class Driver:
    """Drives a method directly with random un-rotated q, k, v per layer (no model), keeping every
    input so that tests can recompute by brute force what the method should have attended."""

    def __init__(self, method, info: ModelInfo, rope: Rope, max_len: int, batch: int = 2, seed: int = 0):
        self.m, self.info, self.rope = method, info, rope
        self.gen = torch.Generator().manual_seed(seed)
        self.B = batch
        self.k = [torch.empty(batch, info.num_kv_heads, 0, info.head_dim) for _ in range(info.num_layers)]
        self.v = [x.clone() for x in self.k]
        self.seen = 0
        method.setup(info, batch, max_len, torch.device("cpu"), torch.float32)

    def step(self, T: int, phase: str):
        """One step of T new tokens; returns (q per layer, outputs per layer)."""
        i = self.info
        pos = torch.arange(self.seen, self.seen + T)
        self.m.begin(Step(phase=phase, start=self.seen, length=T, positions=pos))
        qs, outs = [], []
        for layer in range(i.num_layers):
            q = torch.randn(self.B, i.num_heads, T, i.head_dim, generator=self.gen)
            k = torch.randn(self.B, i.num_kv_heads, T, i.head_dim, generator=self.gen)
            v = torch.randn(self.B, i.num_kv_heads, T, i.head_dim, generator=self.gen)
            self.k[layer] = torch.cat([self.k[layer], k], 2)
            self.v[layer] = torch.cat([self.v[layer], v], 2)
            qs.append(q)
            outs.append(self.m.attend(layer, q, k, v, self.rope))
        self.seen += T
        return qs, outs


def rope_for(model) -> Rope:
    return Rope(model.model.rotary_emb)


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float):
    """Brute force: q [B, Hq, T, D], k, v [B, Hkv, L, D] (rotated), mask [B, Hq, T, L] bool."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = (q @ k.transpose(-1, -2)) * scale
    p = torch.softmax(s.masked_fill(~mask, float("-inf")), -1)
    B, H, T, D = q.shape
    return (p @ v).transpose(1, 2).reshape(B, T, H * D)


# --- method-specific cross-option checks (the generic ones are in test_methods_conformance.py) ------

@pytest.mark.parametrize("cfg,needle", [
    ({"name": "tidal", "budget": 8, "reselect_layer": 30}, "reselect_layer=30"),
    ({"name": "tidal", "budget": 8, "reselect_layer": 2}, "reselect_layer=2"),
    ({"name": "tidal", "budget": 8, "dense_layers": 6}, "dense_layers=6"),
    ({"name": "tidal", "budget": 0}, "budget"),
    ({"name": "tidal", "budget": 8, "reselect_layer": 4, "select": "group"}, "select"),
    ({"name": "tidal", "budget": 8, "reselect_layer": 4, "correction_interval": 0}, "correction_interval"),
    ({"name": "quest", "budget": 64, "dense_layers": -1}, "dense_layers"),
    ({"name": "quest", "budget": 64, "pool": "mean"}, "pool"),
    ({"name": "quest", "budget": 64, "page_size": 0}, "page_size"),
    ({"name": "streaming_llm", "sink": 4, "budget": 4}, "window"),
    ({"name": "streaming_llm", "prefill": "chunked"}, "prefill"),
    ({"name": "streaming_llm", "window": 8, "stride": 16, "window_includes_current": True}, "stride"),
])
def test_validation_one_line_errors(cfg, needle):
    info = ModelInfo(arch="llama", num_layers=6, num_heads=4, num_kv_heads=2, head_dim=16, hidden_size=64,
                     max_position=512)
    with pytest.raises(ConfigError) as e:
        build(OmegaConf.create(cfg), info)
    assert needle in str(e.value) and "\n" not in str(e.value)
