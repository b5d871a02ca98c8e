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
             one step with its score kept and may return as a heavy hitter. A recent window of 0
             tokens (recent_ratio 0) is its own branch there: once more than `heavy` tokens are in,
             the next step attends the `heavy` top-scored tokens only, the incoming token excluded,
             and no score is zeroed (its `score_mask[:, -0:] = 1` marks every slot).

Prefill cost (issue 34): the rule needs every prompt token's column sum of post-softmax attention, which
a flash kernel never holds (a row's probabilities are known only once its log-sum-exp over every key is),
so the prefill is two passes (`kernels.causal_attention_mass`, kernels/mass_prefill.py): full attention's
own flash kernel, which also returns each row's log-sum-exp, then one pass that sums exp(s - lse) per key
over the causal triangle, QK^T without the PV product. Bound: the attention part costs at most 2x full
attention's (one more triangle of QK^T and exponentials); a prompt in several chunks adds a row-lse pass
(at most 3x). Before: 3.2x full's whole prefill at 128K (H200, issue 34), both passes over the square.

Two classes share the score (`H2O.score`: the group's pooled attention): `H2O`, the real eviction, is
its rule over the eviction base (methods/parts/eviction.py); `H2OSimulated` is a mask over a full
store. `eviction` picks the class when the method is built (one registry name, one config).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

import kernels
from common.errors import ConfigError, HarnessError
from methods.base import Method, register
from methods.config import ChunkedPrefill, option
from methods.parts import selection
from methods.parts.eviction import EvictionMethod
from methods.parts.stores import FullStore

EXTRA = ("column sums of the softmax: one QK^T pass over the causal triangle after the flash prefill (no PV); "
         "attention <= 2x full's (3x with a chunked prompt: + a row log-sum-exp pass)")


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
                    "prefill": "dense, budgets fixed by the prompt length", "prefill_extra_work": EXTRA}
        return {"budget_unit": "tokens kept per KV head (heavy + recent), the incoming token on top",
                "recent_effective": self.window, "heavy": self.budget - self.window, "score": score,
                "positions": ("original (keys rotated once)" if self.positions == "original" else
                              "shifted (un-rotated keys re-rotated at their rank in the cache every step)"),
                "eviction": "real (bounded store)", "prefill": "dense, then evicted to the budget",
                "prefill_extra_work": EXTRA}

    @classmethod
    def variants(cls):
        return [{"budget": 16}, {"budget": 12, "recent": 3, "pool": "max", "prefill_chunk": 16},
                {"budget": 12, "recent": 4, "positions": "shifted", "prefill_chunk": 16},
                {"budget": 14, "recent": 5, "eviction": "simulated"},
                {"eviction": "simulated", "heavy_ratio": 0.2, "recent_ratio": 0.15, "pool": "mean"}]

    def full_equivalent(self, context):
        return {"budget": max(self.budget, context), "heavy_ratio": None, "recent_ratio": None}


class H2OScore:
    """The score both H2O classes share: post-softmax attention [B, Hq, N] pooled over each KV group."""

    def score(self, probs: torch.Tensor) -> torch.Tensor:
        return selection.group_reduce(probs, self.info.num_kv_heads, self.cfg.pool)


@register
class H2O(H2OScore, EvictionMethod):
    """Real eviction (utils_real_drop): the rule is the accumulated score and the recent window; the
    bounded store, [kept | chunk] prefill, top-budget keep and arg-min victim are the eviction base's."""

    name = "h2o"
    Config = H2OConfig
    accumulate = True  # scores summed over every query row and step, kept with the tokens

    def __new__(cls, cfg=None):  # cfg None: copy/pickle protocols, which set the state themselves
        if cls is H2O and cfg is not None and \
                (cfg if isinstance(cfg, H2OConfig) else H2OConfig.parse(cfg)).eviction == "simulated":
            sim = object.__new__(H2OSimulated)  # not an H2O: Python skips H2O.__init__, so run its own
            sim.__init__(cfg)
            return sim
        return super().__new__(cls)

    def __init__(self, cfg):
        super().__init__(cfg)
        self.shifted = self.cfg.positions == "shifted"

    def protected(self, pos, last):
        return pos > last - self.cfg.window

    def fused(self):
        return {"pool": self.cfg.pool, "window": self.cfg.window}


class H2OSimulated(H2OScore, Method):
    """Simulated eviction (utils_hh): a full store and, per KV head, the next step's attended set."""

    name = "h2o"
    Config = H2OConfig
    graph_safe = False  # budgets are fixed by the first forward's length (a host int)

    def setup(self, info, batch, max_len, device, dtype):
        self.info, self.batch = info, batch
        L, Hkv = info.num_layers, info.num_kv_heads
        self.store = getattr(self, "store", None) or FullStore()
        self.store.allocate(L, batch, Hkv, max_len, info.head_dim, device, dtype)
        self.cap = max_len
        # the next step's attended set per KV head: a prefix of `keep` whose size the first forward fixes
        self.acc = torch.zeros(L, batch, Hkv, max_len, device=device)
        self.keep = torch.empty(L, batch, Hkv, max_len, dtype=torch.long, device=device)
        self.count = torch.empty(L, batch, dtype=torch.int32, device=device)

    def buffers(self):
        return {**self.store.buffers(), "score": self.acc, "keep": self.keep, "count": self.count}

    def begin(self, step):
        super().begin(step)
        if step.start > 0 and step.phase != "decode":
            raise HarnessError("h2o eviction=simulated: a second prefill chunk; utils_hh reads the prompt in one "
                               "forward (use eviction=real for streamed prompts)")
        if step.start == 0:  # the first forward fixes the budgets (utils_hh: from its key length)
            c, T = self.cfg, step.length
            if c.heavy_ratio is not None:
                self.heavy, self.recent = int(c.heavy_ratio * T), int(c.recent_ratio * T)
            else:
                self.heavy, self.recent = c.budget - c.window, c.window
            if self.heavy + self.recent == 0:
                raise HarnessError(f"h2o eviction=simulated: heavy + recent = 0 tokens for a {T}-token prompt "
                                   "(utils_hh would attend nothing); raise heavy_ratio/recent_ratio")
            # a budget covering the whole store never evicts (recent = 0 does: the heavy tokens alone)
            self.evicts = self.heavy + self.recent < self.cap
            self.K = self.heavy + self.recent + 1 if self.evicts else self.cap
            keep = self.keep[..., :self.K]
            keep.copy_(torch.arange(self.K, device=keep.device).expand_as(keep))  # a first decode: token 0 alone
            self.count.fill_(1)
            self.acc.zero_()

    def attend(self, layer, q, k, v, rope):
        step, S, B = self.step, self.store, q.shape[0]
        q = rope.apply(q, step.positions)
        S.write(layer, step.positions, rope.apply(k, step.positions), v)
        if step.phase == "decode":
            idx, n = self.keep[layer, :, :, :self.K], self.count[layer]
            rows = idx.unsqueeze(-1).expand(-1, -1, -1, S.k.shape[-1])
            out, probs = kernels.decode_attention_mass(q[:, :, 0].contiguous(), S.k[layer].gather(2, rows),
                                                       S.v[layer].gather(2, rows), n, self.info.scaling,
                                                       max_length=idx.shape[-1])
            self.acc[layer].scatter_add_(2, idx, self.score(probs))
            self.record(layer, n)
            out = out.view(B, 1, -1)
        else:
            keys, values = S.view(layer, step.end)
            out, mass = kernels.causal_attention_mass(q, keys, values, self.info.scaling)
            self.acc[layer, :, :, :step.end] = self.score(mass)
        self._next_keep(layer, step.positions[-1:] + 1)
        return out

    def _next_keep(self, layer: int, n: torch.Tensor) -> None:
        """utils_hh's mask for the next step once `n` (device [1]) tokens are in: if n > heavy + recent,
        the top `heavy` scores among positions < n - recent plus positions n + 1 - recent .. n (the
        next token included; none when recent = 0); scores outside the mask and before n - recent are
        zeroed (none when recent = 0: the reference's `score_mask[:, -0:]` is every slot)."""
        K, dev = self.K, self.keep.device
        every = torch.arange(K, device=dev).expand(self.batch, self.info.num_kv_heads, K)
        if not self.evicts:
            self.keep[layer, :, :, :K] = every
            self.count[layer] = (n + 1).clamp(max=K).to(torch.int32).expand(self.batch)
            return
        H, R, sc = self.heavy, self.recent, self.acc[layer]
        pos = torch.arange(self.cap, device=dev)
        heavy = torch.where(pos < n - R, sc, float("-inf")).topk(H, dim=-1).indices
        recent = (n + 1 - R + torch.arange(R, device=dev)).clamp(max=self.cap - 1).expand(*heavy.shape[:2], R)
        chosen = torch.cat([heavy, recent, heavy.new_zeros(*heavy.shape[:2], K - H - R)], -1)  # pad: never read
        evict = n > H + R
        self.keep[layer, :, :, :K] = torch.where(evict, chosen, every)
        self.count[layer] = torch.where(evict, H + R, (n + 1).clamp(max=K)).to(torch.int32).expand(self.batch)
        kept = torch.zeros_like(sc, dtype=torch.bool).scatter(-1, heavy, True) | (pos >= n - R if R else True)
        self.acc[layer] = torch.where(evict & ~kept, 0.0, sc)
