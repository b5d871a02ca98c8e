"""Tactic's Algorithm 1 budget from the exactly scored tokens, as one Triton kernel (issue 33).

Contract (`fit_budget`). Per query head (batch b, head h) the raw scores s = q.k (fp32, unscaled) of
M = E + n_head (+ 2w) tokens: the exact set's E slots (valid ones per `e_valid`), the first n_head
tokens of the row's cluster-sorted list, then (where the list is longer than its exact head: u given)
two fit windows of w list tokens each. With z = s * scale (invalid E slots -inf), shift = max z and
e = exp(z - shift):
  * mass_at(k) = sum of e over E + over the list head's first min(k, n_head) tokens + the fitted
    tail of list ranks n_head+1..k: y = a/x + b through the two window means (`fit_curve`), summed in
    closed form with the harmonic numbers (`tail_mass`; clipped at the curve's zero, or literal);
  * total = mass_at(n_tok) (the literal tail uncut), K = `min_count`'s bisection for target * total.
Output: K int64 [B, Hq] (list tokens, in [0, n_tok]), (total, shift) fp32 [B, Hq] for diagnostics.

The reference (`fit_budget_ref`) is Tactic's `_fit` as it was: ~15-20 torch ops per bisection step
(17 steps at 32K), ~500 ops per layer in all, ~2 us each on a GPU even in a CUDA graph. The kernel is
one program per row doing the same arithmetic in the same order: the same integer bisection, the
same fp32 formulas (IEEE divisions, no fused multiply-adds). Only the sums differ in their order
(a tree in the kernel, torch's own order in the reference), so a mass within a few ulp of the target
may fall on the other side: K then differs at such a tie only (tests/test_kernels_tactic_fit.py).

`sample_positions` (a second launch, before the scores) writes those tokens' gather index: E's valid
positions then the sorted list's tokens at the sampled ranks, exactly as its reference (where + cat +
kernels/tactic_select.py's `list_positions`, ~15 torch ops) does.
"""
from __future__ import annotations

import torch

from ._common import HAVE_TRITON, backend_for, kernel_for, next_pow2, tl, triton
from .tactic_select import Ranking, list_positions

# --- the reference: the curve fit and the bisection of Algorithm 1 (moved from methods/) -----------

def fit_curve(u1: float, mu1: torch.Tensor, u2: float, mu2: torch.Tensor,
              rising: str = "flat") -> tuple[torch.Tensor, torch.Tensor]:
    """(a, b) of y = a/x + b through two window means: mu_j = mean of exp-scores over window j of the
    list, u_j = mean of 1/x over the same ranks (x = rank + 1), so mu_j = a*u_j + b holds exactly for
    the curve. Coinciding windows give a flat tail a = 0, b = mean of the two. A rising fit (a < 0: the
    far window is heavier, noise of an unsorted cluster interior) does too with rising="flat" (the
    config's `rising_fit`, default; the paper leaves the case open); rising="fit" keeps it as fitted."""
    du = u1 - u2
    if du <= 0:
        return torch.zeros_like(mu1), (mu1 + mu2) / 2
    a = (mu1 - mu2) / du
    if rising == "fit":
        return a, mu1 - a * u1
    flat = a <= 0
    b = torch.where(flat, (mu1 + mu2) / 2, mu1 - a * u1)
    return torch.where(flat, torch.zeros_like(a), a), b


def tail_mass(a: torch.Tensor, b: torch.Tensor, lo: int, hi: torch.Tensor, harm: torch.Tensor,
              tail: str = "clip", rising: bool = True) -> torch.Tensor:
    """Fitted mass of list ranks x = lo+1 .. hi (1-based; hi int64 >= lo, same shape as a), in closed form
    with harmonic numbers harm[x] = 1 + 1/2 + .. + 1/x. Where b < 0 the curve reaches 0 at x0 = a / -b.
    tail="clip": sum of max(a/x + b, 0), nothing past x0. tail="literal": Algorithm 1 as written, sum of
    a/x + b as is, negative past x0; its running sum then rises to x0 and falls after, so with `rising`
    hi is cut at x0 (the first k reaching a target lies on the rising part: the bisection's mass_at)
    and without it (the denominator, all n ranks) the whole sum is taken."""
    stop = torch.where(b < 0, torch.floor(a / (-b).clamp_min(1e-30)), torch.full_like(a, float(harm.numel())))
    cut = tail == "clip" or rising
    top = (torch.minimum(hi, stop.clamp(max=harm.numel() - 1).long()) if cut else hi).clamp(min=lo)
    return a * (harm[top] - harm[lo]).to(a.dtype) + b * (top - lo).to(a.dtype)


