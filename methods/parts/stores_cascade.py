"""Cascading KV cache storage (methods/cascade.py) and the plans that update it.

Slots of one layer, per sequence and KV head (`CascadeStore`, keys UN-rotated):
    [0, S)                sink tokens (the first S tokens, kept forever)
    [S + i*W, S+(i+1)*W)  cascade (sub-cache) i, a ring buffer of W slots, i = 0..N-1
    S + N*W               staging: the decode token while the step attends (when the cache is full)
    S + N*W + 1           trash: where the fixed-size decode plan sends the writes of levels it does not reach
Filled slots always form a prefix [0, n_filled) (sinks fill first, then cascade 0, 1, ... by eager
fill), so the decode kernels read them by length, and the decode token is staged at slot n_filled.

The update rule is the reference kernel's (cascade/models/cascading_cache.py `_update_kv_cache`),
token by token: sinks first; then from cascade 0 upward, a cascade that accepts this token appends it
(not full) or puts it in place of its oldest entry and passes that one on (full; past the last cascade
it is dropped); a cascade that does not accept it stores it if empty, else keeps whichever of the token
and its newest entry has the higher score (ties: the token) and the token goes no further. While the
cache has seen at most sink + N*W + 1 tokens every cascade accepts every token ("eager fill"); after
that cascade i accepts the j-th non-sink token when (j - 1) % 2**i == 0.

Which slot an accepted token goes to, and which entry gets compared, depend only on the token count,
never on the scores: the per-cascade counters (stored, start) are the same for every sequence, head
and layer. So a step's update is a *plan* computed once and applied to every layer: items are the
step's sources (fixed items: an old slot or a new token) plus merge results ("the one of x and y
with the higher score"), and writes put items into slots. Applied per (sequence, head) by
`kernels.cascade_update.cascade_apply`: merges stage by stage, then the writes, deepest cascade first, so a
slot is always read before it is overwritten (items only ever move to deeper cascades).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

HIDDEN = 0          # rope position given to slots no query sees (any valid position: they are masked)


@dataclass
class Plan:
    """One step's update, as device tensors (int32) read by kernels.cascade_update.cascade_apply.

    Pool index p: p < slots -> the old content of store slot p; p >= slots -> new token p - slots.
    Item i < n_fixed -> pool index fixed[i]; item n_fixed + m -> the winner of merge m.
    Merge m: x = mx[m] (the incoming item), y = my[m] (the cache's newest entry); the winner is x
    when score(x) >= score(y). Merges are sorted by stage (stage_off[s]..stage_off[s+1]-1 depend only
    on earlier stages); writes (dst slot, item) by group (group_off), deepest cascade first."""

    fixed: torch.Tensor
    mx: torch.Tensor
    my: torch.Tensor
    stage_off: list[int]
    dst: torch.Tensor
    item: torch.Tensor
    group_off: list[int]
    stage_dev: torch.Tensor     # stage_off and group_off on the device (the Triton kernel reads them)
    group_dev: torch.Tensor

    @property
    def n_fixed(self) -> int:
        return self.fixed.numel()

    @property
    def n_merge(self) -> int:
        return self.mx.numel()


class CascadeLayout:
    """The token-count-dependent state of the cache (host ints) and the plans derived from it.

    `stored[i]`, `start[i]`: entries held by cascade i and the ring position of its oldest entry.
    `n_seen`: tokens pushed so far. A mirror of the counters lives on the device (`CascadeStore.ctr`)
    for the decode path, which runs without host ints (CUDA graphs); `sync_from` re-reads it."""

    def __init__(self, sink: int, cascades: int, window: int):
        self.S, self.N, self.W = int(sink), int(cascades), int(window)
        self._offsets = None
        self.reset()

    def prepare(self, device) -> None:
        """The decode plan's fixed stage/group offsets on the device, made (and refilled) at setup: a
        CUDA-graph capture must not copy host data, and a reused method must not trust old contents."""
        if self._offsets is None or self._offsets[0].device != torch.device(device):
            self._offsets = (torch.empty(2, dtype=torch.int32, device=device),
                             torch.empty(self.N + 2, dtype=torch.int32, device=device))
        self._offsets[0].copy_(torch.arange(2, dtype=torch.int32))
        self._offsets[1].copy_(torch.arange(self.N + 2, dtype=torch.int32))

    def offsets(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self._offsets

    def reset(self) -> None:
        self.stored = [0] * self.N
        self.start = [0] * self.N
        self.n_seen = 0

    @property
    def cache(self) -> int:
        return self.N * self.W

    @property
    def staging(self) -> int:
        return self.S + self.cache

    @property
    def trash(self) -> int:
        return self.S + self.cache + 1

    @property
    def slots(self) -> int:
        return self.S + self.cache + 2

    @property
    def n_filled(self) -> int:
        return min(self.n_seen, self.S) + sum(self.stored)

    def accepts(self, g: int, i: int) -> bool:
        """Does cascade i accept the token of absolute index g (>= S)?"""
        j = g - self.S + 1
        return j <= self.cache + 1 or (j - 1) % (1 << i) == 0

    # --- positions ---------------------------------------------------------------------------------
    def positions(self) -> list[int]:
        """In-cache position of every slot (HIDDEN for empty ones): sinks 0..S-1, then the cascades in
        cache order, contiguous: the deepest cascade first, each ring from its oldest entry, cascade
        0's newest entry last (the reference's `_update_positional_idx`, shifted by the sinks)."""
        S, W = self.S, self.W
        out = [HIDDEN] * self.slots
        for s in range(min(self.n_seen, S)):
            out[s] = s
        deeper = 0
        for i in reversed(range(self.N)):
            n, st = self.stored[i], self.start[i]
            for r in range(n):
                out[S + i * W + (st + r) % n] = S + deeper + r
            deeper += n
        return out

    # --- prefill: the plan of a chunk of T tokens (host, shared by all layers) ----------------------
    def chunk_plan(self, T: int, selection: bool, device, by_token: bool = False) -> Plan:
        """Push tokens n_seen..n_seen+T-1 (new tokens 0..T-1 of the step) and advance the counters.
        `by_token`: the reference's token loop instead of the cascade-by-cascade builder (same plan)."""
        from methods.parts.cascade_plan import plan_by_level, plan_by_token

        hp = (plan_by_token if by_token else plan_by_level)(self, T, selection)
        return to_device(hp, device)

    # --- decode: one token, everything on the device from the counters (CUDA-graph safe) ------------
    def device_step(self, ctr: torch.Tensor, p: torch.Tensor, selection: bool):
        """For the token at absolute position p ([1] int64, device) and the counters ctr [2, N]
        before it: (plan, in-cache positions [slots], n_filled [1], counters after it). Fixed shapes:
        item 0 is the token, item i+1 the old content of level i's destination; levels the token
        does not reach write to the trash slot."""
        S, N, W, dev = self.S, self.N, self.W, ctr.device
        stored, start = ctr[0], ctr[1]
        lev = torch.arange(N, device=dev)
        j = p - S + 1                                             # 1-based non-sink index
        is_sink = p < S
        acc = (j <= self.cache + 1) | (torch.bitwise_and(j - 1, (1 << lev) - 1) == 0)
        full, empty = stored == W, stored == 0
        cont = acc & full                                         # the evicted entry goes on
        reach = torch.cat([~is_sink, (~is_sink) & torch.cumprod(cont[:-1].long(), 0).bool()]) if N > 1 else ~is_sink
        append = reach & acc & ~full
        evict = reach & acc & full
        store_empty = reach & ~acc & empty
        merge = reach & ~acc & ~empty
        base = S + lev * W
        newest = base + torch.remainder(start - 1, stored.clamp(min=1))
        dst = torch.where(append, base + stored, torch.where(evict, base + start, torch.where(
            store_empty, base, torch.where(merge, newest, torch.full_like(base, self.trash)))))
        arriving = lev                                            # item arriving at level i: 0, 1, ..., N-1
        has_merge = merge.any()
        k = torch.argmax(merge.long())                            # the merge level (if any)
        # index_select, not arriving[k]: a 0-d tensor index is read on the host (a sync, refused in capture)
        mx = torch.where(has_merge, arriving.index_select(0, k.view(1)), 0).view(1)
        my = torch.where(has_merge, k + 1, 0).view(1)
        win = torch.full_like(lev, N + 1) if selection else arriving
        item = torch.where(merge, win, arriving)
        sink_dst = torch.where(is_sink, p, torch.full_like(p, self.trash))
        fixed = torch.cat([torch.full((1,), self.slots, device=dev, dtype=torch.long), dst])
        plan = Plan(fixed.int(), mx.int(), my.int(), [0, 1],
                    torch.cat([dst.flip(0), sink_dst]).int(), torch.cat([item.flip(0), torch.zeros_like(p)]).int(),
                    list(range(N + 2)), *self._offsets)
        # positions before the token goes in, the token itself at n_filled (its staging slot)
        n_filled = torch.clamp(p, max=S) + stored.sum()
        icp = self._device_positions(stored, start, p)
        icp = torch.where(torch.arange(self.slots, device=dev) == n_filled, n_filled, icp)
        new = torch.stack([stored + (append | store_empty).long(),
                           torch.where(evict, torch.remainder(start + 1, W), start)])
        return plan, icp, n_filled, new

    def _device_positions(self, stored, start, p) -> torch.Tensor:
        S, W, dev = self.S, self.W, stored.device
        k = torch.arange(W, device=dev)
        rank = torch.remainder(k.view(1, -1) - start.view(-1, 1), stored.clamp(min=1).view(-1, 1))
        deeper = stored.flip(0).cumsum(0).flip(0) - stored       # entries held by deeper cascades
        lvl = torch.where(k.view(1, -1) < stored.view(-1, 1), S + deeper.view(-1, 1) + rank, HIDDEN)
        s = torch.arange(S, device=dev)
        sinks = torch.where(s < p, s, HIDDEN)
        tail = torch.full((2,), HIDDEN, device=dev, dtype=torch.long)
        return torch.cat([sinks, lvl.flatten(), tail])

    def sync_from(self, ctr: torch.Tensor, n_seen: int) -> None:
        """Host counters from the device mirror [2, N] (stored, start) after decode steps."""
        rows = ctr.tolist()
        self.stored, self.start = [int(x) for x in rows[0]], [int(x) for x in rows[1]]
        self.n_seen = int(n_seen)


