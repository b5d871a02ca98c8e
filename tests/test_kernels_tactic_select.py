"""Tactic's fused selection kernel (kernels/tactic_select.py) against its reference (the sort-based
path Tactic used before): per row the same token SET and the same count, on random cluster indexes
with planted score ties (+-0.0 included), empty clusters (-inf, size 0), clusters of size 1 and of
hundreds, K = 0, K = the whole list, K inside a cluster, batch 2, rows per query head and per KV
head, several tiles of clusters and of output slots; entries past the count stay in range. The
reference itself against plain Python (stable descending sort, unpack, first K). Interpreter on the
CPU; Llama-3.1-8B's shape at 128K (4096 clusters) with `-m gpu`."""
from __future__ import annotations

import pytest
import torch
from triton_env import DEV, needs_triton

from kernels import _common
from kernels import tactic_select as TS


def index_for(B, Hkv, C, cmax, sizes_of, seed, sink=2, window=5):
    """A ClusterIndex-like layout: csize/cstart [B, Hkv, cmax] (clusters past C unused), order
    [B, Hkv, cap] a permutation of [sink, sink + n) grouped by cluster; E = sinks + [ce, cap)."""
    g = torch.Generator().manual_seed(seed)
    sizes = sizes_of(g).view(1, 1, C).expand(B, Hkv, C).clone()
    for b in range(B):                        # each head its own partition of the same n tokens
        for h in range(Hkv):
            sizes[b, h] = sizes[b, h][torch.randperm(C, generator=g)]
    n = int(sizes[0, 0].sum())
    cap = sink + n + window
    csize = torch.zeros(B, Hkv, cmax, dtype=torch.int32)
    cstart = torch.zeros(B, Hkv, cmax, dtype=torch.int32)
    csize[..., :C] = sizes.int()
    cstart[..., :C] = (sizes.cumsum(-1) - sizes).int()
    order = torch.zeros(B, Hkv, cap, dtype=torch.int32)
    for b in range(B):
        for h in range(Hkv):
            order[b, h, :n] = (torch.randperm(n, generator=g) + sink).int()
    ce = sink + n
    e_max = sink + cap - ce
    j = torch.arange(e_max)
    e_pos = torch.where(j < sink, j, j - sink + ce)
    lengths = torch.tensor([ce + 1, cap][:B])
    e_valid = e_pos.view(1, -1) < lengths.view(-1, 1)
    return csize, cstart, order, e_pos, e_valid, n


def scores_for(B, H, C, csize_rows, seed, ties):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(B, H, C, generator=g)
    if ties:
        s = (s * 2).round() / 2             # few distinct values: many ties, +0.0 among them
        s[..., ::7] = -0.0                  # ranked equal to +0.0 by the sort
    return s.masked_fill(csize_rows == 0, float("-inf"))


def sizes_mixed(C):
    def f(g):
        s = torch.randint(1, 9, (C,), generator=g)
        s[::5] = 0                          # empty clusters
        s[1::6] = 1
        s[2] = 150                          # one large cluster (several output tiles)
        return s
    return f


def case(B, Hkv, G, C, seed, ties, ks):
    cmax = C + 3
    csize, cstart, order, e_pos, e_valid, n = index_for(B, Hkv, C, cmax, sizes_mixed(C), seed)
    H = Hkv * G
    rows_csize = csize[..., :C].repeat_interleave(G, 1)
    scores = scores_for(B, H, C, rows_csize, seed + 1, ties)
    k_row = torch.tensor(ks(n, H, B), dtype=torch.long).view(B, H)
    return scores, csize[..., :C], cstart, order, k_row, e_pos, e_valid, n


