"""StreamingLLM oracle: on random q, k, v the method attends exactly sinks + the recent window, with
keys re-rotated to their in-cache positions arange(kv_len) and queries at their in-cache position,
as the reference (pos_shift + StartRecentKVCache) does; recomputed here from a plain list cache."""
from __future__ import annotations

import pytest
import torch
from test_methods_common import Driver, make, masked_attention, one_thread, rope_for  # noqa: F401
from tiny_models import tiny


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
