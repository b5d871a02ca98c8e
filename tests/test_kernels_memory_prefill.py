"""kernels/memory_prefill.py: the one-kernel two-part prefill attention against its reference (two window
attentions merged) and the reference against one brute-force softmax over the union; Triton in the
interpreter at small shapes. Part 1 is a ring (stale slots at FAR, NaN in unseen rows), part 2 contiguous
with positions or InfLLM's [sinks | blocks | remainder] read from a positional store (blocks shared by the
KV heads or per KV head)."""
from __future__ import annotations

import pytest
import torch
from triton_env import DEV, needs_triton

from kernels.memory_prefill import two_part_prefill_lse, two_part_prefill_lse_ref
from kernels.window import FAR

B, HQ, HKV, D, T = 2, 4, 2, 16, 7
A = 30          # first query position
W1 = 9          # local window: distances 0..W1-1


def _inputs(seed, indexed):
    g = torch.Generator().manual_seed(seed)
    q1, q2 = torch.randn(B, HQ, T, D, generator=g), torch.randn(B, HQ, T, D, generator=g)
    R = 20     # ring: slot s holds the latest position <= A+T-1 congruent to s, the rest stale
    k1, v1 = torch.randn(B, HKV, R, D, generator=g), torch.randn(B, HKV, R, D, generator=g)
    last = A + T - 1
    pos1 = (last - (last - torch.arange(R)) % R).expand(B, R).contiguous()
    k1[:, :, 3], v1[:, :, 3] = float("nan"), float("nan")     # a stale slot nobody sees (position 20: out of every window)
    pos1[:, 3] = 20
    qp = torch.arange(A, A + T).expand(B, T).contiguous()
    if indexed:   # store: sinks 0..2, blocks of 4 from 3 (four formed), remainder 19..23; NaN past it
        S, U = 40, (HKV if indexed == "per_head" else 1)
        k2, v2 = torch.randn(B, HKV, S, D, generator=g), torch.randn(B, HKV, S, D, generator=g)
        k2[:, :, 24:], v2[:, :, 24:] = float("nan"), float("nan")
        ids = torch.stack([torch.randperm(4, generator=g)[:2].sort().values for _ in range(B * U)]).view(B, U, 2)
        blocks = (ids.to(torch.int32), 3, 3, 4, 2, 19, 16)
        return q1, k1, v1, pos1, q2, k2, v2, None, qp, blocks
    L2 = 8
    k2, v2 = torch.randn(B, HKV, L2, D, generator=g), torch.randn(B, HKV, L2, D, generator=g)
    pos2 = torch.tensor([0, 0, 0, 18, 19, 20, 21, 22]).expand(B, L2).contiguous()
    return q1, k1, v1, pos1, q2, k2, v2, pos2, qp, None


def _brute(q1, k1, v1, pos1, q2, k2, v2, pos2, qp, blocks, dmin2, scale):
    out = torch.zeros(B, HQ, T, D, dtype=torch.float64)
    for b in range(B):
        for h in range(HQ):
            kv = h // (HQ // HKV)
            for t in range(T):
                p = int(qp[b, t])
                s, vs = [], []
                for j in range(k1.shape[2]):
                    if 0 <= p - int(pos1[b, j]) <= W1 - 1:
                        s.append(float(q1[b, h, t].double() @ k1[b, kv, j].double()) * scale)
                        vs.append(v1[b, kv, j].double())
                if blocks is None:
                    keys = [(j, int(pos2[b, j])) for j in range(k2.shape[2])]
                else:
                    ids = blocks[0][b, kv if blocks[0].shape[1] > 1 else 0].tolist()
                    mem = [0, 1, 2] + [3 + i * 4 + r for i in ids for r in range(4)] + list(range(19, 24))
                    keys = [(x, x) for x in mem]
                for j, kp in keys:
                    if p - kp >= dmin2:
                        s.append(float(q2[b, h, t].double() @ k2[b, kv, j].double()) * scale)
                        vs.append(v2[b, kv, j].double())
                w = torch.softmax(torch.tensor(s, dtype=torch.float64), 0)
                out[b, h, t] = (w.unsqueeze(-1) * torch.stack(vs)).sum(0)
    return out


@pytest.mark.parametrize("indexed", [False, "shared", "per_head"])
@pytest.mark.parametrize("dmin2", [-FAR, W1])
def test_reference_equals_one_softmax_over_both_parts(indexed, dmin2):
    q1, k1, v1, pos1, q2, k2, v2, pos2, qp, blocks = _inputs(0, indexed)
    out, lse = two_part_prefill_lse_ref(q1, k1, v1, pos1, 0, W1 - 1, q2, k2, v2, pos2, dmin2, FAR, qp, 0.3,
                                        blocks2=blocks)
    want = _brute(q1, k1, v1, pos1, q2, k2, v2, pos2, qp, blocks, dmin2, 0.3)
    assert torch.isfinite(lse).all()
    assert (out.double() - want).abs().max().item() <= 1e-5


@needs_triton
@pytest.mark.parametrize("indexed", [False, "shared", "per_head"])
@pytest.mark.parametrize("dmin2", [-FAR, W1])
def test_triton_path_equals_reference(indexed, dmin2, monkeypatch):
    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    *args, blocks = _inputs(1, indexed)
    q1, k1, v1, pos1, q2, k2, v2, pos2, qp = (t.to(DEV) if t is not None else None for t in args)
    kw = {"blocks2": None if blocks is None else (blocks[0].to(DEV), *blocks[1:])}
    want, want_lse = two_part_prefill_lse_ref(q1, k1, v1, pos1, 0, W1 - 1, q2, k2, v2, pos2, dmin2, FAR, qp, 0.3, **kw)
    got, got_lse = two_part_prefill_lse(q1, k1, v1, pos1, 0, W1 - 1, q2, k2, v2, pos2, dmin2, FAR, qp, 0.3, **kw)
    assert (got.float() - want.float()).abs().max().item() <= 1e-4
    assert (got_lse - want_lse).abs().max().item() <= 1e-4