def ks_mixed(n, H, B):
    picks = [0, n, 1, n - 1, 7, n // 2, 33, 100, 151, 5]
    return [picks[(i * 3 + 1) % len(picks)] if i else 0 for i in range(B * H)]


def check(got, want, cap):
    (idx, cnt), (ridx, rcnt) = got, want
    assert torch.equal(cnt.cpu(), rcnt.cpu())
    assert idx.shape == ridx.shape
    idx, ridx = idx.cpu(), ridx.cpu()
    B, H, _ = idx.shape
    for b in range(B):
        for h in range(H):
            c = int(cnt[b, h])
            assert torch.equal(idx[b, h, :c].sort().values, ridx[b, h, :c].sort().values), (b, h, c)
    assert int(idx.min()) >= 0 and int(idx.max()) < cap      # padding is an in-range position too


@needs_triton
@pytest.mark.parametrize("G", [3, 1])    # rows per query head (H = 3 Hkv) or per KV head (H = Hkv)
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("blocks", [(None, None), (16, 8)])
@pytest.mark.parametrize("nt", [None, 2, 16])   # the search's thresholds per step: 2 = the old bisection
def test_kernel_matches_reference(monkeypatch, G, ties, blocks, nt):
    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    B, Hkv, C = 2, 2, 50
    scores, csize, cstart, order, k_row, e_pos, e_valid, n = case(
        B, Hkv, G, C, seed=G * 10 + ties, ties=ties, ks=ks_mixed)
    kmax = n
    args = [t.to(DEV) for t in (scores, csize, cstart, order, k_row, e_pos, e_valid)]
    got = TS.select_cluster_tokens(*args, kmax, block_c=blocks[0], block_j=blocks[1], nt=nt)
    want = TS.select_cluster_tokens_ref(*args, kmax)
    check(got, want, order.shape[-1])


@needs_triton
@pytest.mark.parametrize("G", [3, 1])
@pytest.mark.parametrize("span", [8, 24])   # list slots per program: several programs write one row's list
def test_kernel_rows_split_over_programs_match_reference(monkeypatch, G, span):
    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    B, Hkv, C = 2, 2, 50
    scores, csize, cstart, order, k_row, e_pos, e_valid, n = case(B, Hkv, G, C, seed=G * 7 + 1, ties=True, ks=ks_mixed)
    args = [t.to(DEV) for t in (scores, csize, cstart, order, k_row, e_pos, e_valid)]
    got = TS.select_cluster_tokens(*args, n, block_c=16, block_j=8, span=span)
    check(got, TS.select_cluster_tokens_ref(*args, n), order.shape[-1])


@needs_triton
def test_kernel_small_kmax_and_expanded_k_row(monkeypatch):
    """topk's shape: kmax = budget below the list's length, one K per batch broadcast over rows."""
    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    scores, csize, cstart, order, _, e_pos, e_valid, _ = case(2, 2, 2, 40, seed=5, ties=True, ks=ks_mixed)
    kmax = 37
    k_row = torch.tensor([37, 12]).view(2, 1).expand(2, 4)
    args = [t.to(DEV) for t in (scores, csize, cstart, order, k_row, e_pos, e_valid)]
    got = TS.select_cluster_tokens(*args, kmax, block_c=16)
    want = TS.select_cluster_tokens_ref(*args, kmax)
    check(got, want, order.shape[-1])


@needs_triton
def test_kernel_csize_and_cstart_with_unlike_strides(monkeypatch):
    """csize a dense copy, cstart a slice of a wider buffer: moving a slice to CUDA makes it dense,
    so the kernel reads each with its own strides (on the H100 an equal-strides assert failed)."""
    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    scores, csize, cstart, order, k_row, e_pos, e_valid, n = case(2, 2, 2, 30, seed=3, ties=False, ks=ks_mixed)
    assert csize.stride() != csize.contiguous().stride()
    args = [t.to(DEV) for t in (scores, csize.contiguous(), cstart, order, k_row, e_pos, e_valid)]
    check(TS.select_cluster_tokens(*args, n), TS.select_cluster_tokens_ref(*args, n), order.shape[-1])


def test_reference_is_the_stable_sort_definition():
    """Plain Python: clusters by (score desc, id asc), unpacked in `order` order, first K, then E."""
    scores, csize, cstart, order, k_row, e_pos, e_valid, n = case(2, 2, 2, 30, seed=9, ties=True, ks=ks_mixed)
    idx, cnt = TS.select_cluster_tokens_ref(scores, csize, cstart, order, k_row, e_pos, e_valid, n)
    B, H, C = scores.shape
    for b in range(B):
        for h in range(H):
            kv = h // 2
            ids = sorted(range(C), key=lambda i: (-float(scores[b, h, i]), i))
            lst = [int(order[b, kv, int(cstart[b, kv, i]) + t]) for i in ids for t in range(int(csize[b, kv, i]))]
            want = lst[:int(k_row[b, h])] + e_pos[e_valid[b]].tolist()
            assert idx[b, h, :int(cnt[b, h])].tolist() == want


@pytest.mark.gpu
def llama8b_index(C: int, Hkv: int):
    """index_for at Llama-3-8B's 128K shape: C clusters of ~32 tokens (a geometric spread like k-means',
    every 97th empty), batch 1, 4 sinks and a 64-token window."""
    def sizes(g):
        s = torch.distributions.Geometric(probs=torch.tensor(1 / 32)).sample((C,)).long() + 1
        s[::97] = 0
        return s

    torch.manual_seed(0)
    return index_for(1, Hkv, C, C + 16, sizes, seed=0, sink=4, window=64)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("rows", ["query", "kv"])
def test_kernel_llama8b_shape_128k(monkeypatch, rows):
    """B = 1, Hq = 32 on Hkv = 8, 4096 clusters of ~32 tokens (k-means-like spread, some empty), topk
    budget 1024 and fit-like K up to the whole list; real fp32 scores (ties rare) and rounded ones."""
    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    C, Hkv = 4096, 8
    G = 4 if rows == "query" else 1
    csize, cstart, order, e_pos, e_valid, n = llama8b_index(C, Hkv)
    H = Hkv * G
    for ties in (False, True):
        scores = scores_for(1, H, C, csize[..., :C].repeat_interleave(G, 1), 1, ties)
        for kmax, k in ((1024, [1024 - 68] * H), (n, torch.randint(0, n + 1, (H,)).tolist())):
            k_row = torch.tensor(k, dtype=torch.long).view(1, H)
            args = [t.cuda() for t in (scores, csize[..., :C], cstart, order, k_row, e_pos, e_valid)]
            got = TS.select_cluster_tokens(*args, kmax)
            want = TS.select_cluster_tokens_ref(*args, kmax)
            check(got, want, order.shape[-1])


# --- the method on the kernel -----------------------------------------------------------------------

# the interpreter takes 3-10 s a case: the slower three run in `make test-long` (and CI), so that
# `make test` keeps one top-K case and the cluster oracle
TACTIC_CASES = [
    pytest.param({"mode": "topk", "budget": 20, "cluster_size": 4, "sink": 1, "window": 2}, marks=pytest.mark.long),
    {"mode": "topk", "budget": 16, "cluster_size": 3, "select": "kv_head", "sink": 2, "window": 3,
     "recluster_every": 5},
    pytest.param({"target": 0.7, "cluster_size": 4, "exact_head": 6, "fit_window": 3}, marks=pytest.mark.long),
    {"mode": "oracle_cluster", "target": 0.8, "cluster_size": 5, "select": "kv_head"},
    pytest.param({"target": 1.0, "cluster_size": 4}, marks=pytest.mark.long),
]


@needs_triton
@pytest.mark.parametrize("cfg", TACTIC_CASES)
def test_tactic_decode_on_the_kernel_equals_the_torch_path(monkeypatch, cfg):
    """Tactic driven on random tensors twice, the selection on its reference and on the kernel (every
    other op on torch, so the cluster scores are bitwise the same): the same sets and counts per row,
    outputs equal within fp32 rounding (the kernel lists a row's tokens in another order)."""
    if not _common.interpreter_active():      # the Driver's tensors live on the CPU
        pytest.skip("needs Triton's interpreter (TRITON_INTERPRET=1 before triton's import; not on CUDA "
                    "machines: tests/test_methods_gpu.py runs tactic on the CUDA kernels there)")
    from test_methods_common import Driver, make, one_thread, rope_for  # noqa: F401
    from tiny_models import tiny


    model = tiny("llama")
    rope = rope_for(model)
    monkeypatch.setenv("HARNESS_KERNELS", "torch")
    runs = []
    for path in ("torch", "triton"):
        monkeypatch.setattr(TS, "backend_for", lambda t, p=path: p)
        method, info = make({"name": "tactic", **cfg}, model)
        d = Driver(method, info, rope, max_len=70)
        d.step(25, "prefill")
        d.step(20, "prefill")
        steps = []
        for _ in range(8):
            method.correction_span(d.seen)
            _, outs = d.step(1, "decode")
            steps.append((outs, dict(method.selected)))
        runs.append(steps)
    for (o1, s1), (o2, s2) in zip(*runs):
        assert s1.keys() == s2.keys() and s1
        for layer in s1:
            (i1, c1), (i2, c2) = s1[layer], s2[layer]
            assert torch.equal(c1, c2) and i1.shape == i2.shape
            n = c1.long().unsqueeze(-1)
            j = torch.arange(i1.shape[-1])
            big = torch.iinfo(torch.int32).max                  # past the count: sorted to the end
            assert torch.equal(torch.where(j < n, i1, big).sort(-1).values, torch.where(j < n, i2, big).sort(-1).values)
        assert max((a - b).abs().max().item() for a, b in zip(o1, o2)) <= 1e-5
