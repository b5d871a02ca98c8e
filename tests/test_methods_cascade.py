"""Cascading KV cache oracle: on random q, k, v (per layer, two sequences) the attention outputs, the
token every slot holds and the EMA scores equal a plain-Python simulation of the reference
(jeffwillette/cascading_kv_cache `_update_kv_cache` + `cascade_attention.py`): per (layer, sequence,
KV head) a sink list and N ring buffers of W entries, filled token by token with the reference's rule
(eager fill, cascade i accepting every 2^i-th token, the oldest entry passed on, the newest compared
by score), the cache attended at contiguous positions in cache order, scores EMA-accumulated from
brute-force softmax probabilities. Prefill chunks and decode steps both run (they take different code
paths: a host plan and a device-side plan)."""
from __future__ import annotations

import math

import pytest
import torch
from omegaconf import OmegaConf
from test_methods_common import Driver, make, one_thread, rope_for  # noqa: F401
from tiny_models import tiny

from common.errors import ConfigError
from methods import ModelInfo, build


class Sim:
    """The reference cache of one (layer, sequence, KV head), in plain Python."""

    def __init__(self, S, N, W, selection):
        self.S, self.N, self.W, self.sel = S, N, W, selection
        self.sinks: list[int] = []
        self.ring = [[None] * W for _ in range(N)]
        self.stored = [0] * N
        self.start = [0] * N
        self.score: dict[int, float] = {}
        self.seen = 0

    def order(self) -> list[int]:
        """Tokens in cache order (their in-cache positions are their indices)."""
        out = list(self.sinks)
        for i in reversed(range(self.N)):
            out += [self.ring[i][(self.start[i] + r) % self.W] for r in range(self.stored[i])]
        return out

    def push(self, tok: int) -> None:
        S, W = self.S, self.W
        if len(self.sinks) < S:
            self.sinks.append(tok)
            return
        j = tok - S + 1
        eager = j <= self.N * W + 1
        for i in range(self.N):
            ring, n, st = self.ring[i], self.stored[i], self.start[i]
            if eager or (j - 1) % 2 ** i == 0:
                if n < W:
                    ring[n] = tok
                    self.stored[i] += 1
                    return
                tok, ring[st] = ring[st], tok
                self.start[i] = (st + 1) % W
            elif n == 0:
                ring[0] = tok
                self.stored[i] = 1
                return
            else:
                newest = (st - 1) % n
                if not self.sel or self.score[tok] >= self.score[ring[newest]]:
                    ring[newest] = tok
                return

    def slots(self) -> list[int]:
        """Absolute token of every slot, as the store lays them out (-1 empty)."""
        out = self.sinks + [-1] * (self.S - len(self.sinks))
        for i in range(self.N):
            out += [-1 if t is None else t for t in self.ring[i]]
        return out


