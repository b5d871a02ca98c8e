"""BigBird-style sparse attention (Zaheer et al. 2020), the Cascading KV Cache paper's "BigBird"
baseline: every query, in prefill and decode, attends to `sink` global tokens at the start, a window
of the most recent tokens (itself included) and `random` tokens drawn from the span between them.

Cascading's BigBird code is not in the public snapshot we read (methods.md §6.2 lists it; the paper
only says "a sliding window with random sparse context" and, for PG-19, "stepping through the entire
sequence with a stride equivalent to the total cache size"). So the pattern is this harness's reading
of the BigBird paper at token granularity: global = the first tokens (ITC), default `sink` 64 as
Cascading's scripts, and the rest split equally between window and random (BigBird's 3 window + 3
random blocks). Random tokens are one per equal stratum of the middle span (no repeats), chosen by
an integer hash of (seed, layer, query block, head, stratum): per query head, reproducible, identical
on CPU and GPU and inside a CUDA graph; `pick=strided` takes each stratum's first token instead.

`draw: block` (default): as BigBird's blocked ITC, the random tokens are drawn once per query block of
`query_block` positions and shared by its rows: the strata split [sink, A + 1 - window), A = the block's
first position (at least budget - 1), so each row still attends exactly sink + window + random distinct
tokens (a row past A leaves the <= query_block - 1 tokens between A's window and its own unread). Its
prefill is the block-sparse kernel (kernels/block_sparse_prefill.py `banded_index`): per (query block,
head) the sinks and the rows' window as contiguous pieces and the block's random tokens as gathered
columns, tensor-core tiles, reading only those (issue 34: 13x full's prefill before). `draw: query`
(the earlier rule) draws per query position: no two rows share a random token, so its prefill runs each
row as a decode over its own set (T x Hq x budget gathered rows, no tile reuse: ~9-13x full's).

Storage: every token (a random pick may reach any of them), keys rotated at their positions; with
`block` set the text is read in independent blocks of that many tokens from position 0 (the strided
PG-19 rows), the store holds one block and BigBird then reads any length.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

import kernels
from common.errors import ConfigError, HarnessError
from kernels import block_sparse_prefill as KB
from methods.base import Method, register
from methods.config import ChunkedPrefill, option
from methods.parts.stores import FullStore

_ELEMS = 1 << 24  # gathered key elements per block of prefill queries (bounds the torch path's memory)
_INDEX = 1 << 25  # index entries per block of prefill queries on the GPU (int64 temporaries: 256 MiB each)
_SETS = 1 << 24   # draw=block kernel prefill: set entries per slice of query blocks (int64: 128 MiB each)


@dataclass(frozen=True)
class BigBirdConfig(ChunkedPrefill):
    """BigBird-style sparse attention (the Cascading paper's BigBird baseline): each query attends `sink`
    global tokens + a recent window + `random` tokens from between them, per query head, in prefill and
    decode. Budget = tokens attended per query head (sink + window + random, the current token in the
    window)."""

    budget: int = option(4096, "tokens attended per query head: sink + window + random", min=3)
    sink: int = option(64, "global tokens: the first ones (of the block) (Cascading's scripts: 64)", min=0)
    random: int | None = option(None, "random tokens per query (null = (budget - sink) // 2: BigBird's equal "
                                "window/random split)", min=1)
    pick: str = option("random", "random: a hashed token per stratum of the middle span; strided: each stratum's "
                       "first token", choices=("random", "strided"))
    seed: int = option(0, "seed of the random picks")
    block: int | None = option(None, "read in independent blocks of this many tokens from position 0 (the strided "
                               "PG-19 rows; null = one sequence)", min=1)
    draw: str = option("block", "block: random picks drawn per query block of query_block positions, shared by its "
                       "rows (BigBird's blocked form; block-sparse prefill kernel); query: per query position",
                       choices=("block", "query"))
    query_block: int = option(64, "draw=block: query positions sharing one draw (the prefill kernel's tile)", min=1)

    @property
    def n_random(self) -> int:
        return self.random if self.random is not None else (self.budget - self.sink) // 2

    @property
    def window(self) -> int:
        return self.budget - self.sink - self.n_random

    def check(self, info):
        if self.window < 1:
            raise ConfigError(f"method.budget={self.budget} leaves no window after sink={self.sink} and "
                              f"random={self.n_random}")
        if self.block is not None and self.block > info.max_position:
            raise ConfigError(f"method.block={self.block} exceeds the model's {info.max_position} positions")
        if self.block is not None and self.prefill_chunk is not None and self.block % self.prefill_chunk:
            raise ConfigError(f"method.prefill_chunk={self.prefill_chunk} must divide method.block={self.block}")

    def max_context(self, info):
        return None if self.block is not None else info.max_position

    def describe(self):
        return {"budget_unit": "tokens attended per query head (sink + window + random; current token in the window)",
                "sink": self.sink, "window_effective": self.window, "random_effective": self.n_random,
                "pattern": f"{self.pick} picks, one per equal stratum between sink and window, drawn per "
                           + ("query position" if self.draw == "query" else
                              f"query block of {self.query_block} (strata end at the block start's window)")
                           + "; prefill and decode",
                "prefill_kernel": ("block-sparse: sinks + window pieces + the block's picks as columns (CUDA)"
                                   if self.draw == "block" else "each row a decode over its own set"),
                "positions": "original" if self.block is None else f"from 0 in each block of {self.block}",
                "storage": "every token" if self.block is None else "one block"}

    @classmethod
    def variants(cls):
        return [{"budget": 16, "sink": 2, "random": 6, "query_block": 4},
                {"budget": 12, "sink": 0, "pick": "strided", "prefill_chunk": 16, "query_block": 8},
                {"budget": 10, "sink": 2, "random": 3, "block": 24, "draw": "query"}]

    def full_equivalent(self, context):
        return {"budget": max(self.budget, context), "block": None}


def anchors(r: torch.Tensor, qb: int | None, budget: int) -> torch.Tensor:
    """Where each query's strata end (at anchor + 1 - window): the query itself (draw=query, qb None) or its
    query block's first position, at least budget - 1 (so a sparse row's middle span holds n_random)."""
    return r if qb is None else torch.clamp(r // qb * qb, min=budget - 1)


def stratified(r: torch.Tensor, sink: int, window: int, n_random: int, budget: int, salt: torch.Tensor | None,
               anchor: torch.Tensor | None = None):
    """Attended in-block positions for queries at in-block positions r [T]: (index [T, H, budget], counts
    [T, H]) with H = salt.shape[1] (or 1). A query that sees <= budget tokens attends all of them;
    otherwise sink + one pick per stratum of [sink, a + 1 - window) + the window, sorted (a = anchor, r
    when None; a <= r for every sparse row)."""
    T, dev = r.numel(), r.device
    H = 1 if salt is None else salt.shape[1]
    r = r.view(T, 1, 1)
    a = r if anchor is None else anchor.view(T, 1, 1)
    m = a + 1 - window - sink                                        # middle span, >= n_random when sparse
    j = torch.arange(n_random, device=dev).view(1, 1, -1)
    lo = sink + j * m // n_random
    width = sink + (j + 1) * m // n_random - lo
    pick = lo if salt is None else lo + torch.remainder(_hash(salt.unsqueeze(-1) + j * 0x2545F491), width.clamp(min=1))
    parts = [torch.arange(sink, device=dev).view(1, 1, -1).expand(T, H, sink), pick.expand(T, H, n_random),
             (r - window + 1 + torch.arange(window, device=dev).view(1, 1, -1)).expand(T, H, window)]
    sparse = torch.cat(parts, -1)
    dense = torch.arange(budget, device=dev).view(1, 1, -1).expand(T, H, budget)
    few = (r + 1 <= budget)
    index = torch.where(few, dense, sparse)
    counts = torch.where(few.view(T, 1), r.view(T, 1) + 1, budget).expand(T, H)
    return index.to(torch.int32), counts.to(torch.int32).contiguous()


def _hash(x: torch.Tensor) -> torch.Tensor:
    """A 64-bit integer mix (splitmix64's finaliser; wrapping int64 arithmetic): non-negative output."""
    x = x * -7046029254386353131 + 0x632BE59BD9B4E019
    x = (x ^ (x >> 30)) * -4658895280553007687
    x = (x ^ (x >> 27)) * -7723592293110705685
    return (x ^ (x >> 31)) & 0x7FFFFFFFFFFFFFFF


@register
class BigBird(Method):
    name = "bigbird"
    Config = BigBirdConfig
    graph_safe = True  # decode: index sets from the device position, fixed shapes
    decode_idempotent = True  # a decode step writes only its own in-block slot

    @property
    def prefill_chunk(self):
        c = self.cfg
        return min(c.prefill_chunk or c.block, c.block) if c.block is not None else c.prefill_chunk

    def setup(self, info, batch, max_len, device, dtype):
        self.info, self.batch = info, batch
        self.store = getattr(self, "store", None) or FullStore()
        cap = self.cfg.block if self.cfg.block is not None else max_len
        self.store.allocate(info.num_layers, batch, info.num_kv_heads, cap, info.head_dim, device, dtype)

    def buffers(self):
        return self.store.buffers()

    def begin(self, step):
        super().begin(step)
        b = self.cfg.block
        if b is not None and step.phase != "decode" and step.start // b != (step.end - 1) // b:
            raise HarnessError(f"bigbird block={b}: a prefill chunk of {step.start}..{step.end} crosses a block "
                               f"(chunk lengths must divide the block)")
        self.r = step.positions % b if b is not None else step.positions  # in-block position = slot
        self.dec_sets = self.sets_all_layers(step.positions, self.r) if step.phase == "decode" else None

    def _draw(self, positions: torch.Tensor, r: torch.Tensor):
        """(what the hash of a draw is keyed on, the strata's anchors): the position itself (draw=query) or the
        absolute position of the query block's first in-block row (draw=block)."""
        c = self.cfg
        if c.draw == "query":
            return positions, anchors(r, None, c.budget)
        return positions - r % c.query_block, anchors(r, c.query_block, c.budget)

    def sets_all_layers(self, positions: torch.Tensor, r: torch.Tensor):
        """A decode step's sets of every layer at once ([layers, Hq, budget], [layers, Hq]): the same
        picks as `sets` per layer, in ~30 kernels per step instead of per layer."""
        c, Hq, L = self.cfg, self.info.num_heads, self.info.num_layers
        key, anchor = self._draw(positions, r)
        salt = None
        if c.pick == "random":
            layer = torch.arange(L, device=r.device).view(L, 1)
            head = torch.arange(Hq, device=r.device).view(1, Hq)
            salt = _hash(_hash(key.view(1, 1) + (c.seed << 20) + (layer << 40)) + head).view(1, L * Hq)
        index, counts = stratified(r, c.sink, c.window, c.n_random, c.budget, salt, anchor)
        return index.expand(-1, L * Hq, -1).reshape(L, Hq, -1), counts.expand(-1, L * Hq).reshape(L, Hq)

    def sets(self, layer: int, positions: torch.Tensor, r: torch.Tensor):
        """(index [T, Hq, budget], counts [T, Hq]) for queries at absolute `positions` / in-block `r`."""
        c, Hq = self.cfg, self.info.num_heads
        key, anchor = self._draw(positions, r)
        salt = None
        if c.pick == "random":
            head = torch.arange(Hq, device=r.device).view(1, Hq)
            salt = _hash(_hash(key.view(-1, 1) + (c.seed << 20) + (layer << 40)) + head)
        index, counts = stratified(r, c.sink, c.window, c.n_random, c.budget, salt, anchor)
        return index.expand(-1, Hq, -1), counts.expand(-1, Hq)

    def attend(self, layer, q, k, v, rope):
        step, S, B, c = self.step, self.store, q.shape[0], self.cfg
        q, k = rope.apply(q, self.r), rope.apply(k, self.r)
        S.write(layer, self.r, k, v)                   # chunks never cross a block (prefill_chunk)
        if step.phase == "decode":
            index, counts = self.dec_sets[0][layer], self.dec_sets[1][layer]
            self.record(layer, counts.float().mean())
            out = kernels.sparse_decode_tokens(q[:, :, 0].contiguous(), S.k[layer], S.v[layer],
                                               index.expand(B, -1, -1).contiguous(),
                                               counts.expand(B, -1).contiguous(), self.info.scaling)
            return out.view(B, 1, -1)
        if c.draw == "block" and kernels.backend_for(q) == "triton":
            return self._prefill_kernel(layer, q)
        # draw=query (or the torch backend): every query is a decode over its own set (the chunk's keys are already written), in
        # blocks of rows whose index sets are built per block: the whole chunk's [T, Hq, budget] sets
        # were 16 GiB at 32K and 63 GiB at 128K. The kernel reads the store in place, so only the sets
        # bound a block on the GPU; the torch reference also gathers the keys (x D).
        T, Hq, D = q.shape[2], q.shape[1], q.shape[3]
        per_row = Hq * self.cfg.budget * (D if not q.is_cuda else 1)
        rows = max(1, (_ELEMS if not q.is_cuda else _INDEX) // per_row)
        out = torch.empty(B, T, Hq * D, device=q.device, dtype=q.dtype)
        for t0 in range(0, T, rows):
            t1 = min(T, t0 + rows)
            index, counts = self.sets(layer, step.positions[t0:t1], self.r[t0:t1])
            index, counts = index.contiguous(), counts.contiguous()
            for b in range(B):
                kb = S.k[layer, b:b + 1].expand(t1 - t0, -1, -1, -1)
                vb = S.v[layer, b:b + 1].expand(t1 - t0, -1, -1, -1)
                qb = q[b, :, t0:t1].transpose(0, 1).contiguous()
                o = kernels.sparse_decode_tokens(qb, kb, vb, index, counts, self.info.scaling)
                out[b, t0:t1] = o.reshape(t1 - t0, Hq * D)
        return out

    def _prefill_kernel(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """draw=block on the block-sparse prefill kernel: per query block the sinks, each row's window and the
        block's picks (the middle of `sets` for a sparse row of the block: the same draw), in slices of rows
        whose sets [query blocks, Hq, budget] stay under _SETS entries (int64 temporaries bound memory)."""
        c, S, step = self.cfg, self.store, self.step
        B, Hq, T, D = q.shape
        bs, r0 = c.query_block, step.start % c.block if c.block is not None else step.start
        rows = max(1, _SETS // (Hq * c.budget)) * bs
        out = torch.empty(B, T, Hq * D, device=q.device, dtype=q.dtype)
        for t0 in range(0, T, rows):
            t1 = min(T, t0 + rows)
            first, last = (r0 + t0) // bs, (r0 + t1 - 1) // bs
            start = torch.arange(first, last + 1, device=q.device) * bs      # each query block's first in-block row
            pos = step.positions[0] - r0 + start                             # and its absolute position
            r = torch.clamp(start, min=c.budget)     # a sparse row of the block (inside it when the block has one)
            index, _ = self.sets(layer, pos + r - start, r)
            picks = index[:, :, c.sink:c.sink + c.n_random].permute(1, 0, 2)    # [Hq, Q, random]
            live = torch.where(start + bs - 1 >= c.budget, c.n_random, 0)       # blocks holding a sparse row
            idx = KB.banded_index(r0 + t0, t1 - t0, r0 + t1, B, bs, c.sink, c.window, c.budget, picks, live,
                                  q.device)
            out[:, t0:t1] = KB.mixed_sparse_attention(q[:, :, t0:t1], S.k[layer], S.v[layer], idx, self.info.scaling)
        return out
