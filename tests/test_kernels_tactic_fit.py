"""Tactic's fit kernels (kernels/tactic_fit.py: the sampled tokens' positions, and Algorithm 1's budget
from their scores, one program per query head) against their references. The budget kernel against its reference (Tactic's former torch path): the same K per row, the
same shift, the same estimated total within fp32 rounding, on random rows with planted cases: an exact
set heavy enough for K = 0, targets never reached (K = n), a curve crossing zero (b < 0: the clipped
and the literal tail differ), a rising fit (flat, or as fitted with the literal tail), coinciding
windows, no windows at all (the list fits in its exact head), invalid exact-set slots, several tiles
and the list head outside registers. K may differ only where the reference's mass at a bisection
midpoint is within fp32 rounding of the target (the sums' order differs): `allowed` replays the
bisection and accepts either side of such a tie. Interpreter on the CPU; a Llama-3-8B-like shape
with `-m gpu`."""
from __future__ import annotations

import pytest
import torch
from test_methods_common import one_thread  # noqa: F401  (autouse: tiny tensors, one thread)
from triton_env import DEV, needs_triton

from kernels import _common
from kernels import tactic_fit as TF

TOL = 1e-5   # a tie: |mass - target| within this fraction of the total


def windows(n, nh, w, lo=0.02, hi=0.5):
    """The two fit windows' means of 1/x, as Tactic's `_exact_set` places them."""
    w = min(w, n - nh)
    starts = [min(max(int(f * n) - w // 2, nh), n - w) for f in (lo, hi)]
    return [sum(1.0 / (r + 1) for r in range(s, s + w)) / w for s in starts], w


def case(seed, B, H, E, nh, w, n, fit=True, coincide=False):
    """Raw scores [B, H, E + nh (+ 2w)], e_valid [B, E], u, w; the first rows planted (see above)."""
    g = torch.Generator().manual_seed(seed)
    u, w = windows(n, nh, w) if fit else (None, 0)
    if coincide:
        u = [u[0], u[0]]
    M = E + nh + 2 * w
    s = torch.randn(B, H, M, generator=g) * 2
    s[0, 0, :E] += 40                              # the exact set holds nearly all the mass: K = 0
    if fit:
        s[0, 1, E + nh + w:] -= 30                 # far window ~0: b < 0, the curve crosses zero
        s[-1, -1, E + nh + w:] += 3                # far window heavier: a rising fit
    e_valid = torch.rand(B, E, generator=g) < 0.7
    e_valid[:, 0] = True                           # the current token
    return s, e_valid, u, w


def allowed(mass_at, tgt, total, n, b, h):
    """Every K the reference's bisection can end on for row (b, h) when each midpoint within TOL of
    the target may go either way."""
    def m(k):
        return float(mass_at(torch.full(tgt.shape, k, dtype=torch.long))[b, h])
    t, tol, outs = float(tgt[b, h]), TOL * abs(float(total[b, h])), set()

    def go(lo, hi, steps):
        if not steps:
            outs.add(min(lo, hi))
            return
        mid = (lo + hi) // 2
        d = m(mid) - t
        if d >= -tol:
            go(lo, mid, steps - 1)
        if d < tol:
            go(mid + 1, hi, steps - 1)
    go(0, n, TF.bisection_steps(n))
    return outs


def check(s, e_valid, harm, n, nh, w, u, target, tail, rising, **blocks):
    scale = 0.35
    args = (e_valid, scale, harm, n, nh, w, u)
    mass_at, total, shift = TF.fit_masses(s.clone(), *args, tail, rising)
    want = TF.min_count(mass_at, target * total, n)
    k, tot, sh = TF.fit_budget(s.to(DEV), e_valid.to(DEV), scale, harm.to(DEV), n, nh, w, u, target, tail, rising,
                               **blocks)
    k, tot, sh = k.cpu(), tot.cpu(), sh.cpu()
    assert k.dtype == torch.long and k.shape == want.shape
    assert torch.equal(sh, shift)                  # a max of the same products
    assert torch.allclose(tot, total, rtol=TOL, atol=0)
    for b, h in (k != want).nonzero().tolist():   # a tie at some midpoint, or a bug
        assert {int(k[b, h]), int(want[b, h])} <= allowed(mass_at, target * total, total, n, b, h), (b, h)
    return want


CURVES = [("clip", "flat"), ("literal", "flat"), ("literal", "fit")]


@needs_triton
@pytest.mark.parametrize("tail,rising,blocks", [(*c, {}) for c in CURVES]
                         + [("clip", "flat", {"block": 8, "block_head": 4})])   # head in registers, or looped
def test_kernel_matches_reference(monkeypatch, tail, rising, blocks):
    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    n, nh = 150, 12
    harm = TF.harmonic(n + 7, "cpu")
    s, e_valid, u, w = case(1, 2, 2, 5, nh, 4, n)
    seen = set()
    for target in (0.5, 0.9, 1.0, 1.3):     # 1.3: never reached (K = n)
        want = check(s, e_valid, harm, n, nh, w, u, target, tail, rising, **blocks)
        seen |= set(want.view(-1).tolist())
    assert 0 in seen and n in seen and len(seen) > 3     # the planted cases, and budgets in between


@needs_triton
@pytest.mark.parametrize("kind", ["no_windows", "coinciding", "no_head"])
def test_kernel_without_windows_and_edge_geometry(monkeypatch, kind):
    """The list within its exact head (u = None: no tail), coinciding windows (a flat tail), N = 0."""
    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    if kind == "no_windows":
        n, nh, fit, coincide = 9, 9, False, False
    elif kind == "coinciding":
        n, nh, fit, coincide = 14, 10, True, True
    else:
        n, nh, fit, coincide = 200, 0, True, False
    harm = TF.harmonic(n + 1, "cpu")
    s, e_valid, u, w = case(2, 2, 2, 3, nh, 3, n, fit=fit, coincide=coincide)
    for tail, rising in CURVES[:2]:
        for target in (0.3, 0.9, 1.0):
            check(s, e_valid, harm, n, nh, w, u, target, tail, rising)


@needs_triton
@pytest.mark.parametrize("G", [2, 1])    # rows per query head (H = 2 Hkv) or per KV head
@pytest.mark.parametrize("blocks", [{}, {"block_j": 8, "block_e": 4}])
def test_sample_positions_match_the_reference(monkeypatch, G, blocks):
    """The sampled tokens' positions (one launch) as the reference's cat of E's masked positions and
    list_positions: the same int64 [B, H, Emax + M], on rankings with ties, empty clusters (size 0,
    ranked last) and one large cluster; ranks 0, n - 1 and in between; strided cstart."""
    from test_kernels_tactic_select import index_for, scores_for, sizes_mixed

    from kernels import tactic_select as TS

    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    B, Hkv, C = 2, 2, 40
    csize, cstart, order, e_pos, e_valid, n = index_for(B, Hkv, C, C + 3, sizes_mixed(C), seed=G)
    scores = scores_for(B, Hkv * G, C, csize[..., :C].repeat_interleave(G, 1), G + 7, ties=True)
    r = TS.rank(scores, csize[..., :C])
    g = torch.Generator().manual_seed(G)
    samp = torch.cat([torch.arange(3), torch.randint(0, n, (20,), generator=g), torch.tensor([n - 1])])
    args = [samp.to(DEV), TS.Ranking(*(x.to(DEV) for x in r)), cstart.to(DEV), order.to(DEV), e_pos.to(DEV),
            e_valid.to(DEV)]
    got = TF.sample_positions(*args, **blocks).cpu()
    want = TF.sample_positions_ref(samp, r, cstart, order, e_pos, e_valid)
    assert got.dtype == torch.long and torch.equal(got, want)


@needs_triton
def test_tactic_fit_on_the_kernel_selects_as_the_torch_path(monkeypatch):
    """Tactic's fit mode driven twice on random tensors, the budget on the reference and on the kernel
    (every other op on torch): the same sets and counts per row in every layer and step."""
    if not _common.interpreter_active():      # the Driver's tensors live on the CPU
        pytest.skip("needs Triton's interpreter (TRITON_INTERPRET=1 before triton's import)")
    from test_methods_common import Driver, make, rope_for
    from tiny_models import tiny

    model = tiny("llama")
    rope = rope_for(model)
    monkeypatch.setenv("HARNESS_KERNELS", "torch")
    runs, calls = [], []
    for path in ("torch", "triton"):
        monkeypatch.setattr(TF, "backend_for", lambda t, p=path: calls.append(p) or p)
        method, info = make({"name": "tactic", "target": 0.8, "cluster_size": 4, "exact_head": 5, "fit_window": 3,
                             "sink": 1, "window": 2}, model)
        d = Driver(method, info, rope, max_len=50, batch=1)
        d.step(40, "prefill")
        steps = []
        for _ in range(1):   # the interpreter's one program per head and layer: seconds a step
            d.step(1, "decode")
            steps.append({k: (i.clone(), c.clone()) for k, (i, c) in method.selected.items()})
        runs.append(steps)
    assert "triton" in calls and "torch" in calls    # the budget went through both paths
    for s1, s2 in zip(*runs):
        assert s1.keys() == s2.keys() and s1
        for layer in s1:
            assert torch.equal(s1[layer][1], s2[layer][1]) and torch.equal(s1[layer][0], s2[layer][0])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("tail,rising", CURVES)
def test_kernel_llama8b_shape(monkeypatch, tail, rising):
    """B = 2, Hq = 32, Tactic's defaults at 32K (N = 128, windows of 16, E = 64 slots): K as the
    reference's (run on the CPU) up to ties."""
    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    n, nh = 32768, 128
    harm = TF.harmonic(n + 64, "cpu")
    for seed in range(3):
        s, e_valid, u, w = case(seed, 2, 32, 64, nh, 16, n)
        for target in (0.5, 0.9):
            check(s, e_valid, harm, n, nh, w, u, target, tail, rising)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_sample_positions_llama8b_shape_128k(monkeypatch):
    """B = 1, Hq = 32 on Hkv = 8, 4096 clusters of ~32 tokens (some empty), Tactic's 160 sampled ranks."""
    from test_kernels_tactic_select import llama8b_index, scores_for

    from kernels import tactic_select as TS

    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    C, Hkv, G = 4096, 8, 4
    csize, cstart, order, e_pos, e_valid, n = llama8b_index(C, Hkv)
    scores = scores_for(1, Hkv * G, C, csize[..., :C].repeat_interleave(G, 1), 1, ties=False)
    r = TS.rank(scores, csize[..., :C])
    samp = torch.cat([torch.arange(128), torch.arange(n // 50, n // 50 + 16), torch.arange(n // 2, n // 2 + 16)])
    args = [samp, r, cstart, order, e_pos, e_valid]
    got = TF.sample_positions(samp.cuda(), TS.Ranking(*(x.cuda() for x in r)), *(x.cuda() for x in args[2:]))
    assert torch.equal(got.cpu(), TF.sample_positions_ref(*args))
