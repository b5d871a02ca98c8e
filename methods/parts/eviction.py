"""The eviction family's shared part (kvpress's ScorerPress is the model: a press states a score, the
base prunes). A method here states only its rule (`KeepRule`):

  score(probs)          attention probabilities of the scoring queries [B, Hq, N] -> one score per
                        store head [B, H, N] (higher stays)
  protected(pos, last)  bool [B, H, N] (or None): tokens that never leave (H2O's recent window,
                        SnapKV's observation window)
  accumulate            scores add up over queries and steps, kept with the tokens in the store
                        (H2O), or each decision reads the current step's scores only (TOVA)
  score_rows / rows(T)  which prefill queries score: "all" rows of the chunk (column sums), the
                        chunk's "last" row, or (overriding `rows`) its last `window` (SnapKV)
  keep_count(layer, N)  how many of N candidates a layer keeps after a prefill chunk: `budget`, or a
                        rule's own (SnapKV: a short prompt whole; PyramidKV: a per-layer schedule)

and its `budget` option. The shared keep (`KeepRule.keep`, the same for every rule): after each prefill
chunk, over the `[kept | chunk]` candidates (the previous chunks' survivors precede the chunk, so plain
causal attention over them is SDPA's fused path), the scoring rows' attention mass, the rule's score,
every protected candidate kept, then the highest scores, ties to the earlier token; kept in position
order. Two stores and decodes use it:

  EvictionMethod        a bounded store of budget + 1 slots per KV head (the extra one takes the
                        incoming token), the length clamp, and in decode the arg-min victim whose slot
                        the next token takes (TOVA, H2O); `shifted`: keys stored un-rotated and
                        re-rotated at their rank in the cache every step (H2O's _streaming variant)
  PromptCompression     the prompt compressed after each prefill chunk, then dense decode over what was
                        kept plus every generated token, in a store sized by what the rule keeps, per KV
                        or per query head (SnapKV, PyramidKV)

Decode is graph safe in both: lengths, scores, victims and offsets stay on the device. Tested through
each method's oracle test (tests/test_methods_{tova,h2o,snapkv}.py, a toy rule in
tests/test_methods_eviction.py), the conformance suite and tests/test_methods_storage.py.
"""
from __future__ import annotations

from typing import ClassVar

import torch

import kernels
from methods.base import Method
from methods.parts.rope_rows import apply_rows, ranks
from methods.parts.selection import top_first
from methods.parts.stores import BoundedStore
from methods.parts.stores_growing import GrowingStore


