"""MInference's block/column sparse prefill (kernels/block_sparse_prefill.py, kernels/block_sparse_prefill_triton.py): the
index builder's lists against the masked path's mask (methods/parts/minference_patterns.rows_mask, itself
tested against brute force in tests/test_methods_minference.py) key for key, with no key listed twice;
the kernel against the masked torch prefill (minference_patterns.sparse_prefill) in Triton's
interpreter on small shapes (CPU) and at the Llama-3-8B shape on the GPU (`-m gpu`); every pattern,
a mixed layer, GQA, lengths that are not multiples of the block, a chunk starting mid-block, and
sizes that cover the prompt against plain causal attention."""
from __future__ import annotations

import pytest
import torch
from triton_env import DEV, needs_triton

import kernels
from kernels import block_sparse_prefill as KM
from methods import minference as M
from methods.parts import minference_patterns as P

SCALE = 0.3
VS, AS, BSP, DENSE = (P.Pattern("vertical_slash", 4, 5), P.Pattern("a_shape", 2, 6), P.Pattern("block_sparse", 2),
                      P.Pattern("dense"))


def consts(bs):
    return P.Consts(last_q=8, block=bs, init_columns=2, local_slashes=3, min_vertical=2, min_slash=3)


def qkv(B, Hq, Hkv, N, start, D, seed, dtype=torch.float32, device=DEV):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, Hq, N - start, D, generator=g)
    k = torch.randn(B, Hkv, N, D, generator=g)
    v = torch.randn(B, Hkv, N, D, generator=g)
    return [t.to(device=device, dtype=dtype) for t in (q, k, v)]