def to_device(hp, device) -> Plan:
    """A host plan (methods/parts/cascade_plan.py) as the kernel reads it: merges renumbered after the
    fixed items in stage order, writes grouped deepest cascade first (sinks last)."""
    F = hp.n_fixed
    mx, my, st = hp.merges()
    order = np.argsort(st, kind="stable")
    final = np.empty(order.size, dtype=np.int64)
    final[order] = F + np.arange(order.size)

    def rid(a: np.ndarray) -> np.ndarray:
        a = a.copy()
        neg = a < 0
        a[neg] = final[-a[neg] - 1]
        return a

    sts = st[order]
    stage_off = [0] + (np.nonzero(np.diff(sts))[0] + 1).tolist() + [int(sts.size)] if sts.size else [0]
    dst, item, group_off = [], [], [0]
    for lvl in sorted(hp.writes, reverse=True):
        s, it = hp.writes[lvl]
        if lvl == -1:
            continue
        dst.append(s)
        item.append(rid(it))
        group_off.append(group_off[-1] + s.size)
    if -1 in hp.writes:                                    # sinks: never a source, written last
        s, it = hp.writes[-1]
        dst.append(s)
        item.append(rid(it))
        group_off.append(group_off[-1] + s.size)

    def t32(x):
        x = np.concatenate(x) if isinstance(x, list) else x
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.int32)).to(device)

    return Plan(t32(hp.fixed_pool()), t32(rid(mx[order])), t32(rid(my[order])), stage_off,
                t32(dst if dst else [np.zeros(0)]), t32(item if item else [np.zeros(0)]), group_off,
                t32(np.array(stage_off)), t32(np.array(group_off)))