def kept_and_chunk(k_kept: torch.Tensor, v_kept: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The candidates of a prefill chunk: the previous chunks' survivors (k_kept, v_kept [B, H, n_old, D])
    then the chunk (k, v [B, H, T, D]), and the key positions for `kernels.attention_mass`: the survivors
    visible to every query (0), the chunk at its own `positions` [T]. Attention over the candidates is
    then plain causal (survivors first), SDPA's fused path, without these positions."""
    n_old = k_kept.shape[2]
    k_pos = torch.cat([torch.zeros(n_old, dtype=torch.long, device=k.device), positions])
    if n_old == 0:
        return k, v, k_pos
    return torch.cat([k_kept, k], 2), torch.cat([v_kept, v], 2), k_pos


class KeepRule(Method):
    """The rule (what a method states) and the keep it decides over a prefill chunk's candidates, shared
    by the bounded-store eviction (`EvictionMethod`) and the prompt compression (`PromptCompression`)."""

    accumulate: ClassVar[bool] = False
    score_rows: ClassVar[str] = "all"

    # --- the rule: what a method states ------------------------------------------------------------------
    def score(self, probs: torch.Tensor) -> torch.Tensor:
        """Attention probabilities [B, Hq, N] (summed over the scoring queries) -> [B, H, N], H the
        store's heads."""
        raise NotImplementedError

    def protected(self, pos: torch.Tensor, last: torch.Tensor) -> torch.Tensor | None:
        """Which candidates (original positions `pos` [B, H, N]; `last` [1] the newest position) never
        leave. None: nothing is protected, the incoming token included."""
        return None

    def rows(self, T: int) -> slice:
        """The queries of a T-token prefill chunk that score (score_rows: all of them, or the last)."""
        return slice(None) if self.score_rows == "all" else slice(-1, None)

    def keep_count(self, layer: int, N: int) -> int:
        """How many of N candidates a layer keeps after a prefill chunk (at most N)."""
        return self.cfg.budget

    # --- the keep ----------------------------------------------------------------------------------------
    def _ranked(self, score: torch.Tensor, pos: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        keep = self.protected(pos, last)
        return score if keep is None else torch.where(keep, float("inf"), score)

    def keep(self, layer: int, q: torch.Tensor, keys: torch.Tensor, pos: torch.Tensor, last: torch.Tensor,
             q_pos: torch.Tensor, k_pos: torch.Tensor, carried: torch.Tensor | None = None,
             mass: torch.Tensor | None = None):
        """(index [B, H, n] of the kept candidates in position order, their scores [B, H, N]): the scoring
        rows of q [B, Hq, T, D] attend the candidate keys [B, Hkv or H, N, D] (positions as
        `kernels.attention_mass` takes them, candidates in position order, at original positions `pos`
        [B, H, N]); the rule scores them (plus `carried`, the scores an accumulating rule kept); every
        protected candidate stays, then the highest scores, ties to the earlier token (`top_first`: the
        same choice alone or in a batch, on any device)."""
        if mass is None:   # else the caller computed the scoring rows' mass with the attention (H2O's prefill)
            rows = self.rows(q.shape[2])
            mass = kernels.attention_mass(q[:, :, rows], keys, self.info.scaling, q_pos=q_pos[rows], k_pos=k_pos)
        score = self.score(mass)
        if carried is not None:
            score = score + carried
        n = min(score.shape[-1], self.keep_count(layer, score.shape[-1]))
        return top_first(self._ranked(score, pos, last), n).sort(-1).values, score


class EvictionMethod(KeepRule):
    graph_safe = True  # decode: device lengths, per-head victim slots chosen on the device
    shifted: bool = False

    # --- the shared part ---------------------------------------------------------------------------------
    @property
    def budget(self) -> int:
        return self.cfg.budget

    def setup(self, info, batch, max_len, device, dtype):
        self.info, self.batch = info, batch
        self.cap = self.budget + 1
        self.store = getattr(self, "store", None) or BoundedStore()
        self.store.allocate(info.num_layers, batch, info.num_kv_heads, self.cap, info.head_dim, device, dtype)
        self.free = torch.zeros(info.num_layers, batch, info.num_kv_heads, dtype=torch.long, device=device)

    def buffers(self):
        return {**self.store.buffers(), "free": self.free}

    def fused(self) -> dict | None:
        """The rule as `kernels.eviction_decode` computes it in one launch after the attention (pool,
        shared, window: kernels/eviction_step.py), or None: the rule's own `score`/`protected` ops."""
        return None

    def begin(self, step):
        super().begin(step)
        # tokens present once this step's token is in: a prefix of the slots (the length clamp)
        self.lengths = torch.clamp(step.positions[-1:] + 1, max=self.cap).to(torch.int32).expand(self.batch).contiguous()
        # shifted: the query sits at the cache length (its own rank), every slot at its rank
        self.q_pos = torch.clamp(step.positions, max=self.cap - 1) if self.shifted else None

    def attend(self, layer, q, k, v, rope):
        step = self.step
        if not self.shifted:
            k = rope.apply(k, step.positions)
        if step.phase == "decode":
            return self._decode(layer, q, k, v, step.positions, rope)
        return self._prefill(layer, q, k, v, step.positions, step.start, rope)

    def _decode(self, layer, q, k, v, position, rope):
        S, B = self.store, q.shape[0]
        # the slot's key, value, position and zero score in one launch (BoundedStore.put's four scatters)
        kernels.bounded_put(S.k[layer], S.v[layer], S.pos[layer], S.score[layer], self.free[layer], k, v, position)
        keys = S.k[layer]
        if self.shifted:
            keys = apply_rows(rope, keys, ranks(S.pos[layer], self.lengths.view(B, 1, 1).long()))
            q = rope.apply(q, self.q_pos)
        else:
            q = rope.apply(q, position)
        self.record(layer, self.lengths)
        q1, rule = q[:, :, 0].contiguous(), self.fused()
        if rule is not None:   # scoring, accumulation, protection and arg-min victim fused after the attention
            out = kernels.eviction_decode(q1, keys, S.v[layer], self.lengths, self.info.scaling, S.score[layer],
                                          S.pos[layer], self.free[layer], position, cap=self.cap,
                                          accumulate=self.accumulate, **rule)
            return out.view(B, 1, -1)
        out, probs = kernels.decode_attention_mass(q1, keys, S.v[layer], self.lengths, self.info.scaling,
                                                   max_length=self.cap)
        score = self.score(probs)
        if self.accumulate:
            S.score[layer] += score
            score = S.score[layer]
        # Full (budget + 1 tokens): the lowest-ranked unprotected token leaves and its slot takes the
        # next token; otherwise the next token takes the next empty slot.
        victim = self._ranked(score, S.pos[layer], position).argmin(-1)
        full = (self.lengths == self.cap).view(B, 1)
        self.free[layer] = torch.where(full, victim, self.lengths.view(B, 1).long())
        return out.view(B, 1, -1)

    def _prefill(self, layer, q, k, v, positions, start, rope):
        S = self.store
        B, Hkv, T = q.shape[0], self.info.num_kv_heads, positions.numel()
        n_old = min(start, self.budget)              # what the previous chunks left (host int: never graphed)
        keys, values, _ = kept_and_chunk(S.k[layer, :, :, :n_old], S.v[layer, :, :, :n_old], k, v, positions)
        pos = torch.cat([S.pos[layer, :, :, :n_old], positions.view(1, 1, T).expand(B, Hkv, T)], 2)
        q_pos = positions
        if self.shifted:  # old kept tokens at their ranks, the chunk right after them
            q_pos = positions - start + n_old
            q = rope.apply(q, q_pos)
            rotated = apply_rows(rope, keys, ranks(pos, n_old + T))
        else:
            q = rope.apply(q, positions)
            rotated = keys
        k_pos = torch.cat([torch.zeros(n_old, dtype=torch.long, device=q.device), q_pos])  # old: all visible
        # the kept tokens precede the chunk: [kept | chunk] is plain causal attention, SDPA's fused path
        # without the [T, n_old + T] mask that k_pos spells out (the mass below needs it: no fused path)
        if self.rows(T) == slice(None):   # every row scores (H2O): flash's lse + one causal column pass (issue 34)
            out, mass = kernels.causal_attention_mass(q, rotated, values, self.info.scaling)
        else:
            out, mass = kernels.prefill_attention(q, rotated, values, self.info.scaling), None
        carried = None
        if self.accumulate:
            carried = torch.cat([S.score[layer, :, :, :n_old], torch.zeros(B, Hkv, T, device=q.device)], 2)
        index, score = self.keep(layer, q, rotated, pos, positions[-1:], q_pos, k_pos, carried, mass)
        n = index.shape[-1]
        S.keep(layer, index, keys, values, pos, score)
        self.free[layer] = n
        return out


def gather_heads(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Rows `index` [B, H, n] of x [B, Hx, N, D], H a multiple of Hx (query head h reads KV head
    h // (H / Hx)): the repeat is a stride-0 view, so a long prompt's KV is never copied per query head."""
    B, Hx, N, D = x.shape
    H, n = index.shape[1], index.shape[2]
    g = H // Hx
    rows = index.view(B, Hx, g, n, 1).expand(B, Hx, g, n, D)
    return x.unsqueeze(2).expand(B, Hx, g, N, D).gather(3, rows).reshape(B, H, n, D)


class PromptCompression(KeepRule):
    """The prompt compressed by the rule's keep after each prefill chunk (once, for a prompt in one
    forward), then dense decode over what was kept plus every generated token (SnapKV, PyramidKV). A rule
    may keep a set per query head (`store_heads`): the store then holds Hq heads, and a first chunk is
    attended on its own KV heads, the kept rows gathered per query head through a stride-0 view.

    Storage is bounded by what the rule keeps (issue 34): per store head, min(prompt, keep_bound) + the
    tokens the run may still add, sized once the prompt is in (a `GrowingStore`); decode reads only the
    kept prefix, each token written at its position minus what compression removed (`offset`, per layer)."""

    graph_safe = True  # decode: the slot comes from the device position minus a device offset
    decode_idempotent = True  # a decode step writes only its own slot (the offset moves in prefill only)

    @property
    def store_heads(self) -> int:
        return self.info.num_kv_heads

    def keep_bound(self) -> int:
        """Most prompt tokens any layer keeps once the prompt exceeds it (PyramidKV's lowest layer keeps more)."""
        return self.cfg.budget

    def setup(self, info, batch, max_len, device, dtype):
        self.info, self.batch, self.max_len = info, batch, max_len
        self.H = self.store_heads
        self.store = getattr(self, "store", None) or GrowingStore()
        # bounded by what the rule keeps: sized per prompt (`reserve`), never for the run per head
        self.store.allocate(info.num_layers, batch, self.H, min(max_len, self.keep_bound()), info.head_dim,
                            device, dtype)
        self.prompt = 0
        # per layer: position - slot of the tokens written after the prompt (what compression removed)
        if getattr(self, "offset", None) is None or self.offset.device != torch.device(device):
            self.offset = torch.zeros(info.num_layers, dtype=torch.long, device=device)
        self.offset.zero_()

    def buffers(self):
        return {**self.store.buffers(), "offset": self.offset}

    def reserve(self, prompt: int) -> None:
        """Storage for a prompt of `prompt` tokens and every token the run may add after it: at most
        min(prompt, keep_bound) + (max_len - prompt) slots per head (host ints, outside any graph)."""
        self.store.grow(min(prompt, self.keep_bound()) + self.max_len - prompt)

    def before_decode(self, seq_len):
        self.reserve(self.prompt or seq_len)

    def begin(self, step):
        super().begin(step)
        if step.phase != "decode":
            self.prompt = step.end
            self.store.grow(min(step.end, self.keep_bound()))  # this chunk's survivors
        elif not step.graphed:                                  # driven without the engine's before_decode
            self.reserve(self.prompt or step.start)

    def per_head(self, x: torch.Tensor) -> torch.Tensor:
        """KV heads -> the store's heads (repeated per query head for a set per query head)."""
        return x.repeat_interleave(self.H // x.shape[1], 1) if self.H != x.shape[1] else x

    def attend(self, layer, q, k, v, rope):
        step, S = self.step, self.store
        q = rope.apply(q, step.positions)
        k = rope.apply(k, step.positions)
        if step.phase == "decode":
            slot = step.positions - self.offset[layer]
            S.write(layer, slot, self.per_head(k), self.per_head(v))
            lengths = (slot + 1).to(torch.int32).expand(q.shape[0]).contiguous()
            self.record(layer, lengths)
            out = kernels.decode_attention(q[:, :, 0].contiguous(), S.k[layer], S.v[layer], lengths,
                                           self.info.scaling, max_length=S.capacity)
            return out.view(q.shape[0], 1, -1)
        n_old = step.start - int(self.offset[layer])    # kept so far (host int: a prefill is never graphed)
        if n_old == 0:  # the first chunk attends its own KV heads (GQA): no copy per query head
            keys, values, k_pos = kept_and_chunk(S.k[layer, :, :, :0], S.v[layer, :, :, :0], k, v, step.positions)
        else:
            keys, values, k_pos = kept_and_chunk(S.k[layer, :, :, :n_old], S.v[layer, :, :, :n_old],
                                                 self.per_head(k), self.per_head(v), step.positions)
        out = kernels.prefill_attention(q, keys, values, self.info.scaling)  # [kept | chunk]: plain causal
        N = keys.shape[2]
        if self.keep_count(layer, N) >= N:              # nothing leaves: the chunk is appended, unscored
            S.k[layer, :, :, n_old:N], S.v[layer, :, :, n_old:N] = self.per_head(k), self.per_head(v)
            return out
        pos = k_pos.expand(q.shape[0], self.H, N)       # the kept tokens at 0: before any chunk position
        index, _ = self.keep(layer, q, keys, pos, step.positions[-1:], step.positions, k_pos)
        n = index.shape[-1]
        S.k[layer, :, :, :n], S.v[layer, :, :, :n] = gather_heads(keys, index), gather_heads(values, index)
        self.offset[layer] = step.end - n
        return out
