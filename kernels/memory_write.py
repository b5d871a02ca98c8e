"""The start of InfLLM / Ltri-LLM's decode step on the device path, in one launch per layer: the last step's
pending local mass folded into the window ring's scores (methods/parts/infllm_device.py PendingMass), the new
token's raw key, rotated key and value into the ring (its score reset to 0), its raw key and value into the
positional store at its position (on the device, or in pinned host memory through unified addressing), and,
with offload, into the staging buffer's sink columns when it is a sink (position < n_init). In torch that is
~9 small kernels per layer (2 for the fold, 4 for the ring, 2 or 1 for the store, 1 for the sinks).

    score[b, hq, (p - j) % R] += mass[b, hq, j]   j < n_local, when p = due_pos >= 0 (the pending mass is due)
    score[b, hq, a % R] = 0                        (after the fold: the fold skips that slot)
    ring_*[b, h, a % R] = k / k_rot / v            store[b, h, a] = k, v        sink[b, h, a] = k, v if a < n_init

One token per step (T = 1), `a` the step's position ([1] int64 on the device): graph-safe, no sync. A slot of
the fold never repeats (n_local < R), so the adds are the reference's index_add_, bit for bit.
Triton on CUDA, the torch reference elsewhere.
"""
from __future__ import annotations

import torch

from ._common import HAVE_TRITON, backend_for, kernel_for, next_pow2, tl, triton
from .memory_stage import scatter_rows


def fold_ref(score, mass, due_pos, ring_size: int) -> None:
    """score [B, Hq, R] += the pending mass [B, Hq, n] at slots (due_pos - j) % R, when due_pos [1] >= 0."""
    slots = (due_pos - torch.arange(mass.shape[-1], device=mass.device)).remainder(ring_size)
    score.index_add_(2, slots, torch.where(due_pos >= 0, mass, 0.0))


def decode_write_ref(ring, score, first, k, k_rot, v, store, sink, n_init: int, mass, due_pos) -> None:
    """ring = (k_raw, k_rot, v) [B, Hkv, R, D], score [B, Hq, R], first [1], k/k_rot/v [B, Hkv, 1, D], store
    = (k, v) [B, Hkv, cap, D] (host or device), sink = (k, v) [B, Hkv, cap2, D] or None, mass [B, Hq, n]."""
    R = score.shape[-1]
    fold_ref(score, mass, due_pos, R)
    if store[0].device == k.device:
        store[0].index_copy_(2, first, k)
        store[1].index_copy_(2, first, v)
    else:
        scatter_rows(store[0], store[1], first, k, v)
    if sink is not None:
        scatter_rows(sink[0], sink[1], first, k, v, limit=n_init)
    slot = first.remainder(R)
    for dst, src in zip(ring, (k, k_rot, v)):
        dst.index_copy_(2, slot, src)
    score.index_fill_(2, slot, 0.0)


if HAVE_TRITON:

    @triton.jit
    def _write_kernel(RK, RKR, RV, Sc, First, K, KR, V, SK, SV, GK, GV, Mass, Due, H, G, R, NL, NCH, n_init,
                      s_rb, s_rh, s_rn, s_kb, s_kh, s_krb, s_krh, s_vb, s_vh, s_sb, s_sh, s_sn, s_gb, s_gh, s_gn,
                      s_cb, s_ch, s_mb, s_mh, D, BD: tl.constexpr, BJ: tl.constexpr, HAS_SINK: tl.constexpr):
        # program (b * H + h, g * NCH + c): query head h * G + g, the c-th BJ columns of its pending mass (a
        # program per (b, h) looping over all of them took ~100 us a layer at n_local 4096 on an H200); the
        # programs with c == 0 also write the token (program g == 0) and reset its slot's score
        pid = tl.program_id(0)
        gc = tl.program_id(1)
        g = gc // NCH
        c = gc % NCH
        b = (pid // H).to(tl.int64)
        h = (pid % H).to(tl.int64)
        a = tl.load(First).to(tl.int64)
        slot = a % R
        dd = tl.arange(0, BD)
        dm = (dd < D) & (gc == 0)
        k = tl.load(K + b * s_kb + h * s_kh + dd, mask=dm)
        kr = tl.load(KR + b * s_krb + h * s_krh + dd, mask=dm)
        v = tl.load(V + b * s_vb + h * s_vh + dd, mask=dm)
        ring = b * s_rb + h * s_rh + slot * s_rn + dd
        tl.store(RK + ring, k, mask=dm)
        tl.store(RKR + ring, kr, mask=dm)
        tl.store(RV + ring, v, mask=dm)
        tl.store(SK + b * s_sb + h * s_sh + a * s_sn + dd, k, mask=dm)
        tl.store(SV + b * s_sb + h * s_sh + a * s_sn + dd, v, mask=dm)
        if HAS_SINK:
            tl.store(GK + b * s_gb + h * s_gh + a * s_gn + dd, k, mask=dm & (a < n_init))
            tl.store(GV + b * s_gb + h * s_gh + a * s_gn + dd, v, mask=dm & (a < n_init))
        p = tl.load(Due).to(tl.int64)
        hq = h * G + g
        row = Sc + b * s_cb + hq * s_ch
        j = c * BJ + tl.arange(0, BJ)
        s = ((p - j) % R + R) % R
        ok = (j < NL) & (p >= 0) & (s != slot)
        m = tl.load(Mass + b * s_mb + hq * s_mh + j, mask=ok, other=0.0)
        cur = tl.load(row + s, mask=ok, other=0.0)
        tl.store(row + s, cur + m, mask=ok)
        tl.store(row + slot, 0.0, mask=c == 0)     # the fold never touches the token's slot


def decode_write(ring, score, first, k, k_rot, v, store, sink, n_init: int, mass, due_pos) -> None:
    """decode_write_ref's contract (module docstring), in one launch on a Triton device."""
    if backend_for(k) == "torch":
        return decode_write_ref(ring, score, first, k, k_rot, v, store, sink, n_init, mass, due_pos)
    B, H, T, D = k.shape
    Hq, R = score.shape[1], score.shape[2]
    assert T == 1 and ring[0].stride() == ring[1].stride() == ring[2].stride() and store[0].stride() == store[1].stride()
    assert all(t.stride(-1) == 1 for t in (*ring, *store, k, k_rot, v, score, mass))
    sk, sv = sink if sink is not None else store
    assert sk.stride() == sv.stride()
    NL = mass.shape[-1]
    BJ = min(256, next_pow2(NL)) if k.is_cuda else 4      # small on the interpreter: tests cross chunks
    nch = triton.cdiv(NL, BJ)
    kernel_for(_write_kernel, k)[(B * H, (Hq // H) * nch)](
        *ring, score, first, k, k_rot, v, *store, sk, sv, mass, due_pos, H, Hq // H, R, NL, nch, n_init,
        *ring[0].stride()[:3], k.stride(0), k.stride(1), k_rot.stride(0), k_rot.stride(1), v.stride(0), v.stride(1),
        *store[0].stride()[:3], *sk.stride()[:3], score.stride(0), score.stride(1), mass.stride(0), mass.stride(1),
        D, BD=next_pow2(D), BJ=BJ, HAS_SINK=sink is not None,
        num_warps=4)
    return None
