"""H2O (FMInference/H2O, h2o_hf/): heavy hitters + a recent window, by accumulated attention.

Every token's score is the post-softmax attention it has received, summed over all query rows seen
so far (prefill rows included) and accumulated across steps; the reference is MHA-only (scores per
query head, cache per KV head), so for GQA the group's scores are pooled (`pool`: of each decode
step's attention; in a prefill chunk, of the chunk's attention summed over its rows, which for `max`
is not the per-row max of Cascading's GQA port). Two references, both reachable by `eviction`:

  real       h2o_hf/utils_real_drop (`H2OKVCache_LayerWise`): a bounded store of budget + 1 slots
             per KV head (the extra slot takes the incoming token); a KV head keeps its `recent` most
             recent tokens plus the `budget - recent` highest-scored others; the prompt is prefilled
             densely (in chunks if prefill_chunk is set) and evicted to the budget, then each decode
             step attends budget + 1 tokens and evicts one. This is what saves memory and what
             latency is measured on. `positions`: original (the real-drop class: keys rotated once),
             or shifted (its `_streaming` variant, as Cascading's H2OLlamaAttention_streaming: keys
             kept un-rotated and re-rotated every step at their rank in the cache, the query at the
             cache length: positions stay below budget + 1, so H2O then reads any length).
  simulated  h2o_hf/utils_hh (`LlamaAttention_heavy_hitter`): a full store and a mask. Budgets are
             fixed at the first forward, as fractions of the prompt (`heavy_ratio`, `recent_ratio`;
             the scripts use 0.1 each) or absolute; each later step attends heavy + recent tokens,
             the recent window counting the incoming token. The mask reproduces the reference's own
             bookkeeping: evicted tokens' scores are zeroed, the token leaving the window sits out
             one step with its score kept and may return as a heavy hitter; recent = 0 never evicts.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

import kernels
from common.errors import ConfigError, HarnessError
from methods.base import Method, register
from methods.config import ChunkedPrefill, option
from methods.parts import selection
from methods.parts.rope import rotate_half
from methods.parts.stores import BoundedStore, FullStore


@dataclass(frozen=True)
class H2OConfig(ChunkedPrefill):
    """H2O (FMInference/H2O): heavy hitters by accumulated attention + recent window. eviction=real:
    h2o_hf/utils_real_drop, a bounded store (budget = heavy + recent tokens per KV head, the incoming one
    on top); eviction=simulated: h2o_hf/utils_hh, a mask over a full store (heavy + recent attended, the
    window counting the incoming token)."""

    budget: int = option(2048, "tokens kept per KV head: heavy hitters + recent window", min=2)
    recent: int | None = option(None, "recent window inside the budget (null = budget // 2: the scripts' equal "
                                "split, H2O issue #31)", min=1)
    pool: str = option("sum", "GQA: how a KV group's query heads pool their attention into one score",
                       choices=("sum", "mean", "max"))
    eviction: str = option("real", "real: bounded store, tokens dropped (utils_real_drop); simulated: full store "
                           "and a mask (utils_hh)", choices=("real", "simulated"))
    positions: str = option("original", "real eviction: original (keys rotated once) or shifted (re-rotated at "
                            "their rank in the cache every step: the _streaming variant, reads any length)",
                            choices=("original", "shifted"))
    heavy_ratio: float | None = option(None, "simulated: heavy budget = int(ratio x prompt length), utils_hh "
                                       "(scripts: 0.1); null = budget - recent", min=0.0, max=1.0)
    recent_ratio: float | None = option(None, "simulated: recent budget = int(ratio x prompt length) (scripts: "
                                        "0.1); null = recent", min=0.0, max=1.0)

    @property
    def window(self) -> int:
        return self.recent if self.recent is not None else self.budget // 2

    def check(self, info):
        if self.window >= self.budget:
            raise ConfigError(f"method.recent={self.window} must be below method.budget={self.budget}")
        ratios = (self.heavy_ratio is None, self.recent_ratio is None)
        if ratios[0] != ratios[1]:
            raise ConfigError("method.heavy_ratio and method.recent_ratio are set together (or neither)")
        if self.eviction == "real" and not ratios[0]:
            raise ConfigError("method.heavy_ratio/recent_ratio need method.eviction=simulated (the real store is "
                              "sized before the prompt is seen)")
        if self.eviction == "simulated" and self.positions != "original":
            raise ConfigError("method.positions=shifted is the real-drop _streaming variant; use method.eviction=real")
        if self.eviction == "simulated" and self.prefill_chunk is not None:
            raise ConfigError("method.prefill_chunk: eviction=simulated reads the prompt in one forward, as utils_hh")

    def max_context(self, info):
        return None if self.positions == "shifted" else info.max_position

    def describe(self):
        score = f"post-softmax attention summed over queries and steps, {self.pool} over the group"
        if self.eviction == "simulated":
            sizes = (f"heavy = int({self.heavy_ratio} x prompt), recent = int({self.recent_ratio} x prompt)"
                     if self.heavy_ratio is not None else f"heavy = {self.budget - self.window}, recent = {self.window}")
            return {"budget_unit": "tokens attended per KV head per step (heavy + recent, the incoming token in the "
                                   "recent window)", "budgets": sizes, "score": score,
                    "positions": "original", "eviction": "simulated (mask over a full store, utils_hh)",
                    "prefill": "dense, budgets fixed by the prompt length"}
        return {"budget_unit": "tokens kept per KV head (heavy + recent), the incoming token on top",
                "recent_effective": self.window, "heavy": self.budget - self.window, "score": score,
                "positions": ("original (keys rotated once)" if self.positions == "original" else
                              "shifted (un-rotated keys re-rotated at their rank in the cache every step)"),
                "eviction": "real (bounded store)", "prefill": "dense, then evicted to the budget"}

    @classmethod
    def variants(cls):
        return [{"budget": 16}, {"budget": 12, "recent": 3, "pool": "max", "prefill_chunk": 16},
                {"budget": 12, "recent": 4, "positions": "shifted", "prefill_chunk": 16},
                {"budget": 14, "recent": 5, "eviction": "simulated"},
                {"eviction": "simulated", "heavy_ratio": 0.2, "recent_ratio": 0.15, "pool": "mean"}]

    def full_equivalent(self, context):
        return {"budget": max(self.budget, context), "heavy_ratio": None, "recent_ratio": None}


def rotate_at(rope, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """x [B, H, N, D] rotated by per-row positions pos [B, H, N] (one cos/sin table for all rows)."""
    cos, sin = rope.cos_sin(pos.reshape(1, -1), x)
    cos, sin = cos.view(*pos.shape, -1), sin.view(*pos.shape, -1)
    return (x * cos + rotate_half(x) * sin).to(x.dtype)


def ranks(pos: torch.Tensor, n_valid: torch.Tensor | int) -> torch.Tensor:
    """In-cache positions: the rank of each slot's original position among the first n_valid slots."""
    slot = torch.arange(pos.shape[-1], device=pos.device)
    keyed = torch.where(slot < n_valid, pos, torch.iinfo(torch.long).max)
    return keyed.argsort(-1).argsort(-1)