def min_count(mass_at, target: torch.Tensor, n: int) -> torch.Tensor:
    """Smallest K in [0, n] with mass_at(K) >= target (mass_at non-decreasing; K = n if none), by a
    fixed number of bisection steps (static: no host sync). target [..] -> int64 [..]."""
    lo = torch.zeros(target.shape, dtype=torch.long, device=target.device)
    hi = torch.full_like(lo, n)
    for _ in range(bisection_steps(n)):
        mid = (lo + hi) // 2
        ok = mass_at(mid) >= target
        hi = torch.where(ok, mid, hi)
        lo = torch.where(ok, lo, mid + 1)
    return torch.minimum(lo, hi)


def bisection_steps(n: int) -> int:
    return max(1, int(n).bit_length() + 1)


def harmonic(n: int, device) -> torch.Tensor:
    """harm[x] = sum_{t=1..x} 1/t for x = 0..n, fp32 (accumulated in fp64)."""
    t = torch.arange(n + 1, dtype=torch.float64)
    return torch.cat([torch.zeros(1, dtype=torch.float64), (1.0 / t[1:]).cumsum(0)]).to(device, torch.float32)


def fit_masses(s, e_valid, scale, harm, n_tok, n_head, w, u, tail="clip", rising_fit="flat"):
    """(mass_at, total, shift) of the contract: mass_at(k int64 [B, Hq]) -> fp32 [B, Hq], as the bisection
    reads it. s fp32 [B, Hq, M]; e_valid bool [B, E]; harm fp32 [>= n_tok + 1]; u = (u1, u2) the
    windows' means of 1/x (host floats), or None where there are no windows."""
    B, _, M = s.shape
    E = M - n_head - (2 * w if u is not None else 0)
    z = s * scale
    z[..., :E] = z[..., :E].masked_fill(~e_valid.view(B, 1, E), float("-inf"))
    shift = z.amax(-1, keepdim=True)                     # the current token is in E: finite
    e = torch.exp(z - shift)
    z_e = e[..., :E].sum(-1)
    nh = n_head
    head_cum = torch.cat([torch.zeros_like(z_e).unsqueeze(-1), e[..., E:E + nh].cumsum(-1)], -1)
    if u is not None:
        a, b = fit_curve(u[0], e[..., E + nh:E + nh + w].mean(-1), u[1], e[..., E + nh + w:].mean(-1),
                         rising=rising_fit)

    def mass_at(k, rising=True):
        h = head_cum.gather(-1, k.clamp(max=nh).unsqueeze(-1)).squeeze(-1)
        return z_e + h + (tail_mass(a, b, nh, k, harm, tail, rising) if u is not None else 0.0)

    total = mass_at(torch.full_like(z_e, n_tok, dtype=torch.long), rising=False)
    return mass_at, total, shift.squeeze(-1)


def fit_budget_ref(s, e_valid, scale, harm, n_tok, n_head, w, u, target, tail="clip", rising_fit="flat"):
    """The contract above in torch ops (arguments as in `fit_masses`)."""
    mass_at, total, shift = fit_masses(s, e_valid, scale, harm, n_tok, n_head, w, u, tail, rising_fit)
    return min_count(mass_at, target * total, n_tok), total, shift


# --- the kernel ---------------------------------------------------------------------------------------

