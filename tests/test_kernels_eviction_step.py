"""The eviction decode-step kernels (kernels/eviction_step.py) against their torch references (the ops
H2O and TOVA ran before): the put writes the same slots, the fused scoring gives the same output,
accumulated scores and next slots (the arg-min victim with a full store, the length otherwise), for
every pooling, TOVA's shared score, with and without the protected window. Interpreter on the CPU."""
from __future__ import annotations

import pytest
import torch
from triton_env import DEV, needs_triton

from kernels import eviction_step as E

pytestmark = needs_triton


def store(B, H, cap, D, seed):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(B, H, cap, D, generator=g)
    v = torch.randn(B, H, cap, D, generator=g)
    pos = torch.randperm(cap * 3, generator=g)[:cap].view(1, 1, cap).repeat(B, H, 1)
    acc = torch.rand(B, H, cap, generator=g) * 3
    return k, v, pos, acc


def test_put_matches_reference(monkeypatch):
    B, H, cap, D = 2, 3, 12, 32
    k, v, pos, acc = store(B, H, cap, D, 0)
    slot = torch.tensor([[0, 5, 11], [7, 7, 2]])
    kn, vn = torch.randn(B, H, 1, D), torch.randn(B, H, 1, D)
    position = torch.tensor([41])
    ref = [t.clone() for t in (k, v, pos, acc)]
    E.bounded_put_ref(*ref, slot, kn, vn, position)
    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    got = [t.clone().to(DEV) for t in (k, v, pos, acc)]
    E.bounded_put(*got, slot.to(DEV), kn.to(DEV), vn.to(DEV), position.to(DEV))
    for r, x in zip(ref, got):
        assert torch.equal(r, x.cpu())


@pytest.mark.parametrize("rule", [{"pool": "sum", "accumulate": True, "window": 4},
                                  {"pool": "max", "accumulate": True, "window": 3},
                                  {"pool": "mean", "accumulate": True, "window": None},
                                  {"pool": "mean", "shared": True},
                                  {"pool": "mean"},
                                  {"pool": "sum", "window": 200}])     # every slot protected: slot 0
@pytest.mark.parametrize("length", [40, 33])                         # full (cap 40), filling
def test_eviction_decode_matches_reference(monkeypatch, rule, length):
    B, Hq, H, cap, D = 2, 8, 2, 40, 32
    k, v, pos, acc = store(B, H, cap, D, 1)
    q = torch.randn(B, Hq, D, generator=torch.Generator().manual_seed(2))
    lengths = torch.full((B,), length, dtype=torch.int32)
    position = torch.tensor([cap * 3])
    free = torch.full((B, H), -5)
    ref_acc, ref_free = acc.clone(), free.clone()
    kw = dict(cap=cap, **rule)
    out_ref = E.eviction_decode_ref(q, k, v, lengths, 0.3, ref_acc, pos, ref_free, position,
                                    **{"shared": False, "accumulate": False, "window": None, **kw})
    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    got_acc, got_free = acc.clone().to(DEV), torch.full((B, H), 2**63 - 1, device=DEV)   # as the put leaves it
    out = E.eviction_decode(q.to(DEV), k.to(DEV), v.to(DEV), lengths.to(DEV), 0.3, got_acc, pos.to(DEV), got_free,
                            position.to(DEV), **kw)
    torch.testing.assert_close(out.cpu(), out_ref, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got_acc.cpu(), ref_acc, rtol=1e-5, atol=1e-6)
    assert torch.equal(got_free.cpu() & 0xFFFFFFFF, ref_free)      # the slot: the key's low half
    if length < cap:
        assert (ref_free == length).all()
    elif rule.get("window") == 200:
        assert (ref_free == 0).all()


def test_put_then_decode_chain_over_steps(monkeypatch):
    """The put reads the slot the previous step's arg-min left (a packed key on the Triton path) and
    resets it: several steps of the two kernels keep the same slots, stores and scores as the references."""
    B, Hq, H, cap, D = 1, 4, 2, 24, 32
    k, v, pos, acc = store(B, H, cap, D, 3)
    g = torch.Generator().manual_seed(4)
    ref = [t.clone() for t in (k, v, pos, acc)] + [torch.full((B, H), cap - 3)]
    got = [t.clone().to(DEV) for t in ref]
    for step in range(6):
        q, kn, vn = torch.randn(B, Hq, D, generator=g), torch.randn(B, H, 1, D, generator=g), torch.randn(B, H, 1, D, generator=g)
        position = torch.tensor([100 + step])
        lengths = torch.full((B,), min(cap - 2 + step, cap), dtype=torch.int32)
        kw = {"cap": cap, "pool": "sum", "accumulate": True, "window": 3}
        # the references on the CPU with torch's ops (a GPU machine has no interpreter for CPU tensors)
        monkeypatch.setenv("HARNESS_KERNELS", "torch")
        E.bounded_put_ref(*ref[:4], ref[4], kn, vn, position)
        E.eviction_decode_ref(q, ref[0], ref[1], lengths, 0.2, ref[3], ref[2], ref[4], position, shared=False, **kw)
        monkeypatch.setenv("HARNESS_KERNELS", "triton")
        E.bounded_put(*got[:4], got[4], kn.to(DEV), vn.to(DEV), position.to(DEV))
        E.eviction_decode(q.to(DEV), got[0], got[1], lengths.to(DEV), 0.2, got[3], got[2], got[4], position.to(DEV), **kw)
        assert torch.equal(got[4].cpu() & 0xFFFFFFFF, ref[4])
        for r, x in zip(ref[:3], got[:3]):
            assert torch.equal(r, x.cpu())
        torch.testing.assert_close(got[3].cpu(), ref[3], rtol=1e-5, atol=1e-6)