class CascadeStore:
    """Per layer: k, v [layers, B, Hkv, slots, D] (un-rotated), score [layers, B, Hkv, slots] fp32 (the
    EMA attention score of each cascade entry; sinks have none), tok [layers, B, Hkv, slots] int64
    (the absolute position each slot holds, -1 empty: diagnostics and the oracle test). `ctr` [2, N]
    int64: the device mirror of the layout's counters (stored, start) that the decode path reads and
    advances. `allocate` resets score, tok and ctr; k/v of empty slots are whatever was there:
    readers mask them by length."""

    def __init__(self):
        self.k = self.v = self.score = self.tok = self.ctr = None

    def allocate(self, layers: int, batch: int, kv_heads: int, slots: int, head_dim: int, cascades: int,
                 device, dtype) -> None:
        shape = (layers, batch, kv_heads, slots, head_dim)
        if not (self.k is not None and self.k.shape == shape and self.k.dtype == dtype
                and self.k.device == torch.device(device)):
            self.k = torch.empty(shape, device=device, dtype=dtype)
            self.v = torch.empty(shape, device=device, dtype=dtype)
            self.score = torch.empty(shape[:-1], device=device, dtype=torch.float32)
            self.tok = torch.empty(shape[:-1], device=device, dtype=torch.long)
        if self.ctr is None or self.ctr.shape != (2, cascades) or self.ctr.device != torch.device(device):
            self.ctr = torch.empty(2, cascades, device=device, dtype=torch.long)
        self.score.zero_()
        self.tok.fill_(-1)
        self.ctr.zero_()

    def buffers(self) -> dict[str, torch.Tensor]:
        return {"k": self.k, "v": self.v, "score": self.score, "tok": self.tok, "ctr": self.ctr}