if HAVE_TRITON:

    @triton.jit
    def _sum_exp(row, c0, c1, scale, shift, BLOCK: tl.constexpr):
        """sum of exp(s * scale - shift) over columns [c0, c1) of one row."""
        acc = tl.zeros((BLOCK,), tl.float32)
        for i0 in range(c0, c1, BLOCK):
            cols = i0 + tl.arange(0, BLOCK)
            m = cols < c1
            z = tl.load(row + cols, mask=m, other=0.0) * scale
            acc += tl.where(m, tl.exp(z - shift), 0.0)
        return tl.sum(acc, 0)

    @triton.jit
    def _tail(a, b, k, nh, stop, h_lo, Harm, CUT: tl.constexpr):
        """tail_mass(a, b, nh, k): the fitted mass of list ranks nh+1..k (cut at the curve's zero)."""
        top = k
        if CUT:
            top = tl.minimum(top, stop)
        top = tl.maximum(top, nh)
        return a * (tl.load(Harm + top) - h_lo) + b * (top - nh).to(tl.float32)

    @triton.jit
    def _fit_kernel(S, Ev, Harm, Kout, Tot, Sh,
                    H, E, NH, W, NTOK, NHARM, STEPS,
                    scale, u1, du, w_f, target,
                    s_sb, s_sh, s_eb,
                    BLOCK: tl.constexpr, BLOCK_H: tl.constexpr, HEAD_REG: tl.constexpr,
                    HAS_FIT: tl.constexpr, CURVE: tl.constexpr, CLIP: tl.constexpr):
        # CURVE: 0 coinciding windows (du <= 0: flat), 1 a rising fit made flat, 2 as fitted
        pid = tl.program_id(0)
        b = (pid // H).to(tl.int64)
        h = pid % H
        row = S + b * s_sb + h * s_sh
        ev = Ev + b * s_eb
        M = E + NH + 2 * W
        cols0 = tl.arange(0, BLOCK)
        # the shift: max of z over the valid E slots and every sampled list token
        mx = tl.full((BLOCK,), float("-inf"), tl.float32)
        for i0 in range(0, M, BLOCK):
            cols = i0 + cols0
            m = cols < M
            z = tl.load(row + cols, mask=m, other=0.0) * scale
            valid = tl.load(ev + cols, mask=m & (cols < E), other=1) != 0
            mx = tl.maximum(mx, tl.where(m & valid, z, float("-inf")))
        shift = tl.max(mx, 0)
        # the exact set's mass
        acc = tl.zeros((BLOCK,), tl.float32)
        for i0 in range(0, E, BLOCK):
            cols = i0 + cols0
            m = cols < E
            z = tl.load(row + cols, mask=m, other=0.0) * scale
            valid = tl.load(ev + cols, mask=m, other=0) != 0
            acc += tl.where(m & valid, tl.exp(z - shift), 0.0)
        z_e = tl.sum(acc, 0)
        hh = tl.arange(0, BLOCK_H)
        if HEAD_REG:   # the whole list head in registers (NH <= BLOCK_H): read once, summed per step
            zh = tl.load(row + E + hh, mask=hh < NH, other=0.0) * scale
            eh = tl.where(hh < NH, tl.exp(zh - shift), 0.0)
            head_all = tl.sum(eh, 0)
        else:
            head_all = _sum_exp(row, E, E + NH, scale, shift, BLOCK_H)
        a = tl.zeros((), tl.float32)
        bb = tl.zeros((), tl.float32)
        stop = tl.zeros((), tl.int64)
        h_lo = tl.zeros((), tl.float32)
        if HAS_FIT:
            mu1 = tl.math.div_rn(_sum_exp(row, E + NH, E + NH + W, scale, shift, BLOCK), w_f)
            mu2 = tl.math.div_rn(_sum_exp(row, E + NH + W, M, scale, shift, BLOCK), w_f)
            if CURVE == 0:
                bb = (mu1 + mu2) * 0.5
            else:
                a = tl.math.div_rn(mu1 - mu2, du)
                if CURVE == 1:
                    flat = a <= 0
                    bb = tl.where(flat, (mu1 + mu2) * 0.5, mu1 - a * u1)
                    a = tl.where(flat, 0.0, a)
                else:
                    bb = mu1 - a * u1
            x0 = tl.floor(tl.math.div_rn(a, tl.maximum(-bb, 1e-30)))
            top_f = (tl.zeros((), tl.int64) + NHARM - 1).to(tl.float32)
            x0 = tl.where(bb < 0, x0, top_f)
            # clamped below too: a negative stop and -1 both end at nh after the max with nh
            stop = tl.maximum(tl.minimum(x0, top_f), -1.0).to(tl.int64)
            h_lo = tl.load(Harm + NH)
        nh = tl.zeros((), tl.int64) + NH        # (an int argument equal to 1 arrives as a constant)
        ntok = tl.zeros((), tl.int64) + NTOK
        # total = mass_at(n_tok), the literal tail uncut
        total = z_e + head_all
        if HAS_FIT:
            total = total + _tail(a, bb, ntok, nh, stop, h_lo, Harm, CLIP)
        tgt = target * total
        lo = tl.zeros((), tl.int64)
        hi = ntok
        for _ in range(STEPS):
            mid = (lo + hi) // 2
            kk = tl.minimum(mid, nh)
            if HEAD_REG:
                hs = tl.sum(tl.where(hh < kk, eh, 0.0), 0)
            else:
                hs = _sum_exp(row, E, E + kk.to(tl.int32), scale, shift, BLOCK_H)
            mass = z_e + hs
            if HAS_FIT:
                mass = mass + _tail(a, bb, mid, nh, stop, h_lo, Harm, True)
            ok = mass >= tgt
            hi = tl.where(ok, mid, hi)
            lo = tl.where(ok, lo, mid + 1)
        tl.store(Kout + pid, tl.minimum(lo, hi))
        tl.store(Tot + pid, total)
        tl.store(Sh + pid, shift)


def fit_budget(s, e_valid, scale, harm, n_tok, n_head, w, u, target, tail="clip", rising_fit="flat", *,
               block: int | None = None, block_head: int | None = None):
    """(K int64 [B, Hq], total fp32 [B, Hq], shift fp32 [B, Hq]): the module's contract. Triton on CUDA,
    the reference elsewhere. block / block_head: tile sizes over the row and over the list head
    (tests: several tiles, the head outside registers)."""
    if backend_for(s) == "torch":
        return fit_budget_ref(s, e_valid, scale, harm, n_tok, n_head, w, u, target, tail, rising_fit)
    B, H, M = s.shape
    w = w if u is not None else 0
    E = M - n_head - 2 * w
    assert s.dtype == torch.float32 and s.stride(-1) == 1 and harm.dtype == torch.float32
    assert harm.numel() > n_tok
    # bool -> bytes without a copy (a cast would add a launch per layer)
    ev = e_valid.contiguous().view(torch.uint8) if e_valid.dtype == torch.bool else e_valid.contiguous()
    k = torch.empty(B, H, device=s.device, dtype=torch.long)
    total = torch.empty(B, H, device=s.device, dtype=torch.float32)
    shift = torch.empty(B, H, device=s.device, dtype=torch.float32)
    du = (u[0] - u[1]) if u is not None else 0.0
    curve = 0 if du <= 0 else (2 if rising_fit == "fit" else 1)
    cuda = s.is_cuda
    bh = block_head or max(2, min(next_pow2(n_head), 1024))   # a longer head is re-read per step
    kernel_for(_fit_kernel, s)[(B * H,)](
        s, ev, harm, k, total, shift,
        H, E, n_head, w, n_tok, harm.numel(), bisection_steps(n_tok),
        float(scale), float(u[0]) if u is not None else 0.0, float(du), float(max(w, 1)), float(target),
        s.stride(0), s.stride(1), ev.stride(0),
        BLOCK=block or (256 if cuda else 64), BLOCK_H=bh, HEAD_REG=n_head <= bh,
        HAS_FIT=u is not None, CURVE=curve, CLIP=tail == "clip",
        num_warps=1, enable_fp_fusion=False)   # 1 warp: shuffle-only sums; a*x + b rounded twice, as torch
    return k, total, shift


# --- the sampled tokens' positions: [E's valid slots (0 elsewhere) | the list at the sampled ranks] ---

def sample_positions_ref(samp: torch.Tensor, r: Ranking, cstart, order, e_pos, e_valid) -> torch.Tensor:
    """int64 [B, H, Emax + M]: each row's exact-set positions (e_pos where e_valid, else 0), then its
    sorted list's tokens at the list ranks samp (int64 [M], each below the list's length)."""
    B, H, _ = r.cum.shape
    pos_e = torch.where(e_valid, e_pos.view(1, -1), 0).view(B, 1, -1).expand(B, H, -1)
    return torch.cat([pos_e, list_positions(samp, r, cstart, order)], -1)


if HAVE_TRITON:

    @triton.jit
    def _positions_kernel(Ranked, Sizes, Cum, Cst, Od, Samp, Ep, Ev, Out,
                          H, G, C, E, MS, CAP, STEPS,
                          s_tb, s_th, s_ob, s_oh, s_eb,
                          BLOCK_J: tl.constexpr, BLOCK_E: tl.constexpr):
        pid = tl.program_id(0)
        b = (pid // H).to(tl.int64)
        kv = (pid % H) // G
        rk = pid.to(tl.int64) * C                      # Ranking's [B, H, C] rows (contiguous)
        out = Out + pid.to(tl.int64) * (E + MS)
        ee = tl.arange(0, BLOCK_E)
        for e0 in range(0, E, BLOCK_E):
            e = e0 + ee
            m = e < E
            p = tl.load(Ep + e, mask=m, other=0)
            v = tl.load(Ev + b * s_eb + e, mask=m, other=0) != 0
            tl.store(out + e, tl.where(v, p, 0), mask=m)
        jj = tl.arange(0, BLOCK_J)
        for j0 in range(0, MS, BLOCK_J):
            jm = j0 + jj < MS
            x = tl.load(Samp + j0 + jj, mask=jm, other=0)
            # searchsorted(cum, x, right=True): the first ranked cluster whose inclusive cum passes x
            lo = tl.zeros((BLOCK_J,), tl.int64)
            hi = tl.zeros((BLOCK_J,), tl.int64) + C
            for _ in range(STEPS):
                act = lo < hi
                mid = (lo + hi) // 2
                v = tl.load(Cum + rk + mid, mask=act & jm, other=0)
                right = act & (v <= x)
                lo = tl.where(right, mid + 1, lo)
                hi = tl.where(act & ~right, mid, hi)
            c = tl.minimum(lo, C - 1)
            first = tl.load(Cum + rk + c, mask=jm, other=0) - tl.load(Sizes + rk + c, mask=jm, other=0)
            cid = tl.load(Ranked + rk + c, mask=jm, other=0)
            st = tl.load(Cst + b * s_tb + kv * s_th + cid, mask=jm, other=0).to(tl.int64)
            slot = tl.minimum(tl.maximum(st + x - first, 0), CAP - 1)
            pos = tl.load(Od + b * s_ob + kv * s_oh + slot, mask=jm, other=0)
            tl.store(out + E + j0 + jj, pos.to(tl.int64), mask=jm)


def sample_positions(samp, r: Ranking, cstart, order, e_pos, e_valid, *, block_j: int | None = None,
                     block_e: int | None = None) -> torch.Tensor:
    """`sample_positions_ref`'s result in one launch on CUDA (the reference elsewhere): what the
    reference does in ~15 torch ops per layer (searchsorted, clamps, 5 gathers, casts, the cat)."""
    if backend_for(samp) == "torch":
        return sample_positions_ref(samp, r, cstart, order, e_pos, e_valid)
    B, H, C = r.cum.shape
    G = H // cstart.shape[1]
    E, MS = e_pos.numel(), samp.numel()
    assert cstart.stride(-1) == order.stride(-1) == 1 and cstart.dtype == order.dtype == torch.int32
    assert r.cum.is_contiguous() and r.sizes.is_contiguous() and r.ranked.is_contiguous()
    assert samp.dtype == e_pos.dtype == torch.long and samp.is_contiguous() and e_pos.is_contiguous()
    ev = e_valid.contiguous().view(torch.uint8) if e_valid.dtype == torch.bool else e_valid.contiguous()
    out = torch.empty(B, H, E + MS, device=samp.device, dtype=torch.long)
    cuda = samp.is_cuda
    kernel_for(_positions_kernel, samp)[(B * H,)](
        r.ranked, r.sizes, r.cum, cstart, order, samp, e_pos, ev, out,
        H, G, C, E, MS, order.shape[-1], max(1, C.bit_length() + 1),
        cstart.stride(0), cstart.stride(1), order.stride(0), order.stride(1), ev.stride(0),
        BLOCK_J=block_j or min(next_pow2(MS), 256 if cuda else 64),
        BLOCK_E=block_e or min(next_pow2(E), 256 if cuda else 64), num_warps=4 if cuda else 1)
    return out
