"""Tactic's peak memory against full attention's (issue 34), measured on the CPU: live tensor bytes
(tests/live_bytes.py) through reset, prefill, the prefill-end clustering, the decode graph's capture
(runners/graphs.py, run on the CPU with its stream and graph calls as no-ops) and two decode steps.

On an H100 at 128K (Llama-3-8B, bf16, batch 1) Tactic peaked at 48.5 GiB against full's 40.4: the graph
warm-up cloned every declared buffer (KV cache included) of a method not `decode_idempotent`. The model
here keeps Llama-3-8B's proportions that matter: GQA 4, head dim 128, and enough layers that the KV cache
outweighs the prefill's activations as it does at 128K (16 GiB of KV against ~10 GiB; here 16 MB
against ~11), so a second copy of the cache shows as it did there (1.21x before the fix, 1.20x on the H100)."""
from __future__ import annotations

import pytest
import torch
from live_bytes import LiveBytes, cpu_capture
from omegaconf import OmegaConf

from methods import ModelInfo, build
from runners.engine import Engine

S, LAYERS, KV_HEADS, HEAD_DIM = 512, 16, 2, 128


@pytest.fixture(scope="module")
def model():
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=LAYERS, num_attention_heads=8,
                      num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM, vocab_size=256, max_position_embeddings=S + 64)
    cfg._attn_implementation = "eager"
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    torch.set_num_threads(n)


def peaks(model, cfg: dict) -> dict[str, int]:
    """Bytes: declared storage, the peak of each phase, what is live after the prefill, the overall peak."""
    method = build(OmegaConf.create(cfg), ModelInfo.from_hf_config(model.config))
    eng = Engine(model, method)
    ids = torch.randint(0, 256, (1, S), generator=torch.Generator().manual_seed(0))
    lb, out = LiveBytes(), {}
    with lb:
        eng.reset(1, S + 8)
        out["declared"] = sum(t.numel() * t.element_size() for t in method.buffers().values() if t is not None)
        eng.prefill(ids)
        out["prefill"], out["after_prefill"] = lb.peak, lb.live
        lb.mark()
        method.before_decode(eng.seq_len)
        out["cluster"] = lb.peak
        lb.mark()
        cpu_capture(eng, ids[:, -1])        # the first decode step, as captured on the GPU
        out["capture"] = lb.peak
        eng.seq_len += 1                    # the step the capture ran (the GPU replays it)
        lb.mark()
        for _ in range(2):
            eng.decode(ids[:, -1])
        out["decode"] = lb.peak
    out["overall"] = max(out[k] for k in ("prefill", "cluster", "capture", "decode"))
    return out


def test_live_bytes_counts_new_storages_until_freed():
    x = torch.zeros(1000)                    # made before: never counted, nor its views or in-place writes
    lb = LiveBytes()
    with lb:
        x.add_(1)
        view = x.view(10, 100)
        a = x * 2
        b = a[10:]                          # a view keeps a's storage alive
        del a
        assert lb.live == 4000
        del b
        c = torch.empty(500)
        assert (lb.live, lb.peak) == (2000, 4000)
        lb.mark()
        assert lb.peak == 2000
        del c, view
    assert lb.live == 0


@pytest.fixture(scope="module")
def full(model):
    return peaks(model, {"name": "full"})


@pytest.mark.parametrize("options", [{"mode": "topk", "budget": S // 32}, {}], ids=["topk", "fit"])
def test_tactic_peak_within_full_plus_ten_percent(model, full, options):
    """Tactic's peak <= 1.1 x full's plus the storage it declares beyond full's (its cluster index), and
    the clustering holds at most a few layers' keys at once (it runs layer by layer)."""
    got = peaks(model, {"name": "tactic", **options})
    extra = got["declared"] - full["declared"]
    mib = {k: round(v / 2**20, 2) for k, v in got.items()}
    assert got["overall"] <= 1.1 * full["overall"] + extra, (mib, round(full["overall"] / 2**20, 2))
    one_layer_keys = KV_HEADS * S * HEAD_DIM * 4
    assert got["cluster"] - got["after_prefill"] <= 4 * one_layer_keys, mib