def oracle_layer(d, layer, q, order, a, own, rope, info):
    """(output [B, T, Hq * D], probs [B, Hq, T, n + T]) in float64: each query head's chunk of T
    queries at positions n.. attends its KV head's cache slots `order[b, kv]` (in-cache positions
    0..n-1, all visible) and the chunk's own keys where `own[b, h]` [T, T] allows."""
    B, Hq, T = d.B, q.shape[1], own.shape[-1]
    g = Hq // (len(order) // B)
    n = len(order[0, 0])
    icp = torch.arange(n + T)
    k_all, v_all = d.k[layer].double(), d.v[layer].double()
    ref_out = torch.zeros(B, T, Hq * info.head_dim, dtype=torch.float64)
    probs = torch.zeros(B, Hq, T, n + T, dtype=torch.float64)
    for b in range(B):
        for h in range(Hq):
            toks = order[b, h // g] + list(range(a, a + T))
            kk = rope.apply(k_all[b:b + 1, h // g:h // g + 1, toks], icp)[0, 0]
            qq = rope.apply(q[b:b + 1, h:h + 1].double(), icp[n:])[0, 0]
            vis = torch.cat([torch.ones(T, n, dtype=torch.bool), own[b, h]], 1)
            p = torch.softmax(((qq @ kk.T) * info.scaling).masked_fill(~vis, float("-inf")), -1)
            probs[b, h] = p
            ref_out[b, :, h * info.head_dim:(h + 1) * info.head_dim] = p @ v_all[b, h // g, toks]
    return ref_out, probs


def reduce(p: torch.Tensor, how: str, Hkv: int, homogeneous: bool) -> torch.Tensor:
    """[B, Hq, L] -> [B, Hkv, L]."""
    B, Hq, L = p.shape
    g = p.view(B, 1, Hq, L) if homogeneous else p.view(B, Hkv, Hq // Hkv, L)
    out = {"max": lambda x: x.amax(2), "mean": lambda x: x.mean(2), "median": lambda x: x.median(2).values}[how](g)
    return out.expand(B, Hkv, L)


CASES = [  # sink, cascades, window, stride, beta, reduction, homogeneous, selection
    (2, 3, 2, 5, 0.9, "max", False, True),
    (0, 1, 6, 4, 0.9, "max", False, True),           # one cascade: StreamingLLM with strides
    (3, 2, 3, None, 0.5, "mean", False, True),       # dense prefill
    (1, 4, 2, 3, 0.95, "median", False, True),
    (2, 3, 2, 4, 0.9, "max", True, True),            # homogeneous heads
    (2, 3, 2, 5, 0.9, "max", False, False),          # no token selection (the ablation)
    (4, 2, 4, 1, 0.9999999, "max", False, True),     # prefill one token at a time; the code's beta
]


@pytest.mark.parametrize("S,N,W,stride,beta,how,homog,sel", CASES)
def test_outputs_slots_and_scores_match_simulation(S, N, W, stride, beta, how, homog, sel):
    model = tiny("llama")
    rope = rope_for(model)
    cfg = {"name": "cascade", "sink": S, "cascades": N, "cache_size": N * W, "stride": stride, "beta": beta,
           "head_reduction": how, "homogeneous_heads": homog, "selection": sel}
    method, info = make(cfg, model)
    Hq, Hkv = info.num_heads, info.num_kv_heads
    prompt, n_dec = 23, 17                            # past the eager fill: S + N*W + 1 <= 17
    d = Driver(method, info, rope, max_len=prompt + n_dec)
    chunk = stride or prompt
    steps = [(min(chunk, prompt - s), "prefill") for s in range(0, prompt, chunk)] + [(1, "decode")] * n_dec
    sims = {(l, b, h): Sim(S, N, W, sel) for l in range(info.num_layers) for b in range(d.B) for h in range(Hkv)}
    for T, phase in steps:
        a = d.seen
        qs, outs = d.step(T, phase)
        w = torch.tensor([(1 - beta) * beta ** (T - 1 - m) for m in range(T)], dtype=torch.float64)
        for layer in range(info.num_layers):
            order = {(b, h): sims[layer, b, h].order() for b in range(d.B) for h in range(Hkv)}
            n = len(order[0, 0])
            assert all(len(o) == n for o in order.values())       # same count for every head
            own = torch.ones(d.B, Hq, T, T, dtype=torch.bool).tril()
            ref_out, probs = oracle_layer(d, layer, qs[layer], order, a, own, rope, info)
            assert (outs[layer].double() - ref_out).abs().max().item() <= 1e-5, (phase, a, layer)
            mass = reduce((probs * w.view(1, 1, -1, 1)).sum(2), how, Hkv, homog)
            for b in range(d.B):
                for h in range(Hkv):
                    sim = sims[layer, b, h]
                    for i, tok in enumerate(order[b, h]):
                        if i >= len(sim.sinks):
                            sim.score[tok] = beta ** T * sim.score[tok] + mass[b, h, i].item()
                    for t in range(T):
                        sim.score[a + t] = mass[b, h, n + t].item()
                        sim.push(a + t)
        S_ = method.store
        for (layer, b, h), sim in sims.items():
            slots = sim.slots()
            assert S_.tok[layer, b, h, :len(slots)].tolist() == slots, (phase, a, layer, b, h)
            for s, tok in enumerate(slots):
                if tok >= 0 and s >= S:
                    assert math.isclose(S_.score[layer, b, h, s].item(), sim.score[tok], rel_tol=1e-4,
                                        abs_tol=1e-9), (phase, a, layer, b, h, s)
        if phase == "decode":
            assert method.stats()["attended_per_layer"][0] == n + 1


def test_acceptance_pattern_by_hand():
    """S=1, N=2, W=2, no scores: after the eager fill (tokens 1..5: a window of the last 4), cascade 1
    takes every 2nd token that cascade 0 pushes out and otherwise the pushed-out token replaces its
    newest entry."""
    sim = Sim(1, 2, 2, selection=False)
    for t in range(6):
        sim.push(t)
    assert sim.order() == [0, 2, 3, 4, 5]              # eager: token 1 left the window at token 5
    sim.push(6)                                        # j=6: (j-1)%2=1 -> cascade 1 merges 4 into its newest
    assert sim.order() == [0, 2, 4, 5, 6]
    sim.push(7)                                        # j=7: cascade 1 accepts 5, passes 2 on: dropped
    assert sim.order() == [0, 4, 5, 6, 7]
    sim.push(8)                                        # 6 replaces 5 (newest of cascade 1)
    assert sim.order() == [0, 4, 6, 7, 8]


def test_token_span_and_semantics():
    from methods.cascade import CascadeConfig

    sem = CascadeConfig.parse({"sink": 64, "cache_size": 2048, "cascades": 4, "stride": 256}).semantics()
    assert sem["window_per_cascade"] == 512 and sem["token_span"] == 512 * 15 and sem["budget_total"] == 2112
    assert sem["prefill"] == "strided (256)"


@pytest.mark.parametrize("cfg,needle", [
    ({"cache_size": 10, "cascades": 4}, "multiple"),
    ({"cache_size": 500, "sink": 64, "stride": 64}, "positions"),
])
def test_refusals(cfg, needle):
    info = ModelInfo(arch="llama", num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, hidden_size=64,
                     max_position=512)
    with pytest.raises(ConfigError) as e:
        build(OmegaConf.create({"name": "cascade", **cfg}), info)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_bounded_context_when_strided():
    info = ModelInfo(arch="llama", num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, hidden_size=64,
                     max_position=512)
    strided = build(OmegaConf.create({"name": "cascade", "cache_size": 64, "sink": 4, "stride": 32}), info)
    dense = build(OmegaConf.create({"name": "cascade", "cache_size": 64, "sink": 4, "stride": None}), info)
    assert strided.cfg.max_context(info) is None and dense.cfg.max_context(info) == 512


@pytest.mark.parametrize("rule,length,cap,want", [("fixed", 10000, 512, 512), ("quarter", 10000, 65536, 2048),
                                                  ("quarter", 8192, 65536, 2048), ("half", 10000, 65536, 4096),
                                                  ("quarter", 10000, 1024, 1024), ("quarter", 10, 64, 4)])
def test_cache_rules(rule, length, cap, want):
    """The reference's per-sample sizes: LongBench 2^floor(log2(L/4)), Booksum 2^floor(log2(L/2))."""
    from methods.cascade import CascadeConfig

    assert CascadeConfig.parse({"cache_rule": rule, "cache_size": cap}).cache_for(length) == want


def test_graph_warmup_restore_covers_every_state():
    """The CUDA-graph warm-up (runners/graphs.py) runs a decode step twice for real, then copies back
    the buffers() it saved (cascade is not decode_idempotent: a step moves the rings and the EMA
    scores). Emulated on the CPU: after that, decoding goes on exactly as without the warm-up, so no
    state a decode step changes lives outside buffers(). Prompt and steps cross stride and ring
    boundaries (stride 8, windows of 4)."""
    from test_methods_common import tiny_model

    from runners.engine import Engine

    model = tiny_model(2)
    cfg = OmegaConf.create({"name": "cascade", "sink": 4, "cache_size": 16, "cascades": 4, "stride": 8})
    ids = torch.randint(0, 128, (2, 45), generator=torch.Generator().manual_seed(3))

    def decode(warm: bool):
        eng = Engine(model, build(cfg, ModelInfo.from_hf_config(model.config)))
        eng.reset(2, ids.shape[1])
        out = [eng.prefill(ids[:, :21])]
        with torch.inference_mode():
            for t in range(21, ids.shape[1]):
                if warm and t in (21, 30, 37):
                    saved = {n: b.clone() for n, b in eng.method.buffers().items() if b is not None}
                    for _ in range(2):
                        eng.decode_logits(ids[:, t], torch.tensor([eng.seq_len]), graphed=True)
                    for n, b in eng.method.buffers().items():
                        if n in saved:
                            b.copy_(saved[n])
                out.append(eng.decode(ids[:, t]))
        return torch.stack(out, 1)

    assert torch.equal(decode(True), decode(False))
