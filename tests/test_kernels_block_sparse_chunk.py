"""MInference + Cascade's chunk attention (kernels/block_sparse_chunk.py, kernels/block_sparse_chunk_triton.py):
the torch reference against brute force (a float64 masked softmax over [cache | chunk under the index mask]:
output, EMA-weighted mass, pairs), against kernels/cascade_attention.strided_attention_ref bit for bit when
the index covers every causal pair, its per-block cover against kernels/block_sparse_prefill.index_mask; the Triton
kernels against the reference in the interpreter on small shapes (CPU) and at Llama-3.1-8B's shape with a
16K cache on the GPU (`-m gpu`): every pattern, GQA, caches shorter and longer than the chunk, none, cache
counts off the tile size, partial query blocks."""
from __future__ import annotations

import pytest
import torch
from triton_env import DEV, needs_triton

from kernels import block_sparse_prefill as KM
from kernels.cascade_attention import strided_attention_ref
from kernels.block_sparse_chunk import chunk_attention, chunk_attention_ref, chunk_cover, chunk_rows
from methods.parts import minference_patterns as P

SCALE = 0.3
MIX = [P.Pattern("vertical_slash", 4, 5), P.Pattern("a_shape", 2, 6), P.Pattern("block_sparse", 2), P.Pattern("dense")]


def consts(bs):
    return P.Consts(last_q=8, block=bs, init_columns=2, local_slashes=3, min_vertical=2, min_slash=3)


