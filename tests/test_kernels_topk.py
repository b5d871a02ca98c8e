"""The radix-select top-k kernel (kernels/topk.py) against its reference and against the kit's
torch.topk op: same sets on distinct scores, deterministic lowest-position ties, -inf never chosen,
+inf always (when it fits), k beyond the finite entries, sorted positions, zero padding. Interpreter
on the CPU; real shapes (128K, B*H = 256 rows) with `-m gpu`."""
from __future__ import annotations

import pytest
import torch
from triton_env import DEV, needs_triton

import kernels
from kernels import topk as T

pytestmark = needs_triton


def scores_for(B, H, S, lens, seed, ties=False, forced=()):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(B, H, S, generator=g) * 3
    if ties:
        s = (s * 2).round() / 2   # many exact ties
    for b, n in enumerate(lens):
        s[b, :, n:] = float("-inf")
    for p in forced:
        s[..., p] = float("inf")
    return s.to(DEV), torch.tensor(lens, dtype=torch.int32, device=DEV)


@pytest.mark.parametrize("backend,k", [("triton", 40), ("triton", 300), ("torch", 40)])
def test_topk_writes_rows_in_place(monkeypatch, backend, k):
    """out/rows (LycheeDecode's per-KV-head sets): row h lands in out row rows[h], the other rows are
    untouched, index columns past min(k, S) are zeroed, and the result is the plain call's."""
    monkeypatch.setenv("HARNESS_KERNELS", backend)
    s, lengths = scores_for(2, 3, 257, [257, 120], seed=5, ties=True)
    rows = torch.tensor([4, 0, 2], device=DEV)
    oi = torch.full((2, 5, 260), -7, dtype=torch.int32, device=DEV)
    oc = torch.full((2, 5), -7, dtype=torch.int32, device=DEV)
    got = T.topk_positions(s, lengths, k, out=(oi, oc), rows=rows)
    assert got[0] is oi and got[1] is oc
    ridx, rcnt = T.topk_positions_ref(s, lengths, k)
    kk = ridx.shape[-1]
    for h, r in enumerate(rows.tolist()):
        assert torch.equal(oi[:, r, :kk], ridx[:, h]) and torch.equal(oc[:, r], rcnt[:, h])
        assert (oi[:, r, kk:] == 0).all()
    assert (oi[:, [1, 3]] == -7).all() and (oc[:, [1, 3]] == -7).all()


@pytest.mark.parametrize("S,lens,k", [(300, [300, 171], 40), (300, [37, 300], 64), (257, [257], 257),
                                      (100, [5, 100], 300), (513, [513, 400], 1)])
@pytest.mark.parametrize("ties", [False, True])
def test_topk_kernel_matches_reference(monkeypatch, S, lens, k, ties):
    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    s, lengths = scores_for(len(lens), 3, S, lens, seed=S + k, ties=ties, forced=(0, 2))
    idx, cnt = T.topk_positions(s, lengths, k)
    ridx, rcnt = T.topk_positions_ref(s, lengths, k)
    assert torch.equal(cnt, rcnt) and torch.equal(idx, ridx)
    kk = min(k, S)
    assert idx.shape == (len(lens), 3, kk)
    for b, n in enumerate(lens):
        c = min(kk, n)
        assert (cnt[b] == c).all()
        assert (idx[b, :, :c].diff(dim=-1) > 0).all() and (idx[b, :, c:] == 0).all()
        if c >= 2:  # the +inf (forced) positions are always in
            assert ((idx[b, :, :c] == 0).any(-1) & (idx[b, :, :c] == 2).any(-1)).all()


def test_reference_equals_the_kit_op_on_distinct_scores():
    s, lengths = scores_for(2, 4, 500, [500, 333], seed=7)
    a = T.topk_positions_ref(s.cpu(), lengths.cpu(), 77)
    b = kernels.topk_positions(s.cpu(), lengths.cpu(), 77)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("B,H,S,k", [(8, 32, 131072, 4096), (1, 8, 131072, 4096), (4, 8, 32768, 2048)])
