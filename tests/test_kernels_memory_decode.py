"""kernels/memory_decode.py: the one-combine two-part decode against its reference (two token-indexed
decode calls and merge_attention) and against one brute-force softmax over the union; Triton in the
interpreter at small shapes (the CUDA shapes run in tests/test_infllm_gpu_graph.py's engine runs)."""
from __future__ import annotations

import pytest
import torch
from triton_env import DEV, needs_triton

from kernels.memory_decode import (
    two_part_decode_lse_ref,
    two_part_decode_mass,
    two_part_workspace,
)

B, HQ, HKV, D = 2, 4, 2, 16


def _decode(dev, scores=None, workspace=None):
    """The kernel path's (out, lse): two_part_decode_mass over a 40-slot window at position 39."""
    sc = scores if scores is not None else torch.zeros(B, HQ, 40, device=DEV)
    mass = torch.empty(B, HQ, 8, device=DEV)
    pos = torch.empty(1, dtype=torch.long, device=DEV)
    return two_part_decode_mass(*dev, 0.3, scores=sc, first=torch.tensor([39], device=DEV), ring_size=40,
                                mass_out=mass, pos_out=pos, workspace=workspace)


def _part(g, S, n, counts):
    k = torch.randn(B, HKV, S, D, generator=g) + 0.2
    v = torch.randn(B, HKV, S, D, generator=g)
    idx = torch.stack([torch.randperm(S, generator=g)[:n] for _ in range(B * HKV)]).view(B, HKV, n).to(torch.int32)
    return k, v, idx, torch.tensor(counts, dtype=torch.int32).view(B, HKV)


def _inputs(seed, counts2):
    g = torch.Generator().manual_seed(seed)
    q1, q2 = torch.randn(B, HQ, D, generator=g), torch.randn(B, HQ, D, generator=g)
    return q1, _part(g, 40, 11, [11, 7, 3, 9]), q2, _part(g, 50, 13, counts2)


def _brute(q1, p1, q2, p2, scale):
    outs = []
    for b in range(B):
        for h in range(HQ):
            kv = h // (HQ // HKV)
            rows = []
            for q, (k, v, idx, cnt) in ((q1, p1), (q2, p2)):
                ids = idx[b, kv, :cnt[b, kv]].long()
                rows.append(((k[b, kv, ids].double() @ q[b, h].double()) * scale, v[b, kv, ids].double()))
            s = torch.cat([r[0] for r in rows])
            vv = torch.cat([r[1] for r in rows])
            outs.append(torch.softmax(s, 0) @ vv if s.numel() else torch.zeros(D, dtype=torch.float64))
    return torch.stack(outs).view(B, HQ, D)


@pytest.mark.parametrize("counts2", [[13, 5, 0, 8], [0, 0, 0, 0]])
def test_reference_equals_one_softmax_over_both_parts(counts2):
    q1, p1, q2, p2 = _inputs(0, counts2)
    out, _ = two_part_decode_lse_ref(q1, *p1, q2, *p2, 0.3)
    assert (out.double() - _brute(q1, p1, q2, p2, 0.3)).abs().max().item() <= 1e-5


@needs_triton
@pytest.mark.parametrize("counts2", [[13, 5, 0, 8], [0, 0, 0, 0]])
def test_triton_path_equals_reference(counts2, monkeypatch):
    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    q1, p1, q2, p2 = _inputs(1, counts2)
    dev = [t.to(DEV) for t in (q1, *p1, q2, *p2)]
    sc_ref = torch.full((B, HQ, 40), -7.0, device=DEV)
    sc_got = sc_ref.clone()
    want, want_lse = two_part_decode_lse_ref(*dev, 0.3, scores=sc_ref)
    got, got_lse = _decode(dev, scores=sc_got)
    assert (got.float() - want.float()).abs().max().item() <= 1e-4
    assert (got_lse - want_lse).abs().max().item() <= 1e-4
    assert torch.allclose(sc_got, sc_ref, atol=1e-4)


@needs_triton
def test_workspace_is_written_in_place_and_reused(monkeypatch):
    """The partials land in the method's preallocated workspace (no per-step allocation): a NaN-filled
    workspace gives the reference's result, and the same tensors serve a second call and a re-plan."""
    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    q1, p1, q2, p2 = _inputs(2, [13, 5, 0, 8])
    dev = [t.to(DEV) for t in (q1, *p1, q2, *p2)]
    parts = [(HKV, p1[2].shape[-1]), (HKV, p2[2].shape[-1])]
    ws = two_part_workspace(B, HQ, D, parts, DEV)
    ws[0].fill_(float("nan"))
    ws[1].fill_(float("nan"))
    want, want_lse = two_part_decode_lse_ref(*dev, 0.3)
    for _ in range(2):
        got, got_lse = _decode(dev, workspace=ws)
        assert (got.float() - want.float()).abs().max().item() <= 1e-4
        assert (got_lse - want_lse).abs().max().item() <= 1e-4
    assert not ws[1].isnan().any()
    assert two_part_workspace(B, HQ, D, parts, DEV, ws) is ws