def lists(heads, q, k, start, c):
    """(the estimated index, the block/column lists) of a layer."""
    g = q.shape[1] // k.shape[1]
    pos = torch.arange(start, k.shape[2], device=q.device)
    index = [P.head_index(p, q[:, h], k[:, h // g], pos, c, SCALE) for h, p in enumerate(heads)]
    return index, KM.build_index(heads, index, start, q.shape[2], k.shape[2], q.shape[0], c.block, q.device)


def multiplicity(idx: KM.SparseIndex, N: int) -> torch.Tensor:
    """How many times each key is listed for each query block [B, H, Q, N] (pieces and columns)."""
    keys = torch.arange(N)
    live = torch.arange(idx.block_start.shape[-1]) < idx.block_count[..., None]
    inside = (keys >= idx.block_start[..., None]) & (keys < idx.block_end[..., None]) & live[..., None]
    n = inside.sum(-2)
    clive = torch.arange(idx.column_index.shape[-1]) < idx.column_count[..., None]
    return n.scatter_add(-1, idx.column_index.long(), clive.long())


def check_lists(heads, index, idx, start, N, c):
    pos = torch.arange(start, N)
    want = torch.stack([P.rows_mask(p, index[h], pos, N, idx.block_count.shape[0], c) for h, p in enumerate(heads)], 1)
    assert torch.equal(KM.index_mask(idx, N), want)
    assert multiplicity(idx, N).max() <= 1                                  # a listed key counts once
    assert ((idx.block_end - idx.block_start) <= c.block).all()             # a piece is one tile of keys
    check_free(idx)


def check_free(idx: KM.SparseIndex):
    """The first block_free pieces of each query block are what the kernel attends unmasked: bs keys, causal
    for every row of the step in the block, inside the head's window for all of them (or all sinks)."""
    bs, Q, cb = idx.block, idx.block_count.shape[-1], idx.block_start.shape[-1]
    qb = idx.first_block + torch.arange(Q, device=idx.block_count.device)
    lo = (qb * bs).clamp(min=idx.q_start)[None, None, :, None]
    hi = ((qb + 1) * bs).clamp(max=idx.q_start + idx.q_len)[None, None, :, None]
    start, end = idx.block_start.long(), idx.block_end.long()
    init, local = idx.init.long()[None, :, None, None], idx.local.long()[None, :, None, None]
    ok = (end - start == bs) & (end - 1 <= lo) & ((hi - 1 - start < local) | (end <= init))
    free = torch.arange(cb, device=lo.device) < idx.block_free[..., None]
    assert (idx.block_free <= idx.block_count).all() and ok[free].all()


# --- the index builder ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("N,start,bs", [(41, 0, 8), (41, 10, 8), (100, 37, 16), (64, 0, 16), (257, 100, 64)])
@pytest.mark.parametrize("heads", [[VS], [AS], [BSP], [DENSE], [P.Pattern("vertical_slash", 999, 999),
                                                                P.Pattern("a_shape", 999, 999),
                                                                P.Pattern("block_sparse", 999),
                                                                P.Pattern("a_shape", 1, 1)]],
                         ids=["vertical_slash", "a_shape", "block_sparse", "dense", "large_sizes"])
def test_lists_reproduce_the_masked_path(N, start, bs, heads):
    c = consts(bs)
    q, k, _ = qkv(2, len(heads), len(heads), N, start, 8, seed=N + start, device="cpu")
    index, idx = lists(heads, q, k, start, c)
    check_lists(heads, index, idx, start, N, c)


def test_vertical_slash_lists_for_arbitrary_columns_and_diagonals():
    """Any column/diagonal sets (no forced diagonal 0, ranges clamped at key 0, duplicates of the clamp,
    columns inside and between ranges, partial last blocks)."""
    g = torch.Generator().manual_seed(1)
    for trial in range(60):
        bs = (4, 8, 16)[trial % 3]
        N = int(torch.randint(5, 90, (1,), generator=g))
        start = int(torch.randint(0, N, (1,), generator=g))
        v, s = (int(torch.randint(1, N + 1, (1,), generator=g)) for _ in range(2))
        cols = torch.stack([torch.randperm(N, generator=g)[:v] for _ in range(2)])
        offs = torch.stack([torch.randperm(N, generator=g)[:s] for _ in range(2)])
        p = P.Pattern("vertical_slash", v, s)
        idx = KM.build_index([p], [(cols, offs)], start, N - start, N, 2, bs, torch.device("cpu"))
        check_lists([p], [(cols, offs)], idx, start, N, P.Consts(block=bs))


def test_merged_diagonals_become_whole_pieces():
    """The 100 nearest diagonals of the reference are ~2 tiles per query block, not 100 one-key pieces."""
    N, bs = 256, 64
    offs = torch.arange(100)[None]
    idx = KM.build_index([P.Pattern("vertical_slash", 1, 100)], [(torch.zeros(1, 1, dtype=torch.long), offs)],
                         0, N, N, 1, bs, torch.device("cpu"))
    assert idx.block_count[0, 0].tolist() == [1, 2, 3, 3]            # [0, 64) | [0, 128) | [29, 192) | [93, 256)
    assert idx.column_count[0, 0].tolist() == [0, 0, 1, 1]            # column 0 once the ranges leave it


# --- the kernel against the masked torch prefill ------------------------------------------------------------

def kernel_vs_masked(heads, Hkv, N, start, bs, D, B=2, seed=0):
    c = consts(bs)
    q, k, v = qkv(B, len(heads), Hkv, N, start, D, seed)
    pos = torch.arange(start, N, device=DEV)
    want, density = P.sparse_prefill(q, k, v, pos, heads, c, SCALE)
    got, got_density = M.kernel_prefill(q, k, v, pos, start, heads, c, SCALE)
    assert torch.isfinite(got).all()
    assert (got - want).abs().max().item() < 2e-5
    assert float(got_density) == pytest.approx(density, abs=1e-12)   # the kernel counted the mask's pairs
    return got


@needs_triton
@pytest.mark.parametrize("heads", [[VS] * 4, [AS] * 4, [BSP] * 4, [VS, AS, BSP, DENSE]],
                         ids=["vertical_slash", "a_shape", "block_sparse", "mixed"])
def test_kernel_equals_masked_prefill(heads, monkeypatch):
    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    kernel_vs_masked(heads, Hkv=2, N=45, start=0, bs=8, D=16)


@needs_triton
@pytest.mark.parametrize("Hkv,N,start,bs,D", [(1, 200, 0, 64, 64), (2, 200, 70, 64, 128), (4, 100, 37, 16, 24),
                                              (2, 61, 13, 8, 16)])
def test_kernel_shapes_gqa_and_chunks(Hkv, N, start, bs, D, monkeypatch):
    """GQA 4:1 and 2:1 and none, head dims 64 / 128 / 24 (padded), lengths off the block, a prefill step
    whose queries start mid-block over a longer key range; 40 columns: several column tiles at block 8/16."""
    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    heads = [P.Pattern("vertical_slash", 40, 20), P.Pattern("a_shape", 8, 40), P.Pattern("block_sparse", 2),
             P.Pattern("vertical_slash", 3, 3)]
    kernel_vs_masked(heads, Hkv, N, start, bs, D, B=1, seed=N)


@needs_triton
@pytest.mark.parametrize("N", [150, 128])
def test_sizes_covering_the_prompt_are_causal_attention(N, monkeypatch):
    """block_sparse keeps min(K, N // block) blocks (the reference's floor): dense only when N is a
    multiple of the block."""
    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    bs = 64
    c = consts(bs)
    q, k, v = qkv(1, 4, 2, N, 0, 32, seed=5)
    heads = [P.Pattern("vertical_slash", N, N), P.Pattern("a_shape", N, N),
             P.Pattern("block_sparse", 99) if N % bs == 0 else DENSE, DENSE]
    got, density = M.kernel_prefill(q, k, v, torch.arange(N, device=DEV), 0, heads, c, SCALE)
    want = kernels.prefill_attention(q, k, v, SCALE)
    assert (got - want).abs().max().item() < 2e-5 and float(density) == 1.0


@needs_triton
def test_method_takes_the_kernel_and_says_so(monkeypatch):
    """The whole method in the engine: the kernel path's logits equal the masked path's; stats name the
    path of every layer; slash_cover token is refused by the kernel path, visibly."""
    from test_methods_common import make, tiny_model

    from runners.engine import Engine

    model = tiny_model(3).to(DEV)       # the kernel runs where the model is (the interpreter on the CPU)
    ids = torch.randint(0, 128, (1, 40), generator=torch.Generator().manual_seed(0)).to(DEV)
    small = {"last_q": 8, "block_size": 8, "init_columns": 2, "local_slashes": 3, "min_vertical": 2, "min_slash": 3}

    def prefill(backend, **cfg):
        monkeypatch.setenv("HARNESS_KERNELS", backend)
        method, _ = make({"name": "minference", "patterns": "mix:vertical_slash:4:6,a_shape:2:8,block_sparse:2,"
                          "vertical_slash:3:4", "dense_layers": 1, **small, **cfg}, model)
        eng = Engine(model, method)
        eng.reset(1, 40)
        eng.prefill(ids[:, :24])
        logits = eng.prefill(ids[:, 24:])                  # a second step: queries 24..39 over 40 keys
        return logits, method.stats()

    ref, ref_stats = prefill("torch")
    got, stats = prefill("triton")
    assert (got - ref).abs().max().item() < 1e-4
    assert stats["prefill_path"] == {M.DENSE_PATH: 1, M.KERNEL_PATH: 2}
    assert ref_stats["prefill_path"] == {M.DENSE_PATH: 1, "torch masked SDPA (reference backend)": 2}
    assert stats["prefill_density"] == pytest.approx(ref_stats["prefill_density"], abs=1e-6)
    _, token = prefill("triton", slash_cover="token")
    assert token["prefill_path"] == {M.DENSE_PATH: 1, "torch masked SDPA (slash_cover token: no kernel)": 2}


def two_stage_case(B=2, N=171, start=21, bs=16, D=32, device=DEV):
    """Query blocks with several unmasked interior pieces AND partial / diagonal / windowed pieces: nearest
    diagonals plus far ones and columns, an a_shape head (full sink blocks unmasked, its window masked),
    dense, block_sparse; a chunk starting mid-block, a partial last block."""
    heads = [P.Pattern("vertical_slash", 3, 53), P.Pattern("a_shape", 32, 40), DENSE, P.Pattern("block_sparse", 5)]
    q, k, v = qkv(B, 4, 2, N, start, D, seed=11, device=device)
    offs = torch.cat([torch.arange(50), torch.tensor([90, 91, 130])])[None].expand(B, -1).to(device)
    cols = torch.tensor([[0, 1, 100]] * B, device=device)
    pos = torch.arange(start, N, device=device)
    index = [(cols, offs), None, None, P.block_sparse_index(q[:, 3], k[:, 1], pos, 5, consts(bs))]
    return q, k, v, heads, index, KM.build_index(heads, index, start, N - start, N, B, bs, q.device)


def test_unmasked_pieces_come_first():
    _, _, _, heads, index, idx = two_stage_case(device="cpu")
    check_lists(heads, index, idx, 21, 171, consts(16))
    masked = idx.block_count - idx.block_free
    assert (idx.block_free >= 3).any() and (masked >= 2).any()
    assert (idx.block_free[:, 1] >= 2).any() and (masked[:, 1] >= 1).all()       # a_shape: sinks free, window not


@needs_triton
@pytest.mark.parametrize("config", [None, {"pair": True}, {"num_warps": 4, "num_stages": 1, "pair": False}])
def test_two_stage_kernel_counts_the_mask(config, monkeypatch):
    """The unmasked stage (one or two pieces per tile) and the masked one give the reference's output, and
    COUNT (closed form on the unmasked stage) the mask's pairs per query block; config= overrides the launch."""
    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    q, k, v, _, _, idx = two_stage_case()
    got, pairs = KM.mixed_sparse_attention(q, k, v, idx, SCALE, count=True, config=config)
    want, want_pairs = KM.mixed_sparse_attention_ref(q, k, v, idx, SCALE, count=True)
    assert (got - want).abs().max().item() < 2e-5
    assert torch.equal(pairs.cpu(), want_pairs.cpu())
    with pytest.raises(ValueError, match="config keys"):
        KM.mixed_sparse_attention(q, k, v, idx, SCALE, config={"warps": 4})


# --- GPU: the Llama-3-8B shape --------------------------------------------------------------------------------

def masked_reference(q, k, v, heads, index, c, chunk=1024):
    """minference_patterns.sparse_prefill's attention from a given index (both paths must read the same
    estimate: a near-tie at a top-k cut could go either way between two bf16 GEMM layouts)."""
    B, Hq, T, D = q.shape
    g, N = Hq // k.shape[1], k.shape[2]
    kr, vr = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    out, kept = torch.empty_like(q), 0
    for i0 in range(0, T, chunk):
        rows = torch.arange(i0, min(T, i0 + chunk), device=q.device)
        mask = torch.stack([P.rows_mask(p, index[h], rows, N, B, c) for h, p in enumerate(heads)], 1)
        kept += int(mask.sum())
        out[:, :, i0:i0 + chunk] = torch.nn.functional.scaled_dot_product_attention(
            q[:, :, i0:i0 + chunk], kr, vr, attn_mask=mask, scale=SCALE)
    return out.transpose(1, 2).reshape(B, T, Hq * D), kept


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("pattern", ["vertical_slash", "mixed"])
@pytest.mark.parametrize("config", [None, {"pair": True}], ids=["default", "pair"])
def test_kernel_llama3_shape_bf16(pattern, config):
    N, HQ, HKV, D = 8192, 32, 8, 128
    c = P.Consts()
    q, k, v = qkv(1, HQ, HKV, N, 0, D, seed=3, dtype=torch.bfloat16)
    mix = [P.Pattern("vertical_slash", 1000, 6096), P.Pattern("vertical_slash", 100, 800),
           P.Pattern("a_shape", 128, 1024), P.Pattern("block_sparse", 16)]
    heads = [P.Pattern(*P.REFERENCE_DEFAULT)] * HQ if pattern == "vertical_slash" else [mix[h % 4] for h in range(HQ)]
    index, idx = lists(heads, q, k, 0, c)
    assert (idx.block_free > 0).any()                                  # the unmasked stage runs
    got, pairs = KM.mixed_sparse_attention(q, k, v, idx, SCALE, count=True, config=config)
    want, kept = masked_reference(q, k, v, heads, index, c)
    assert torch.isfinite(got).all()
    err = ((got.float() - want.float()).norm() / want.float().norm()).item()
    assert err < 1e-2, err
    assert int(pairs.sum()) == kept


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("q_start", [0, 1000])
def test_banded_index_llama3_shape_bf16(q_start):
    """BigBird's lists (banded_index: sinks + window pieces, dense rows, the blocks' random columns outside the
    window) on the kernel against the masked reference at the Llama-3-8B shape."""
    N, HQ, HKV, D, bs, sink, window, budget = 4096, 32, 8, 128, 64, 64, 480, 1024
    q, k, v = qkv(1, HQ, HKV, N, q_start, D, seed=4, dtype=torch.bfloat16)
    Q = N // bs - q_start // bs
    g = torch.Generator(device=DEV).manual_seed(0)
    cols = sink + torch.arange(480, device=DEV) * 7 + torch.randint(0, 7, (HQ, Q, 480), device=DEV, generator=g)
    live = torch.full((Q,), 480, device=DEV)
    idx = KM.banded_index(q_start, N - q_start, N, 1, bs, sink, window, budget, cols, live, q.device)
    got = KM.mixed_sparse_attention(q, k, v, idx, SCALE)
    want = KM.mixed_sparse_attention_ref(q, k, v, idx, SCALE)
    err = ((got.float() - want.float()).norm() / want.float().norm()).item()
    assert err < 1e-2, err


def test_layer_index_batches_heads_to_the_same_index():
    """minference_patterns.layer_index (equal-sized vertical-slash heads estimated as one batch, per_call at a
    time) gives each head what head_index gives it alone; other kinds are estimated alone."""
    c = consts(8)
    heads = [VS, VS, AS, P.Pattern("vertical_slash", 3, 4), VS, BSP, VS, P.Pattern("vertical_slash", 3, 4)]
    q, k, _ = qkv(2, 8, 2, 70, 10, 16, seed=11, device="cpu")
    pos = torch.arange(10, 70)
    got = P.layer_index(heads, q, k, pos, c, SCALE, per_call=3)
    for h, p in enumerate(heads):
        want = P.head_index(p, q[:, h], k[:, h // 4], pos, c, SCALE)
        if want is None:
            assert got[h] is None
        elif isinstance(want, tuple):
            assert all(torch.equal(a, b) for a, b in zip(got[h], want))
        else:
            assert torch.equal(got[h], want)


def test_build_index_in_parts_equals_one_batch(monkeypatch):
    """Equal-pattern vertical-slash heads are listed LIST_ENTRIES at a time: one head a call gives the same lists."""
    c = consts(8)
    heads = [VS, AS, VS, VS, P.Pattern("vertical_slash", 3, 4), DENSE, VS, BSP]
    q, k, _ = qkv(2, 8, 4, 50, 7, 16, seed=12, device="cpu")
    index, whole = lists(heads, q, k, 7, c)
    monkeypatch.setattr(KM, "LIST_ENTRIES", 1)
    parts = KM.build_index(heads, index, 7, q.shape[2], k.shape[2], 2, c.block, q.device)
    for name in ("block_start", "block_end", "block_count", "block_free", "column_index", "column_count"):
        assert torch.equal(getattr(whole, name), getattr(parts, name)), name
    check_lists(heads, index, parts, 7, 50, c)