def test_topk_kernel_real_shapes(B, H, S, k):
    g = torch.Generator(device="cuda").manual_seed(S)
    s = torch.randn(B, H, S, device="cuda", generator=g)
    lengths = torch.randint(S // 2, S + 1, (B,), device="cuda", dtype=torch.int32, generator=g)
    s = s.masked_fill(torch.arange(S, device="cuda") >= lengths.view(B, 1, 1), float("-inf"))
    idx, cnt = T.topk_positions(s, lengths, k)
    ridx, rcnt = kernels.topk_positions(s, lengths, k)
    assert torch.equal(cnt, rcnt) and torch.equal(idx, ridx)


def test_long_rows_go_to_torch_topk(monkeypatch):
    """Past RADIX_MAX_CONTEXT the dispatcher hands the row to torch.topk + sort (same contract);
    impl="radix" keeps the kernel (what bench.lychee_kernels times)."""
    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    calls = []

    def spy(*args):
        calls.append(args[0].shape[-1])
        return kernels.topk_positions(*args)
    monkeypatch.setattr(T, "torch_topk_positions", spy)
    monkeypatch.setattr(T, "RADIX_MAX_CONTEXT", 256)
    s, lengths = scores_for(2, 3, 300, [300, 171], seed=3)
    ref = T.topk_positions_ref(s, lengths, 40)
    for got in (T.topk_positions(s, lengths, 40), T.topk_positions(s, lengths, 40, impl="radix")):
        assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
    short = s[..., :256].contiguous()
    T.topk_positions(short, lengths.clamp(max=256), 40)
    assert calls == [300]  # the long row only, and not with impl="radix"
    with pytest.raises(ValueError):
        T.topk_positions(s, lengths, 40, impl="fast")
    # a caller's own cut (LycheeDecode's token rows, lychee_sets.RADIX_MAX): the kernel up to it, torch past it
    got = T.topk_positions(s, lengths, 40, radix_max=300)
    assert calls == [300] and torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
    T.topk_positions(s, lengths, 40, radix_max=299)
    assert calls == [300, 300]


@pytest.mark.parametrize("ties", [False, True])
def test_topk_kernel_row_k_matches_reference(monkeypatch, ties):
    """A per-sequence k (row_k <= k, Quest's clamped budget): the kernel == the reference, whose
    top-row_k is the first row_k of its stable descending order."""
    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    s, lengths = scores_for(3, 2, 200, [200, 90, 150], seed=11, ties=ties, forced=(0, 2))
    row_k = torch.tensor([30, 7, 1], dtype=torch.int32)
    idx, cnt = T.topk_positions(s, lengths, 30, row_k=row_k)
    ridx, rcnt = T.topk_positions_ref(s, lengths, 30, row_k)
    assert torch.equal(cnt, rcnt) and torch.equal(idx, ridx)
    assert cnt[:, 0].tolist() == [30, 7, 1]
    for b in range(3):  # the first row_k of the plain top-k
        full_i, _ = T.topk_positions_ref(s[b:b + 1], lengths[b:b + 1], int(row_k[b]))
        assert torch.equal(idx[b, :, :int(row_k[b])], full_i[0])


@pytest.mark.parametrize("S,lens,k,chunks", [(300, [300, 171], 20, 3), (513, [513, 64], 16, 4), (640, [640], 100, 2),
                                             (257, [257, 3], 8, 8), (700, [700, 650], 30, "auto")])
@pytest.mark.parametrize("ties", [False, True])
def test_chunked_topk_is_the_one_stage_set(monkeypatch, S, lens, k, chunks, ties):
    """The two-stage (chunked) top-k gives the one-stage reference's set, ties to the lower positions
    included, with the per-sequence k and the in-place rows of the callers."""
    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    monkeypatch.setattr(T, "CHUNKS_AUTO", True)
    monkeypatch.setattr(T, "CHUNK_LEN", 128)
    s, lengths = scores_for(len(lens), 4, S, lens, seed=S + k, ties=ties, forced=(1,))
    C, _ = T.chunk_plan(S, min(k, S), chunks)
    assert C > 1
    idx, cnt = T.topk_positions(s, lengths, k, impl="radix", chunks=chunks)
    ridx, rcnt = T.topk_positions_ref(s, lengths, k)
    assert torch.equal(cnt, rcnt) and torch.equal(idx, ridx)
    rk = torch.tensor([k - 3, k][:len(lens)], dtype=torch.int32, device=DEV)
    rows = torch.tensor([3, 1, 0, 2], device=DEV)
    oi = torch.full((len(lens), 4, k + 2), -7, dtype=torch.int32, device=DEV)
    oc = torch.full((len(lens), 4), -7, dtype=torch.int32, device=DEV)
    T.topk_positions(s, lengths, k, impl="radix", chunks=chunks, row_k=rk, out=(oi, oc), rows=rows)
    ridx, rcnt = T.topk_positions_ref(s, lengths, k, rk)
    assert torch.equal(oi[:, rows, :k], ridx) and torch.equal(oc[:, rows], rcnt) and (oi[..., k:] == 0).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("B,H,S,k", [(1, 32, 8200, 256), (4, 32, 2052, 256), (1, 8, 2050, 64)])
def test_chunked_topk_real_shapes(B, H, S, k):
    """Quest's page rows at 128K / 32K and LycheeDecode's 64-slot block rows at 128K: the two-stage
    kernel (the default) equals the one-stage kernel and the reference, bf16-like ties included."""
    g = torch.Generator(device="cuda").manual_seed(S + k)
    s = (torch.randn(B, H, S, device="cuda", generator=g) * 8).round() / 8
    lengths = torch.randint(S // 2, S + 1, (B,), device="cuda", dtype=torch.int32, generator=g)
    s = s.masked_fill(torch.arange(S, device="cuda") >= lengths.view(B, 1, 1), float("-inf"))
    assert T.chunk_plan(S, k, "auto")[0] > 1
    two = T.topk_positions(s, lengths, k, impl="radix")
    one = T.topk_positions(s, lengths, k, impl="radix", chunks=1)
    ref = T.topk_positions_ref(s, lengths, k)
    for a in (two, one):
        assert torch.equal(a[0], ref[0]) and torch.equal(a[1], ref[1])
