"""StreamingLLM oracle: on random q, k, v the method attends exactly sinks + the recent window, with
keys re-rotated to their in-cache positions arange(kv_len) and queries at their in-cache position,
as the reference (pos_shift + StartRecentKVCache) does; recomputed here from a plain list cache."""
from __future__ import annotations

import pytest
import torch
from test_methods_common import Driver, make, masked_attention, one_thread, rope_for  # noqa: F401
from tiny_models import tiny

from methods import Step


def reference_step(kept: list[int], a: int, T: int, S: int, W: int, includes_current: bool) -> list[int]:
    """The reference cache (absolute positions, in cache order) that a step of T tokens at a..a+T-1
    attends: evict to the first S + the last W (or W - T) entries, then append the new tokens."""
    n_recent = max(W - T, 0) if includes_current else W
    sinks = [p for p in kept if p < S]
    recent = [p for p in kept if p >= S]
    recent = recent[-n_recent:] if n_recent else []
    return sinks + recent + list(range(a, a + T))


@pytest.mark.parametrize("S,W,includes_current,prefill,stride", [
    (2, 5, False, "stream", 3),
    (2, 5, True, "stream", 3),
    (0, 4, False, "stream", 2),
    (3, 6, False, "dense", None),
    (1, 3, True, "dense", None),
])
def test_kept_tokens_and_positions_match_reference(S, W, includes_current, prefill, stride):
    model = tiny("llama")
    rope = rope_for(model)
    cfg = {"name": "streaming_llm", "sink": S, "window": W, "window_includes_current": includes_current,
           "prefill": prefill, "stride": stride}
    method, info = make(cfg, model)
    prompt, n_decode = 13, 7
    d = Driver(method, info, rope, max_len=prompt + n_decode)
    chunk = method.prefill_chunk or prompt
    steps = [(min(chunk, prompt - s), "prefill") for s in range(0, prompt, chunk)] + [(1, "decode")] * n_decode
    kept: list[int] = []
    for T, phase in steps:
        a = d.seen
        qs, outs = d.step(T, phase)
        cache = reference_step(kept, a, T, S, W, includes_current)
        n = len(cache)
        icp = torch.arange(n)
        q_pos = icp[n - T:]
        mask = (icp.view(1, -1) <= q_pos.view(-1, 1)).expand(d.B, info.num_heads, T, n)
        for layer in range(info.num_layers):
            k = rope.apply(d.k[layer][:, :, cache], icp)
            q = rope.apply(qs[layer], q_pos)
            ref = masked_attention(q, k, d.v[layer][:, :, cache], mask, info.scaling)
            assert (outs[layer] - ref).abs().max().item() <= 1e-5, (phase, a, layer)
        kept = cache
        if phase == "decode":
            assert method.stats()["attended_per_layer"][0] == n
    if includes_current:
        assert len(kept) == S + W
    else:
        assert len(kept) == S + W + 1


def test_semantics_record_effective_budget():
    model = tiny("llama")
    method, _ = make({"name": "streaming_llm", "sink": 4, "budget": 64}, model)
    sem = method.semantics()
    assert sem["window_effective"] == 60 and sem["budget_total"] == 64 and sem["prefill_stride"] == 60
    assert sem["window_includes_current"] is False and sem["prefill"] == "stream" and sem["sink"] == 4


def test_scores_at_a_million_tokens_equal_the_in_cache_reference():
    """Recent keys are stored rotated at their absolute positions and sinks re-rotated each step: at
    positions near 1M that must still give the reference's scores at small in-cache positions. The
    control shows the check can fail: float32 angles at those absolute positions miss by > 1e-3."""
    model = tiny("llama")
    rope = rope_for(model)
    S, W = 2, 5
    method, info = make({"name": "streaming_llm", "sink": S, "window": W, "stride": 3}, model)
    method.setup(info, 1, 64, torch.device("cpu"), torch.float32)
    gen = torch.Generator().manual_seed(0)
    keys: dict[int, list] = {}
    kept: list[int] = []
    J = S + (W + 1) * 166_667  # ~1M, on a ring boundary: the ring fills from its first slot, as after a real prefix
    # sinks, then a jump to ~1M and two chunks that fill the ring (decode reads the filled slots by length)
    steps = [(0, 2, "prefill"), (J, 3, "prefill"), (J + 3, 3, "prefill")] + [(J + 6 + i, 1, "decode") for i in range(6)]
    worst = control = 0.0
    for a, T, phase in steps:
        pos = torch.arange(a, a + T)
        method.begin(Step(phase=phase, start=a, length=T, positions=pos))
        cache = reference_step(kept, a, T, S, W, False)
        n = len(cache)
        icp = torch.arange(n)
        mask = (icp.view(1, -1) <= icp[n - T:].view(-1, 1)).expand(1, info.num_heads, T, n)
        for layer in range(info.num_layers):
            q = torch.randn(1, info.num_heads, T, info.head_dim, generator=gen)
            k = torch.randn(1, info.num_kv_heads, T, info.head_dim, generator=gen)
            v = torch.randn(1, info.num_kv_heads, T, info.head_dim, generator=gen)
            for t in range(T):
                keys.setdefault(layer, {})[a + t] = (k[:, :, t], v[:, :, t])
            out = method.attend(layer, q, k, v, rope)
            if phase != "decode":  # the chunks after the jump see ghost positions J-W..J-1 as in-cache
                continue           # slots; from the first decode step the window holds real tokens only
            K = torch.stack([keys[layer][p][0] for p in cache], 2).double()
            V = torch.stack([keys[layer][p][1] for p in cache], 2).double()
            ref = masked_attention(rope.apply(q.double(), icp[n - T:]), rope.apply(K, icp), V, mask, info.scaling)
            worst = max(worst, (out.double() - ref).abs().max().item())
            shift = cache[-1] - (n - 1)  # absolute minus in-cache position of the recent tokens
            k_abs = torch.tensor([p + shift if p < S else p for p in cache])
            naive = masked_attention(rope.apply(q, pos), rope.apply(K.float(), k_abs), V.float(), mask, info.scaling)
            control = max(control, (naive.double() - ref).abs().max().item())
        kept = cache
    assert worst <= 1e-5, worst
    assert control > 1e-3, control  # measured: 0.012 (worst above: 3e-7)
