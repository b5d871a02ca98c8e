"""The eviction family's shared part, over the bounded store (kvpress's ScorerPress is the model: a
press states a score, the base prunes). A method here states only its rule:

  score(probs)          attention probabilities of this step's scoring queries [B, Hq, N] -> one
                        eviction score per KV head [B, Hkv, N] (higher stays)
  protected(pos, last)  bool [B, Hkv, N] (or None): tokens that never leave (H2O's recent window)
  accumulate            scores add up over queries and steps, kept with the tokens in the store
                        (H2O), or each decision reads the current step's scores only (TOVA)
  score_rows            which prefill queries score: "all" rows of the chunk (column sums) or the
                        chunk's "last" row
  shifted               keys stored un-rotated and re-rotated at their rank in the cache every step,
                        the query at the cache length (H2O's _streaming variant)

and its `budget` option (tokens kept per KV head). This base does the rest, the same way for every
rule: a store of budget + 1 slots per KV head (the extra one takes the incoming token), the
`[kept | chunk]` prefill (the previous chunks' survivors precede the chunk, so plain causal attention
over them is SDPA's fused path), the length clamp, the top-`budget` keep after each prefill chunk
(protected first, then the highest scores; kept in position order), and in decode the arg-min victim
whose slot the next token takes. Decode is graph safe: lengths, scores and victims stay on the device.
Tested through each method's oracle test (tests/test_methods_{tova,h2o}.py, a toy rule in
tests/test_methods_eviction.py) and the conformance suite.
"""
from __future__ import annotations

from typing import ClassVar

import torch

import kernels
from methods.base import Method
from methods.parts.rope_rows import apply_rows, ranks
from methods.parts.stores import BoundedStore


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


class EvictionMethod(Method):
    graph_safe = True  # decode: device lengths, per-head victim slots chosen on the device
    accumulate: ClassVar[bool] = False
    score_rows: ClassVar[str] = "all"
    shifted: bool = False

    # --- the rule: what a method states ------------------------------------------------------------------
    def score(self, probs: torch.Tensor) -> torch.Tensor:
        """Attention probabilities [B, Hq, N] (summed over the scoring queries) -> [B, Hkv, N]."""
        raise NotImplementedError

    def protected(self, pos: torch.Tensor, last: torch.Tensor) -> torch.Tensor | None:
        """Which candidates (original positions `pos` [B, Hkv, N]; `last` [1] the newest position) never
        leave. None: nothing is protected, the incoming token included."""
        return None

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

    def begin(self, step):
        super().begin(step)
        # tokens present once this step's token is in: a prefix of the slots (the length clamp)
        self.lengths = torch.clamp(step.positions[-1:] + 1, max=self.cap).to(torch.int32).expand(self.batch).contiguous()
        # shifted: the query sits at the cache length (its own rank), every slot at its rank
        self.q_pos = torch.clamp(step.positions, max=self.cap - 1)

    def attend(self, layer, q, k, v, rope):
        step = self.step
        if not self.shifted:
            k = rope.apply(k, step.positions)
        if step.phase == "decode":
            return self._decode(layer, q, k, v, step.positions, rope)
        return self._prefill(layer, q, k, v, step.positions, step.start, rope)

    def _ranked(self, score: torch.Tensor, pos: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        keep = self.protected(pos, last)
        return score if keep is None else torch.where(keep, float("inf"), score)

    def _decode(self, layer, q, k, v, position, rope):
        S, B = self.store, q.shape[0]
        S.put(layer, self.free[layer], k, v, position)
        keys = S.k[layer]
        if self.shifted:
            keys = apply_rows(rope, keys, ranks(S.pos[layer], self.lengths.view(B, 1, 1).long()))
            q = rope.apply(q, self.q_pos)
        else:
            q = rope.apply(q, position)
        out, probs = kernels.decode_attention_mass(q[:, :, 0].contiguous(), keys, S.v[layer], self.lengths,
                                                   self.info.scaling, max_length=self.cap)
        score = self.score(probs)
        if self.accumulate:
            S.score[layer] += score
            score = S.score[layer]
        self.record(layer, self.lengths)
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
        if self.score_rows == "all":   # the same visibility; flash's lse + one causal column pass (H2O, issue 34)
            out, mass = kernels.causal_attention_mass(q, rotated, values, self.info.scaling)
        else:
            out = kernels.prefill_attention(q, rotated, values, self.info.scaling)
            mass = kernels.attention_mass(q[:, :, -1:], rotated, self.info.scaling, q_pos=q_pos[-1:], k_pos=k_pos)
        score = self.score(mass)
        if self.accumulate:
            score = score + torch.cat([S.score[layer, :, :, :n_old], torch.zeros(B, Hkv, T, device=q.device)], 2)
        # keep: every protected candidate, then the highest scores, in position order
        n = min(score.shape[-1], self.budget)
        index = self._ranked(score, pos, positions[-1:]).topk(n, dim=-1).indices
        index = index.gather(-1, pos.gather(-1, index).argsort(-1))
        S.keep(layer, index, keys, values, pos, score)
        self.free[layer] = n
        return out
