"""Decode attention over a per-layer KV cache: full, sparse (token or page index sets) and
selection (full attention that also emits the q.k scores for top-k selection).

Conventions: q [B, Hq, D]; k, v [B, Hkv, S_cap, D] with last dim contiguous; lengths int32 [B]
(tokens 0..len-1 valid, len >= 1); output [B, Hq, D] in q's dtype; `scale` multiplies q.k before
the softmax. GQA: query head h reads KV head h // (Hq // Hkv).

All four ops share one Triton kernel (`_split_attn_kernel`): a program owns the query heads that
read the same key set (the whole GQA group for full attention and per-KV-head sets, one head for
per-query-head sets), so K/V rows are loaded once per program; the slot range is cut into splits
(split-K, flash-decoding style) whose partial results are merged by `_common.combine`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ._common import (HAVE_TRITON, LOG2E, backend_for, combine, kernel_for, next_pow2, num_sms,
                      plan_splits, tl, triton)

# Launch configuration; bench_kernels.py sweeps these (see notes/kernels.md for the measurements).
CONFIG = {  # picked from the H100 launch-config sweeps in notes/kernels.md
    "dense": dict(block_n=64, num_warps=4, num_stages=4, splits_per_sm=4.0),
    "tokens": dict(block_n=64, num_warps=8, num_stages=3, splits_per_sm=4.0),
    "pages": dict(block_n=64, num_warps=8, num_stages=3, splits_per_sm=4.0),
}
CPU_BLOCK_N = 32  # interpreter: bigger blocks mean fewer python-level iterations


def _empty(*shape, device, dtype):
    """Every buffer the kernels must fill comes from here (tests swap in a NaN-filled version)."""
    return torch.empty(*shape, device=device, dtype=dtype)

if HAVE_TRITON:

    @triton.jit
    def _split_attn_kernel(
        Q, K, V, Lens, Idx, Cnt, Sc, Op, Lp, qk_scale,
        s_qb, s_qh, s_kb, s_kh, s_kn, s_vb, s_vh, s_vn, s_ib, s_ih, s_cb, s_sb, s_sh,
        H, S_OUT, CHUNK, NS,
        R: tl.constexpr, G: tl.constexpr, R_PAD: tl.constexpr, D: tl.constexpr,
        BLOCK_N: tl.constexpr, PAGE: tl.constexpr, INDEXED: tl.constexpr,
        LEN_MASK: tl.constexpr, WRITE_SCORES: tl.constexpr, PREC: tl.constexpr,
        UPCAST: tl.constexpr,
    ):
        pid = tl.program_id(0)
        sid = tl.program_id(1)
        b = pid // H
        h = pid % H
        qh0 = h * R          # first query head served by this program
        kvh = qh0 // G
        b64 = b.to(tl.int64)
        rows = tl.arange(0, R_PAD)
        rmask = rows < R
        dd = tl.arange(0, D)
        # Rows beyond R are zero queries: tl.dot needs M >= 16, and decode is bound by K/V bytes.
        q = tl.load(Q + b64 * s_qb + (qh0 + rows)[:, None] * s_qh + dd[None, :],
                    mask=rmask[:, None], other=0.0)
        if UPCAST:  # Triton 3.6's interpreter computes bf16 tl.dot wrongly; upcast (after rounding)
            q = q.to(tl.float32)
        kbase = K + b64 * s_kb + kvh * s_kh
        vbase = V + b64 * s_vb + kvh * s_vh
        length = 0
        if LEN_MASK:
            length = tl.load(Lens + b)
        if INDEXED:
            n_slots = tl.load(Cnt + b64 * s_cb + h) * PAGE
            ibase = Idx + b64 * s_ib + h * s_ih
        elif WRITE_SCORES:
            n_slots = S_OUT  # every score column gets written, -inf past this sequence's end
        else:
            n_slots = length
        lo = sid * CHUNK
        hi = tl.minimum(lo + CHUNK, n_slots)
        # Finite start value: a block with every slot masked then gives p = 0, not NaN.
        m_i = tl.full((R_PAD,), -1e30, tl.float32)
        l_i = tl.zeros((R_PAD,), tl.float32)
        acc = tl.zeros((R_PAD, D), tl.float32)
        for start in range(lo, hi, BLOCK_N):
            offs = start + tl.arange(0, BLOCK_N)
            smask = offs < hi
            if INDEXED:
                pg = tl.load(ibase + offs // PAGE, mask=smask, other=0)
                pos = pg * PAGE + offs % PAGE
            else:
                pos = offs
            valid = smask
            if LEN_MASK:
                valid = valid & (pos < length)
            k = tl.load(kbase + pos[:, None] * s_kn + dd[None, :], mask=valid[:, None], other=0.0)
            if UPCAST:
                k = k.to(tl.float32)
            qk = tl.dot(q, tl.trans(k), input_precision=PREC)
            if WRITE_SCORES:
                tl.store(Sc + b64 * s_sb + (qh0 + rows)[:, None] * s_sh + pos[None, :],
                         tl.where(valid[None, :], qk, float("-inf")),
                         mask=rmask[:, None] & smask[None, :])
            s = tl.where(valid[None, :], qk * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            vv = tl.load(vbase + pos[:, None] * s_vn + dd[None, :], mask=valid[:, None], other=0.0)
            pv = p.to(vv.dtype)
            if UPCAST:
                pv = pv.to(tl.float32)
                vv = vv.to(tl.float32)
            acc = acc * alpha[:, None] + tl.dot(pv, vv, input_precision=PREC)
            m_i = m_new
        o = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        lse = tl.where(l_i > 0, m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
        prow = (b64 * (H * R) + qh0 + rows) * NS + sid
        tl.store(Op + prow[:, None] * D + dd[None, :], o, mask=rmask[:, None])
        tl.store(Lp + prow, lse, mask=rmask)


def _launch(q, k, v, lengths, scale, *, index=None, counts=None, page=1, scores=None,
            n_slots_max: int, kind: str, num_splits=None, config=None):
    B, Hq, D = q.shape
    Hkv = k.shape[1]
    assert Hq % Hkv == 0, "Hq must be a multiple of Hkv"
    assert q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1
    assert D >= 16 and D == next_pow2(D), "head dim must be a power of two >= 16"
    G = Hq // Hkv
    indexed = index is not None
    H = index.shape[1] if indexed else Hkv
    assert Hq % H == 0 and H % Hkv == 0, "index sets must be per query head or per KV head"
    R = Hq // H
    cfg = dict(CONFIG[kind], **(config or {}))
    block = cfg["block_n"] if q.is_cuda else CPU_BLOCK_N
    ns, chunk = plan_splits(n_slots_max, B * H, block, num_sms(q), cfg["splits_per_sm"], num_splits)
    op = _empty(B, Hq, ns, D, device=q.device, dtype=torch.float32)
    lp = _empty(B, Hq, ns, device=q.device, dtype=torch.float32)
    len_mask = (not indexed) or page > 1
    lens = lengths if lengths is not None else counts  # placeholder pointer when unused
    idx = index if indexed else lens
    cnt = counts if indexed else lens
    sc = scores if scores is not None else op
    upcast = not q.is_cuda
    prec = "ieee" if (q.dtype == torch.float32 or upcast) else "tf32"
    kernel_for(_split_attn_kernel, q)[(B * H, ns)](
        q, k, v, lens, idx, cnt, sc, op, lp, scale * LOG2E,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        idx.stride(0), idx.stride(1) if idx.dim() > 1 else 0, cnt.stride(0),
        sc.stride(0), sc.stride(1), H, sc.shape[-1] if scores is not None else 0, chunk, ns,
        R=R, G=G, R_PAD=max(16, next_pow2(R)), D=D, BLOCK_N=block, PAGE=page, INDEXED=indexed,
        LEN_MASK=len_mask, WRITE_SCORES=scores is not None, PREC=prec, UPCAST=upcast,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    return combine(op, lp, _empty(B, Hq, D, device=q.device, dtype=q.dtype))


# ----------------------------------------------------------------------------- torch references

def _attend_ref(q, ks, vs, valid, scale):
    """q [B, Hq, D]; ks, vs [B, Hq, N, D]; valid [B, Hq, N] -> [B, Hq, D] (fp32 math).

    Invalid entries may point at slots nothing wrote (torch.empty garbage, NaN included): they are
    replaced with where(), never multiplied by a zero probability (0 x NaN = NaN)."""
    s = torch.einsum("bhd,bhnd->bhn", q.float(), ks.float()) * scale
    s = torch.where(valid, s, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)  # empty set -> zeros, as the kernel does
    vs = torch.where(valid.unsqueeze(-1), vs.float(), 0.0)
    return torch.einsum("bhn,bhnd->bhd", p, vs).to(q.dtype)


def _logits_ref(q, k, S):
    B, Hq, D = q.shape
    Hkv = k.shape[1]
    qg = q.float().view(B, Hkv, Hq // Hkv, D)
    return torch.einsum("bhgd,bhsd->bhgs", qg, k[:, :, :S].float()).reshape(B, Hq, S)


def _span(lengths, max_length) -> int:
    """Slots to look at: `max_length` (a host bound, no sync: CUDA-graph safe); on the CPU the
    actual longest length, which costs nothing there and spares O(capacity) work per step."""
    S = int(max_length) if max_length is not None else int(lengths.max())
    return S if lengths.is_cuda else min(S, int(lengths.max()))


def _live(lengths, S):
    """[B, 1, S] bool: slot s holds a token of sequence b (s < lengths[b])."""
    return torch.arange(S, device=lengths.device) < lengths.view(-1, 1, 1).long()


def decode_attention_ref(q, k, v, lengths, scale, max_length=None):
    B, Hq, D = q.shape
    Hkv = k.shape[1]
    S = _span(lengths, max_length)
    if not lengths.is_cuda and bool((lengths == S).all()):
        # Every slot of the span holds a token (the usual equal-length batch on the CPU): nothing to
        # mask, so the CPU's fused SDPA kernel (0.5 ms vs 0.9 ms for the masked path below per layer,
        # 2K tokens, SmolLM2 heads, one thread).
        out = F.scaled_dot_product_attention(q.unsqueeze(2), k[:, :, :S], v[:, :, :S], scale=scale,
                                             enable_gqa=Hq != Hkv)
        return out[:, :, 0]
    live = _live(lengths, S)
    s = torch.where(live, _logits_ref(q, k, S) * scale, float("-inf"))
    p = torch.softmax(s, -1).view(B, Hkv, Hq // Hkv, S)
    # Slots past a sequence's length may hold garbage (NaN): zero their values with where() rather
    # than trust probability 0 (0 x NaN = NaN); on the CPU only the tail past the shortest length.
    lo = 0 if lengths.is_cuda else int(lengths.min())
    out = torch.einsum("bhgs,bhsd->bhgd", p[..., :lo], v[:, :, :lo].float())
    tail = torch.where(live[..., lo:].view(B, 1, S - lo, 1), v[:, :, lo:S].float(), 0.0)
    out = out + torch.einsum("bhgs,bhsd->bhgd", p[..., lo:], tail)
    return out.reshape(B, Hq, D).to(q.dtype)


def _gather_ref(q, k, v, pos, valid, scale):
    """Attend over key positions pos [B, H, N] (H = Hq or Hkv) with mask valid [B, H, N]."""
    B, Hq, D = q.shape
    Hkv, S = k.shape[1], k.shape[2]
    R = Hq // pos.shape[1]
    pos = pos.long().clamp(0, S - 1).repeat_interleave(R, 1)
    valid = valid.repeat_interleave(R, 1)
    kvh = (torch.arange(Hq, device=q.device) // (Hq // Hkv)).view(1, Hq, 1)
    bi = torch.arange(B, device=q.device).view(B, 1, 1)
    return _attend_ref(q, k[bi, kvh, pos], v[bi, kvh, pos], valid, scale)


def sparse_decode_tokens_ref(q, k, v, index, counts, scale):
    n = index.shape[-1]
    valid = torch.arange(n, device=q.device) < counts.unsqueeze(-1).long()
    return _gather_ref(q, k, v, index, valid, scale)


def sparse_decode_pages_ref(q, k, v, page_index, page_counts, page_size, lengths, scale):
    B, H, P = page_index.shape
    j = torch.arange(P * page_size, device=q.device)
    pos = page_index.long()[..., j // page_size] * page_size + j % page_size
    valid = (j // page_size < page_counts.unsqueeze(-1).long()) & (pos < lengths.view(B, 1, 1).long())
    return _gather_ref(q, k, v, pos, valid, scale)


def selection_attention_ref(q, k, v, lengths, scale, max_length=None):
    S = int(max_length) if max_length is not None else int(lengths.max())
    s = torch.where(_live(lengths, S), _logits_ref(q, k, S), float("-inf"))
    return decode_attention_ref(q, k, v, lengths, scale, S), s


# ----------------------------------------------------------------------------- public ops

def decode_attention(q, k, v, lengths, scale, *, max_length=None, num_splits=None, config=None):
    """Full decode attention. `max_length` (host int >= lengths.max()) sizes the split grid; when
    omitted it is read from `lengths`, which synchronises with the device once per call."""
    if backend_for(q) == "torch":
        return decode_attention_ref(q, k, v, lengths, scale, max_length)
    S = int(max_length) if max_length is not None else int(lengths.max())
    return _launch(q, k, v, lengths, scale, n_slots_max=S, kind="dense",
                   num_splits=num_splits, config=config)


def sparse_decode_tokens(q, k, v, index, counts, scale, *, num_splits=None, config=None):
    """Decode attention over token index sets: index int32 [B, H, Kmax] (H = Hq: one set per query
    head; H = Hkv: one set shared by the group), counts int32 [B, H]. Entries at or past the count
    are padding and never read (any value). A set of count 0 gives a zero output row."""
    if backend_for(q) == "torch":
        return sparse_decode_tokens_ref(q, k, v, index, counts, scale)
    return _launch(q, k, v, None, scale, index=index, counts=counts, n_slots_max=index.shape[-1],
                   kind="tokens", num_splits=num_splits, config=config)


def sparse_decode_pages(q, k, v, page_index, page_counts, page_size, lengths, scale, *,
                        num_splits=None, config=None):
    """Decode attention over page index sets (page p = tokens p*page_size .. +page_size-1, aligned to
    position 0); tokens at or past `lengths` (a partial last page) are masked. Shapes as in
    `sparse_decode_tokens`, with page numbers instead of token positions."""
    if backend_for(q) == "torch":
        return sparse_decode_pages_ref(q, k, v, page_index, page_counts, page_size, lengths, scale)
    return _launch(q, k, v, lengths, scale, index=page_index, counts=page_counts, page=page_size,
                   n_slots_max=page_index.shape[-1] * page_size, kind="pages",
                   num_splits=num_splits, config=config)


def topk_positions(scores, lengths, topk):
    """Second selection stage (torch.topk, not a custom kernel): top-`topk` positions per row of
    scores [B, H, S] (-inf past each length). Returns (index int32 [B, H, k], counts int32 [B, H])
    with k = min(topk, S), counts = min(k, length); the valid prefix is sorted by position (better
    DRAM locality for the sparse kernels) and padding slots hold 0."""
    B, H, S = scores.shape
    kk = min(int(topk), S)
    idx = scores.topk(kk, dim=-1, sorted=False).indices
    # Unsorted top-k: padding is recognised by its -inf score, not by its slot.
    pad = scores.gather(-1, idx) == float("-inf")
    counts = (~pad).sum(-1)
    idx = torch.where(pad, S, idx).sort(-1).values
    idx = torch.where(idx == S, 0, idx)
    return idx.to(torch.int32), counts.to(torch.int32).contiguous()


def selection_attention(q, k, v, lengths, scale, topk=None, *, max_length=None, num_splits=None,
                        config=None):
    """Full decode attention plus the UNSCALED pre-softmax scores q.k in fp32, [B, Hq, S] with
    S = max_length (default lengths.max()); columns at or past a sequence's length hold -inf.
    Scores come from the same pass over K as the output. Returns (out, scores), or with `topk`
    (out, scores, index, counts) from `topk_positions` (torch.topk second stage)."""
    B, Hq, D = q.shape
    S = int(max_length) if max_length is not None else int(lengths.max())
    if backend_for(q) == "torch":
        out, scores = selection_attention_ref(q, k, v, lengths, scale, S)
    else:
        scores = _empty(B, Hq, S, device=q.device, dtype=torch.float32)
        out = _launch(q, k, v, lengths, scale, scores=scores, n_slots_max=S, kind="dense",
                      num_splits=num_splits, config=config)
    if topk is None:
        return out, scores
    return (out, scores) + topk_positions(scores, lengths, topk)


def decode_attention_mass(q, k, v, lengths, scale, *, max_length=None, num_splits=None, config=None):
    """Full decode attention plus the attention probability of every slot, fp32 [B, Hq, S]
    (S = max_length; 0 past each length): the decode-time statistic of scoring methods (H2O's
    accumulated attention, TOVA's eviction score, Cascading's EMA). The probabilities come from the
    scores the attention pass writes (one pass over K/V) and one softmax over S floats per head,
    ~1/128 of the K/V bytes at head dim 128."""
    out, scores = selection_attention(q, k, v, lengths, scale, max_length=max_length,
                                      num_splits=num_splits, config=config)
    probs = torch.softmax(scores * scale, dim=-1)  # -inf past the length -> exactly 0
    return out, probs
