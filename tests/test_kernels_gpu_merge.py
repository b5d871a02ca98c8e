"""kernels/lse.py and kernels/window.py at real shapes on the GPU (Llama-3-8B: Hq 32, Hkv 8, D 128,
bf16; InfLLM's chunk 512 over a 4096 window + chunk, decode over 128K): Triton against the torch
references. Run on the device machine: `python -m pytest -m gpu tests/test_kernels_gpu_merge.py`."""
from __future__ import annotations

import pytest
import torch

import kernels
from kernels import attention as A, lse as LS, window as W

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
              pytest.mark.skipif(not kernels.HAVE_TRITON, reason="needs triton")]

HQ, HKV, D = 32, 8, 128
SCALE = D ** -0.5


@pytest.fixture(autouse=True)
def poisoned(monkeypatch):
    monkeypatch.delenv("HARNESS_KERNELS", raising=False)
    nan = lambda *s, device, dtype: torch.full(s, float("nan"), device=device, dtype=dtype)  # noqa: E731
    monkeypatch.setattr(A, "_empty", nan)
    yield
    torch.cuda.empty_cache()


def rel(a, b):
    assert torch.isfinite(a).all(), "unwritten (NaN) or non-finite output"
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _qkv(B, T, L, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, HQ, T, D, device="cuda", generator=g).bfloat16()
    k = (torch.randn(B, HKV, L, D, device="cuda", generator=g) + 0.5).bfloat16()
    v = torch.randn(B, HKV, L, D, device="cuda", generator=g).bfloat16()
    return q, k, v


@pytest.mark.parametrize("B,T,L,dmin,dmax", [(1, 512, 4608, 0, 4095), (2, 512, 2432, -W.FAR, W.FAR),
                                             (1, 333, 1000, 100, W.FAR)])
def test_window_attention_and_mass_real(B, T, L, dmin, dmax):
    q, k, v = _qkv(B, T, L, 0)
    qp = torch.arange(L - T, L, device="cuda") + 5000
    kp = torch.arange(L, device="cuda") + 5000
    out, lse = W.window_attention_lse(q, k, v, SCALE, qp, kp, dmin, dmax)
    ref, rl = W.window_attention_lse_ref(q, k, v, SCALE, qp, kp, dmin, dmax)
    seen = torch.isfinite(rl)
    assert torch.equal(torch.isfinite(lse), seen)
    assert rel(out[seen.unsqueeze(-1).expand_as(out)], ref[seen.unsqueeze(-1).expand_as(ref)]) < 1e-2
    torch.testing.assert_close(lse[seen], rl[seen], rtol=1e-3, atol=2e-2)
    ext = torch.logaddexp(rl, torch.full_like(rl, 2.0))
    mass = W.window_mass(q, k, SCALE, qp, kp, ext, dmin, dmax)
    assert rel(mass, W.window_mass_ref(q, k, SCALE, qp, kp, ext, dmin, dmax)) < 1e-2


@pytest.mark.parametrize("B,S", [(1, 131072), (4, 32768)])
def test_decode_attention_lse_real(B, S):
    q, k, v = _qkv(B, 1, S, 1)
    q1 = q[:, :, 0].contiguous()
    lengths = torch.randint(S // 2, S + 1, (B,), device="cuda", dtype=torch.int32)
    lengths[0] = 0 if B > 1 else lengths[0]          # an empty part in a batch
    out, lse = LS.decode_attention_lse(q1, k, v, lengths, SCALE, max_length=S)
    ref, rl = LS.decode_attention_lse_ref(q1, k, v, lengths, SCALE, S)
    assert rel(out, ref) < 1e-2
    fin = torch.isfinite(rl)
    assert torch.equal(torch.isfinite(lse), fin)
    torch.testing.assert_close(lse[fin], rl[fin], rtol=1e-3, atol=2e-2)


def test_sparse_tokens_lse_with_scores_real():
    B, R, n = 2, 4736, 4096
    q, k, v = _qkv(B, 1, R, 2)
    q1 = q[:, :, 0].contiguous()
    slots = (torch.arange(n, device="cuda") + 1000) % R
    index = slots.to(torch.int32).view(1, 1, n).expand(B, HKV, n).contiguous()
    counts = torch.full((B, HKV), n, dtype=torch.int32, device="cuda")
    s1 = torch.full((B, HQ, R), -3.0, device="cuda")
    s2 = s1.clone()
    out, lse = LS.sparse_decode_tokens_lse(q1, k, v, index, counts, SCALE, scores=s1)
    ref, rl = LS.sparse_decode_tokens_lse_ref(q1, k, v, index, counts, SCALE, s2)
    assert rel(out, ref) < 1e-2
    torch.testing.assert_close(lse, rl, rtol=1e-3, atol=2e-2)
    torch.testing.assert_close(s1, s2, rtol=1e-3, atol=5e-2)
