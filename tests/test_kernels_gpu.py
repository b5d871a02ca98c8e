"""Kernel parity at real shapes on the GPU (Llama-3-8B: Hq 32, Hkv 8, D 128, bf16, up to 128K).
Run on the device machine: `python -m pytest -m gpu tests/test_kernels_gpu.py`."""
from __future__ import annotations

import pytest
import torch

import kernels
from kernels import attention as A, quest_pages as Qm

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
              pytest.mark.skipif(not kernels.HAVE_TRITON, reason="needs triton")]

HQ, HKV, D = 32, 8, 128
SCALE = D ** -0.5


@pytest.fixture(autouse=True)
def poisoned(monkeypatch):
    monkeypatch.delenv("HARNESS_KERNELS", raising=False)
    # unwritten outputs show: NaN in float buffers, the most negative value in integer ones (page ids)
    nan = lambda *s, device, dtype: torch.full(
        s, float("nan") if dtype.is_floating_point else torch.iinfo(dtype).min, device=device, dtype=dtype)
    monkeypatch.setattr(A, "_empty", nan)
    monkeypatch.setattr(Qm, "_empty", nan)
    yield
    torch.cuda.empty_cache()


def rel(a, b):
    assert torch.isfinite(a).all(), "unwritten (NaN) or non-finite output"
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def make(B, S, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, HQ, D, device="cuda", generator=g).bfloat16()
    # keys with a shared offset give peaked softmaxes, like real models (pure noise is too flat)
    k = (torch.randn(B, HKV, S, D, device="cuda", generator=g) + 0.5).bfloat16()
    v = torch.randn(B, HKV, S, D, device="cuda", generator=g).bfloat16()
    return q, k, v


def lengths_for(B, S, seed):
    if B == 1:
        return torch.tensor([S - 3], dtype=torch.int32, device="cuda")
    g = torch.Generator().manual_seed(seed)
    return torch.randint(S // 2, S + 1, (B,), generator=g, dtype=torch.int32).cuda()


SHAPES = [(1, 131072), (8, 32768), (8, 131072)]


@pytest.mark.parametrize("B,S", SHAPES)
def test_decode_attention_real(B, S):
    q, k, v = make(B, S, 0)
    lengths = lengths_for(B, S, 0)
    out = kernels.decode_attention(q, k, v, lengths, SCALE)
    assert rel(out, A.decode_attention_ref(q, k, v, lengths, SCALE)) < 1e-2


@pytest.mark.parametrize("B,S", SHAPES[:2])
def test_selection_attention_real(B, S):
    q, k, v = make(B, S, 1)
    lengths = lengths_for(B, S, 1)
    out, scores, idx, cnt = kernels.selection_attention(q, k, v, lengths, SCALE, topk=4096)
    rout, rscores = A.selection_attention_ref(q, k, v, lengths, SCALE)
    assert rel(out, rout) < 1e-2
    fin = torch.isfinite(rscores)
    assert torch.equal(torch.isfinite(scores), fin)
    torch.testing.assert_close(scores[fin], rscores[fin], rtol=1e-3, atol=2e-2)
    assert (cnt == 4096).all() and idx.max() < S


@pytest.mark.parametrize("B,S", SHAPES)
@pytest.mark.parametrize("per_query_head", [True, False])
def test_sparse_tokens_real(B, S, per_query_head):
    q, k, v = make(B, S, 2)
    lengths = lengths_for(B, S, 2)
    H = HQ if per_query_head else HKV
    scores = torch.rand(B, H, S, device="cuda")
    scores[torch.arange(S, device="cuda") >= lengths.view(B, 1, 1).expand(B, H, S)] = float("-inf")
    index, counts = A.topk_positions(scores, lengths, 4096)
    counts[0, 0] = 777  # variable counts per head
    out = kernels.sparse_decode_tokens(q, k, v, index, counts, SCALE)
    assert rel(out, A.sparse_decode_tokens_ref(q, k, v, index, counts, SCALE)) < 1e-2


@pytest.mark.parametrize("B,S", SHAPES)
@pytest.mark.parametrize("per_query_head", [True, False])
def test_sparse_pages_real(B, S, per_query_head):
    q, k, v = make(B, S, 3)
    lengths = lengths_for(B, S, 3)
    P, H = 16, (HQ if per_query_head else HKV)
    n_valid = (lengths + P - 1) // P
    pscores = torch.rand(B, H, S // P, device="cuda")
    page_index, counts = kernels.quest_topk_pages(pscores, 4096 // P, n_valid)
    out = kernels.sparse_decode_pages(q, k, v, page_index, counts, P, lengths, SCALE)
    ref = A.sparse_decode_pages_ref(q, k, v, page_index, counts, P, lengths, SCALE)
    assert rel(out, ref) < 1e-2


@pytest.mark.parametrize("B,S", [(1, 131072), (8, 131072)])
def test_quest_real(B, S):
    P = 16
    q, k, _ = make(B, S, 4)
    kmin = torch.empty(B, HKV, S // P, D, device="cuda", dtype=torch.bfloat16)
    kmax = torch.empty_like(kmin)
    kernels.quest_update_pages(kmin, kmax, k[:, :, :S - 5].contiguous(), 0, P)
    kernels.quest_update_pages(kmin, kmax, k[:, :, S - 5:S - 4].contiguous(), S - 5, P)
    kb = k[:, :, :S - 4].float()
    full = (S - 4) // P
    torch.testing.assert_close(kmin[:, :, :full].float(),
                               kb[:, :, :full * P].view(B, HKV, full, P, D).amin(3), rtol=0, atol=0)
    torch.testing.assert_close(kmax[:, :, full].float(), kb[:, :, full * P:].amax(2), rtol=0, atol=0)
    nv = torch.full((B,), S // P, dtype=torch.int32, device="cuda")
    out = kernels.quest_page_scores(q, kmin, kmax, nv)
    torch.testing.assert_close(out, Qm.quest_page_scores_ref(q, kmin, kmax, nv), rtol=1e-4, atol=1e-2)


@pytest.mark.parametrize("T,L", [(512, 4096), (2048, 32768)])
def test_attention_mass_real_shapes(T, L):
    """Blockwise attention mass (H2O / SnapKV / Cascading prefill statistic) at Llama-3-8B head
    shapes: Triton vs the torch reference, and each query's probabilities summing to 1."""
    from kernels import prefill as P

    g = torch.Generator(device="cuda").manual_seed(7)
    q = torch.randn(1, HQ, T, D, device="cuda", generator=g).bfloat16()
    k = (torch.randn(1, HKV, L, D, device="cuda", generator=g) + 0.5).bfloat16()
    got = kernels.attention_mass(q, k, SCALE)
    ref = P.attention_mass_ref(q, k, SCALE)
    assert rel(got, ref) < 2e-2
    torch.testing.assert_close(got.sum(-1), torch.full_like(got[..., 0], float(T)), rtol=1e-3, atol=1e-2)