@register
class H2O(Method):
    name = "h2o"
    Config = H2OConfig
    graph_safe = True  # real eviction: device lengths, per-head victim slots on the device

    def __init__(self, cfg):
        super().__init__(cfg)
        self.simulated = self.cfg.eviction == "simulated"
        self.shifted = self.cfg.positions == "shifted"
        if self.simulated:
            self.graph_safe = False  # budgets are fixed by the first forward's length (a host int)

    def setup(self, info, batch, max_len, device, dtype):
        self.info, self.batch = info, batch
        L, Hkv = info.num_layers, info.num_kv_heads
        if self.simulated:
            self.store = getattr(self, "store", None) or FullStore()
            self.store.allocate(L, batch, Hkv, max_len, info.head_dim, device, dtype)
            self.cap = max_len
            # the next step's attended set per KV head: a prefix of `keep` whose size the first forward fixes
            self.score = torch.zeros(L, batch, Hkv, max_len, device=device)
            self.keep = torch.empty(L, batch, Hkv, max_len, dtype=torch.long, device=device)
            self.count = torch.empty(L, batch, dtype=torch.int32, device=device)
            return
        self.cap = self.cfg.budget + 1
        self.store = getattr(self, "store", None) or BoundedStore()
        self.store.allocate(L, batch, Hkv, self.cap, info.head_dim, device, dtype)
        self.free = torch.zeros(L, batch, Hkv, dtype=torch.long, device=device)

    def buffers(self):
        if self.simulated:
            return {**self.store.buffers(), "score": self.score, "keep": self.keep, "count": self.count}
        return {**self.store.buffers(), "free": self.free}

    def begin(self, step):
        super().begin(step)
        if self.simulated:
            return self._begin_simulated(step)
        # tokens present once this step's token is in: a prefix of the slots
        self.lengths = torch.clamp(step.positions[-1:] + 1, max=self.cap).to(torch.int32).expand(self.batch).contiguous()
        # shifted: the query sits at the cache length (its own rank), every slot at its rank
        self.q_pos = torch.clamp(step.positions, max=self.cap - 1)

    def attend(self, layer, q, k, v, rope):
        if self.simulated:
            return self._attend_simulated(layer, q, k, v, rope)
        step = self.step
        if not self.shifted:
            k = rope.apply(k, step.positions)
        if step.phase == "decode":
            return self._decode(layer, q, k, v, step.positions, rope)
        return self._prefill(layer, q, k, v, step.positions, step.start, rope)

    # --- real eviction -----------------------------------------------------------------------------
    def _decode(self, layer, q, k, v, position, rope):
        S, c, B = self.store, self.cfg, q.shape[0]
        S.put(layer, self.free[layer], k, v, position)
        keys = S.k[layer]
        if self.shifted:
            keys = rotate_at(rope, keys, ranks(S.pos[layer], self.lengths.view(B, 1, 1).long()))
            q = rope.apply(q, self.q_pos)
        else:
            q = rope.apply(q, position)
        out, probs = kernels.decode_attention_mass(q[:, :, 0].contiguous(), keys, S.v[layer], self.lengths,
                                                   self.info.scaling, max_length=self.cap)
        S.score[layer] += selection.group_reduce(probs, self.info.num_kv_heads, c.pool)
        self.record(layer, self.lengths)
        # Full (budget + 1 tokens): the lowest-scored token outside the recent window leaves and its
        # slot takes the next token; otherwise the next token takes the next empty slot.
        protected = S.pos[layer] > position - c.window
        victim = torch.where(protected, float("inf"), S.score[layer]).argmin(-1)
        full = (self.lengths == self.cap).view(B, 1)
        self.free[layer] = torch.where(full, victim, self.lengths.view(B, 1).long())
        return out.view(B, 1, -1)

    def _prefill(self, layer, q, k, v, positions, start, rope):
        S, c = self.store, self.cfg
        B, Hkv, T = q.shape[0], self.info.num_kv_heads, positions.numel()
        n_old = min(start, c.budget)                 # what the previous chunks left (host int: never graphed)
        keys = torch.cat([S.k[layer, :, :, :n_old], k], 2)
        values = torch.cat([S.v[layer, :, :, :n_old], v], 2)
        pos = torch.cat([S.pos[layer, :, :, :n_old], positions.view(1, 1, T).expand(B, Hkv, T)], 2)
        q_pos = positions
        if self.shifted:  # old kept tokens at their ranks, the chunk right after them
            q_pos = positions - start + n_old
            q = rope.apply(q, q_pos)
            rotated = rotate_at(rope, keys, ranks(pos, n_old + T))
        else:
            q = rope.apply(q, positions)
            rotated = keys
        k_pos = torch.cat([torch.zeros(n_old, dtype=torch.long, device=q.device), q_pos])  # old: all visible
        # the kept tokens precede the chunk: [kept | chunk] is plain causal attention, SDPA's fused path
        # without the [T, n_old + T] mask that k_pos spells out (the mass below needs it: no fused path)
        out = kernels.prefill_attention(q, rotated, values, self.info.scaling)
        mass = kernels.attention_mass(q, rotated, self.info.scaling, q_pos=q_pos, k_pos=k_pos)
        score = torch.cat([S.score[layer, :, :, :n_old], torch.zeros(B, Hkv, T, device=q.device)], 2)
        score = score + selection.group_reduce(mass, Hkv, c.pool)
        index = self.keep_index(score, pos, positions[-1])
        S.keep(layer, index, keys, values, pos, score)
        self.free[layer] = index.shape[-1]
        return out

    def keep_index(self, score: torch.Tensor, pos: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        """The selection rule after a prefill chunk: candidate indices [B, Hkv, min(N, budget)] to keep:
        every candidate in the recent window, then the highest scores (sorted by position)."""
        c = self.cfg
        n = min(score.shape[-1], c.budget)
        ranked = torch.where(pos > last - c.window, float("inf"), score)
        index = ranked.topk(n, dim=-1).indices
        return index.gather(-1, pos.gather(-1, index).argsort(-1))

    # --- simulated eviction (utils_hh) -----------------------------------------------------------------
    def _begin_simulated(self, step):
        if step.start > 0 and step.phase != "decode":
            raise HarnessError("h2o eviction=simulated: a second prefill chunk; utils_hh reads the prompt in one "
                               "forward (use eviction=real for streamed prompts)")
        if step.start == 0:  # the first forward fixes the budgets (utils_hh: from its key length)
            c, T = self.cfg, step.length
            if c.heavy_ratio is not None:
                self.heavy, self.recent = int(c.heavy_ratio * T), int(c.recent_ratio * T)
            else:
                self.heavy, self.recent = c.budget - c.window, c.window
            # recent = 0 never evicts in the reference; nor does a budget covering the whole store
            self.evicts = self.recent > 0 and self.heavy + self.recent < self.cap
            self.K = self.heavy + self.recent + 1 if self.evicts else self.cap
            keep = self.keep[..., :self.K]
            keep.copy_(torch.arange(self.K, device=keep.device).expand_as(keep))  # a first decode: token 0 alone
            self.count.fill_(1)
            self.score.zero_()

    def _attend_simulated(self, layer, q, k, v, rope):
        step, S, c = self.step, self.store, self.cfg
        B, Hkv = q.shape[0], self.info.num_kv_heads
        q = rope.apply(q, step.positions)
        S.write(layer, step.positions, rope.apply(k, step.positions), v)
        if step.phase == "decode":
            idx, n = self.keep[layer, :, :, :self.K], self.count[layer]
            rows = idx.unsqueeze(-1).expand(-1, -1, -1, S.k.shape[-1])
            out, probs = kernels.decode_attention_mass(q[:, :, 0].contiguous(), S.k[layer].gather(2, rows),
                                                       S.v[layer].gather(2, rows), n, self.info.scaling,
                                                       max_length=idx.shape[-1])
            self.score[layer].scatter_add_(2, idx, selection.group_reduce(probs, Hkv, c.pool))
            self.record(layer, n)
            out = out.view(B, 1, -1)
        else:
            keys, values = S.view(layer, step.end)
            out = kernels.prefill_attention(q, keys, values, self.info.scaling)
            mass = kernels.attention_mass(q, keys, self.info.scaling)
            self.score[layer, :, :, :step.end] = selection.group_reduce(mass, Hkv, c.pool)
        self._next_keep(layer, step.positions[-1:] + 1)
        return out

    def _next_keep(self, layer: int, n: torch.Tensor) -> None:
        """utils_hh's mask for the next step once `n` (device [1]) tokens are in: if n > heavy + recent,
        the top `heavy` scores among positions < n - recent plus positions n + 1 - recent .. n (the
        next token included); scores outside the mask and before n - recent are zeroed."""
        K, dev = self.K, self.keep.device
        every = torch.arange(K, device=dev).expand(self.batch, self.info.num_kv_heads, K)
        if not self.evicts:
            self.keep[layer, :, :, :K] = every
            self.count[layer] = (n + 1).clamp(max=K).to(torch.int32).expand(self.batch)
            return
        H, R, sc = self.heavy, self.recent, self.score[layer]
        pos = torch.arange(self.cap, device=dev)
        heavy = torch.where(pos < n - R, sc, float("-inf")).topk(H, dim=-1).indices
        recent = (n + 1 - R + torch.arange(R, device=dev)).clamp(max=self.cap - 1).expand(*heavy.shape[:2], R)
        chosen = torch.cat([heavy, recent, recent[..., -1:]], -1)
        evict = n > H + R
        self.keep[layer, :, :, :K] = torch.where(evict, chosen, every)
        self.count[layer] = torch.where(evict, H + R, (n + 1).clamp(max=K)).to(torch.int32).expand(self.batch)
        kept = torch.zeros_like(sc, dtype=torch.bool).scatter(-1, heavy, True) | (pos >= n - R)
        self.score[layer] = torch.where(evict & ~kept, 0.0, sc)