def case(B, Hq, Hkv, n, T, D, heads, bs, seed=0, dtype=torch.float32, device=DEV):
    """Random rotated q over [n cached | T own] keys, the chunk's index estimated as the method does
    (chunk-local positions), EMA weights of beta 0.9."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, T, D, generator=g).to(device, dtype)
    k = torch.randn(B, Hkv, n + T, D, generator=g).to(device, dtype)
    v = torch.randn(B, Hkv, n + T, D, generator=g).to(device, dtype)
    c, grp = consts(bs), Hq // Hkv
    pos = torch.arange(T, device=device)
    heads = [heads[h % len(heads)] for h in range(Hq)]
    index = [P.head_index(p, q[:, h], k[:, h // grp, n:], pos, c, SCALE) for h, p in enumerate(heads)]
    idx = KM.build_index(heads, index, 0, T, T, B, bs, q.device)
    w = (0.1 * 0.9 ** torch.arange(T - 1, -1, -1, dtype=torch.float64)).float().to(device)
    return q, k, v, idx, w


def brute(q, k, v, n, idx, w):
    """float64: one masked softmax per row over [every cached key | the chunk's keys index_mask keeps]."""
    B, Hq, T, D = q.shape
    g = Hq // k.shape[1]
    kk, vv = k.double().repeat_interleave(g, 1), v.double().repeat_interleave(g, 1)
    own = KM.index_mask(idx, T)
    mask = torch.cat([torch.ones(B, Hq, T, n, dtype=torch.bool, device=q.device), own], -1)
    s = (q.double() @ kk.transpose(-1, -2)) * SCALE
    p = torch.softmax(s.masked_fill(~mask, float("-inf")), -1).nan_to_num(0.0)
    out = (p @ vv).transpose(1, 2).reshape(B, T, Hq * D)
    return out, (p * w.double().view(1, 1, -1, 1)).sum(2), int(own.sum())


@pytest.mark.parametrize("n,T,bs", [(0, 37, 8), (13, 29, 8), (50, 20, 16), (7, 64, 16)])
def test_cover_equals_index_mask(n, T, bs):
    idx = case(2, 4, 2, n, T, 16, MIX, bs, seed=T, device="cpu")[3]
    rows = torch.arange(T)
    assert torch.equal(chunk_rows(chunk_cover(idx, T), idx, rows), KM.index_mask(idx, T))


@pytest.mark.parametrize("n,T,bs", [(0, 37, 8), (13, 29, 8), (50, 20, 16), (5, 45, 4)])
def test_reference_equals_brute_force(n, T, bs):
    q, k, v, idx, w = case(2, 4, 2, n, T, 16, MIX, bs, seed=n + T, device="cpu")
    out, mass, pairs = chunk_attention_ref(q, k, v, n, idx, SCALE, w)
    want_out, want_mass, want_pairs = brute(q, k, v, n, idx, w)
    assert (out.double() - want_out).abs().max().item() < 1e-5
    assert (mass.double() - want_mass).abs().max().item() < 1e-6
    assert int(pairs) == want_pairs
    assert (mass[:, :, n:].double() > 0).sum() <= want_pairs    # a chunk key's mass: only from attended pairs


def test_reference_small_blocks_sum_the_same():
    """The memory bound (query blocks of the reference) changes no value beyond rounding."""
    q, k, v, idx, w = case(1, 4, 2, 9, 33, 16, MIX, 8, seed=3, device="cpu")
    a = chunk_attention_ref(q, k, v, 9, idx, SCALE, w)
    b = chunk_attention_ref(q, k, v, 9, idx, SCALE, w, block_bytes=1)
    assert (a[0] - b[0]).abs().max().item() < 1e-6 and (a[1] - b[1]).abs().max().item() < 1e-6 and a[2] == b[2]


@pytest.mark.parametrize("n,T", [(0, 24), (11, 24), (40, 17)])
def test_covering_index_is_strided_attention_bit_for_bit(n, T):
    """An index covering every causal pair of the chunk: the same arithmetic as Cascade's reference."""
    cover = [P.Pattern("vertical_slash", T, T), P.Pattern("dense")]
    q, k, v, idx, w = case(2, 4, 2, n, T, 16, cover, 8, seed=7, device="cpu")
    assert torch.equal(KM.index_mask(idx, T), torch.ones(T, T, dtype=torch.bool).tril().expand(2, 4, T, T))
    out, mass, pairs = chunk_attention_ref(q, k, v, n, idx, SCALE, w)
    ref_out, ref_mass = strided_attention_ref(q, k, v, SCALE, w)
    assert torch.equal(out, ref_out) and torch.equal(mass, ref_mass)
    assert int(pairs) == 2 * 4 * T * (T + 1) // 2


# --- the Triton kernels against the reference -------------------------------------------------------------

@needs_triton
@pytest.mark.parametrize("B,Hq,Hkv,n,T,D,bs", [
    (2, 4, 2, 0, 37, 16, 8),          # first chunk: no cache, the mass kernel of the cache skipped
    (2, 4, 2, 13, 29, 16, 8),         # a cache off the tile size (a masked last cache tile)
    (1, 4, 1, 70, 20, 32, 16),        # cache longer than the chunk, GQA 4:1, partial query block
    (1, 4, 4, 32, 48, 16, 16),        # no GQA, cache a whole number of tiles
    (1, 2, 2, 5, 45, 16, 4),          # block 4 (BM 16 > BS: the unmasked stage is off)
])
def test_kernel_equals_reference(B, Hq, Hkv, n, T, D, bs, monkeypatch):
    q, k, v, idx, w = case(B, Hq, Hkv, n, T, D, MIX, bs, seed=n * T + bs)
    want = chunk_attention_ref(q, k, v, n, idx, SCALE, w)
    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    got = chunk_attention(q, k, v, n, idx, SCALE, w)
    assert torch.isfinite(got[0]).all() and torch.isfinite(got[1]).all()
    assert (got[0] - want[0]).abs().max().item() < 2e-5
    assert (got[1] - want[1]).abs().max().item() < 2e-6
    assert int(got[2]) == int(want[2])


@needs_triton
def test_kernel_with_long_slash_lists_and_columns(monkeypatch):
    """Far diagonals and columns (several pieces and column tiles per query block), an A-shape window,
    unmasked pieces in the first stage (block 16 = BM)."""
    heads = [P.Pattern("vertical_slash", 20, 30), P.Pattern("a_shape", 16, 24), P.Pattern("dense"),
             P.Pattern("vertical_slash", 40, 3)]
    q, k, v, idx, w = case(1, 4, 2, 21, 90, 16, heads, 16, seed=5)
    assert (idx.block_free > 0).any() and (idx.column_count > 16).any()
    want = chunk_attention_ref(q, k, v, 21, idx, SCALE, w)
    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    got = chunk_attention(q, k, v, 21, idx, SCALE, w)
    assert (got[0] - want[0]).abs().max().item() < 2e-5
    assert (got[1] - want[1]).abs().max().item() < 2e-6
    assert int(got[2]) == int(want[2])



@needs_triton
@pytest.mark.parametrize("n", [0, 13])
def test_kernel_values_strided_unlike_keys(n, monkeypatch):
    """A first chunk attends v as the projection left it ([B, T, Hkv, D] transposed to [B, Hkv, T, D]) while
    its keys are the rotation's contiguous copy: the kernel reads each with its own strides (this differed on
    the GPU before: an equal-strides assertion)."""
    q, k, v, idx, w = case(1, 4, 2, n, 29, 16, MIX, 8, seed=7)
    vt = v.transpose(1, 2).contiguous().transpose(1, 2)          # same values, [B, L, Hkv, D] memory order
    assert vt.stride() != k.stride()
    want = chunk_attention_ref(q, k, v, n, idx, SCALE, w)
    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    got = chunk_attention(q, k, vt, n, idx, SCALE, w)
    assert (got[0] - want[0]).abs().max().item() < 2e-5
    assert (got[1] - want[1]).abs().max().item() < 2e-6

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_kernel_llama31_shape_bf16():
    """Llama-3.1-8B's attention shape, a 16K cache + 64 sinks, an 8K chunk, the reference's default pattern:
    bf16 kernels against the fp32 reference (relative error of the output, of the mass)."""
    n, T, HQ, HKV, D = 16384 + 64, 8192, 32, 8, 128
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, HQ, T, D, generator=g).to(DEV, torch.bfloat16)
    k = torch.randn(1, HKV, n + T, D, generator=g).to(DEV, torch.bfloat16)
    v = torch.randn(1, HKV, n + T, D, generator=g).to(DEV, torch.bfloat16)
    c, heads = P.Consts(), [P.Pattern(*P.REFERENCE_DEFAULT)] * HQ
    pos = torch.arange(T, device=DEV)
    index = [P.head_index(p, q[:, h], k[:, h // 4, n:], pos, c, 0.088) for h, p in enumerate(heads)]
    idx = KM.build_index(heads, index, 0, T, T, 1, c.block, q.device)
    w = ((1 - 0.9999999) * 0.9999999 ** torch.arange(T - 1, -1, -1, dtype=torch.float64)).float().to(DEV)
    got = chunk_attention(q, k, v, n, idx, 0.088, w)
    want = chunk_attention_ref(q.float(), k.float(), v.float(), n, idx, 0.088, w, block_bytes=1 << 30)
    rel = lambda a, b: ((a.float() - b.float()).norm() / b.float().norm()).item()
    assert rel(got[0], want[0]) < 1e-2 and rel(got[1], want[1]) < 1e-2
    assert int(got[2]) == int(want[2])
