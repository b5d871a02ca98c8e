"""InfLLM (thunlp/InfLLM, inf_llm/attention/context_manager.py): training-free context memory.

Per layer the tokens split into: the first `n_init` (attention sinks), the last `n_local` (the local
window, attended at their real relative positions), and the evicted ones in between, grouped in
blocks of `block_size`. Each block is indexed by a representative key per query head: the mean of the
`repr_topk` keys that received the most local-window attention while they were in the window. Every
execution chunk (a prefill chunk of `exc_block_size` tokens, or one decode step) scores the blocks with
its mean query and attends the `topk` best plus the sinks plus the evicted-but-not-yet-blocked
remainder ("memory"), at one fixed distance: memory keys are stored un-rotated and the query is rotated
by `memory_distance`. The local and memory parts are two softmaxes merged online (kernels.lse).

Reference details kept (see reference/methods.md section 5 and the options' docs): blocks form only
after the sinks are complete and while at least n_local tokens stay behind them (block b covers
positions n_init + b*block_size ..); retrieval returns every block while there are at most topk; the
block score is the inner product of the concatenated per-head representatives with the concatenated
chunk-mean query (the sum of per-head logits); representatives are chosen per query head from the
local attention each token received under the joint (local + memory) softmax, summed over queries;
the GPU cache is LRU as in ContextManager.remove_lru_blocks. Scores accumulate in fp32 (InfLLM: the
model dtype).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from common.errors import ConfigError
from kernels.lse import decode_attention_lse, merge_attention, sparse_decode_tokens_lse
from kernels.window import FAR, window_attention_lse, window_mass
from methods.base import Method, register
from methods.config import MethodConfig, option
from methods.parts.selection import top_first
from methods.parts.stores_blocks import BlockMemory, WindowRing


@dataclass(frozen=True)
class MemoryConfig(MethodConfig):
    """The context-memory options InfLLM and Ltri-LLM share."""

    n_init: int = option(128, "initial tokens (attention sinks), attended as memory at the fixed distance", min=0)
    n_local: int = option(4096, "local window: the last n_local tokens (the query itself included) at real "
                          "relative positions", min=1)
    block_size: int = option(128, "tokens per memory block", min=1)
    topk: int = option(16, "blocks retrieved per execution chunk or decode step", min=1)
    exc_block_size: int = option(512, "execution chunk: prompt tokens sharing one retrieval (the prefill chunk)",
                                 min=1)
    max_cached_block: int = option(32, "GPU-resident blocks per layer and sequence (LRU cache) when offloading",
                                   min=1)
    offload: bool = option(True, "true: blocks live in host memory (pinned on CUDA), max_cached_block of them "
                           "cached on the GPU; false: every block stays on the GPU")
    per_head: bool = option(False, "retrieval per KV head (its query group's logits summed) instead of one top-k "
                            "per layer over all heads (InfLLM's default; its perhead mode, 'not recommended', #45)")
    memory_distance: int | None = option(None, "distance of every memory token from the query; null = n_local - 1 "
                                         "(InfLLM's apply_rotary_pos_emb_one_angle(q, n_local) takes row n_local-1)",
                                         min=0)
    evidence: str = option("none", "the sample's needle (a task param span, e.g. niah): record = per layer and decode "
                           "step, the share of its tokens the step attends (ltri.fig1-2); inject = also force the "
                           "blocks holding it into every retrieval (ltri.table1)", choices=("none", "record", "inject"))
    remainder_visibility: str = option(
        "chunk", "chunk: each query of an execution chunk sees every evicted, not yet blocked token out of the "
        "chunk's LAST query's window, also ones inside its own window (InfLLM's code: its complement mask never "
        "masks); query: only those out of its own window", choices=("chunk", "query"))

    @property
    def distance(self) -> int:
        return self.n_local - 1 if self.memory_distance is None else self.memory_distance

    def check(self, info):
        if self.exc_block_size > self.n_local:
            raise ConfigError(f"method.exc_block_size={self.exc_block_size} exceeds method.n_local={self.n_local} "
                              f"(InfLLM asserts exc_block_size <= n_local)")
        need = self.topk * (info.num_kv_heads if self.per_head else 1)
        if self.offload and self.max_cached_block < need:
            raise ConfigError(f"method.max_cached_block={self.max_cached_block} is below the {need} blocks one "
                              f"retrieval needs resident (topk{' x KV heads' if self.per_head else ''})")

    def describe(self):
        return {"budget_unit": "tokens per KV head: n_init sinks + topk blocks + n_local window (+ the evicted "
                               "remainder, < block_size + chunk)",
                "budget_total": self.n_init + self.topk * self.block_size + self.n_local,
                "retrieval": "per KV head" if self.per_head else "shared by all heads of a layer",
                "positions": f"local window at real relative positions; sinks, blocks and remainder un-rotated "
                             f"at distance {self.distance}",
                "prefill": f"streamed in chunks of {self.exc_block_size}, one retrieval per chunk",
                "offload": f"host memory, {self.max_cached_block} blocks GPU-cached (LRU)" if self.offload
                else "none (all blocks on the GPU)", "dense_layers": 0}

    def full_equivalent(self, context):
        return {"n_local": max(self.n_local, context)}


@dataclass(frozen=True)
class InfLLMConfig(MemoryConfig):
    """InfLLM (thunlp/InfLLM): sinks + local window + retrieved blocks of evicted tokens at a fixed
    distance, blocks offloaded to host memory behind an LRU GPU cache. Defaults: config/llama-3-inf-llm.yaml."""

    repr_topk: int = option(4, "representative tokens per block and query head (most local attention received); "
                            "the block's index key is their mean", min=1)

    def check(self, info):
        super().check(info)
        if self.repr_topk > self.block_size:
            raise ConfigError(f"method.repr_topk={self.repr_topk} exceeds method.block_size={self.block_size}")

    @classmethod
    def variants(cls):
        return [{"n_init": 4, "n_local": 8, "block_size": 4, "topk": 2, "repr_topk": 2, "exc_block_size": 8,
                 "max_cached_block": 3},
                {"n_init": 2, "n_local": 10, "block_size": 3, "topk": 3, "repr_topk": 1, "exc_block_size": 7,
                 "per_head": True, "offload": False, "memory_distance": 6, "remainder_visibility": "query"}]


@register
class InfLLM(Method):
    """Also the base of Ltri-LLM (methods/ltri.py), which replaces how blocks are indexed and chosen."""

    name = "infllm"
    Config = InfLLMConfig

    @property
    def prefill_chunk(self):
        return self.cfg.exc_block_size

    # --- life cycle ------------------------------------------------------------------------------
    def setup(self, info, batch, max_len, device, dtype):
        c = self.cfg
        self.info, self.batch, self.dtype = info, batch, dtype
        L, Hq, Hkv, D = info.num_layers, info.num_heads, info.num_kv_heads, info.head_dim
        self.ring_size = c.n_local + c.block_size + self.largest_chunk()
        self.ring = getattr(self, "ring", None) or WindowRing()
        self.ring.allocate(L, batch, Hkv, Hq, self.ring_size, D, device, dtype)
        self.max_blocks = max(0, max_len - c.n_init - c.n_local) // c.block_size
        self.memory = getattr(self, "memory", None) or BlockMemory()
        self.memory.allocate(L, batch, Hkv, c.block_size, D, self.max_blocks, offload=c.offload,
                             budget=c.max_cached_block, device=device, dtype=dtype)
        self.units = Hkv if c.per_head else 1
        self.buf_cap = c.n_init + c.topk * c.block_size + c.block_size + self.largest_chunk()
        self.buf_k = _reuse(getattr(self, "buf_k", None), (L, batch, Hkv, self.buf_cap, D), dtype, device)
        self.buf_v = _reuse(getattr(self, "buf_v", None), (L, batch, Hkv, self.buf_cap, D), dtype, device)
        self.scratch = _reuse(getattr(self, "scratch", None), (batch, Hq, self.ring_size), torch.float32, device)
        self.setup_index(info, batch, device, dtype)
        # host state: which block sits in each buffer slot, per (layer, sequence, retrieval unit)
        self.buf_blocks = [[[[None] * c.topk for _ in range(self.units)] for _ in range(batch)] for _ in range(L)]
        self.selected = [None] * L        # the last retrieval per layer: [B][units][ids]
        self.formed_blocks = 0            # blocks formed (identical for every layer after a step)
        # [(start, end)] per sequence from set_samples, which the run loop calls just before the engine's
        # reset: kept when it is for this batch (setup clearing it dropped every recall of a real run)
        needle = getattr(self, "needle", None)
        self.needle = needle if needle is not None and len(needle) == batch else None
        self.recall = {layer: [] for layer in range(L)}

    def largest_chunk(self) -> int:
        """The most tokens one step brings (sizes the ring and the memory buffer)."""
        return self.cfg.exc_block_size

    def setup_index(self, info, batch, device, dtype):
        """Block index keys: one representative per (block, query head)."""
        shape = (info.num_layers, batch, max(1, self.max_blocks), info.num_heads, info.head_dim)
        self.reprs = _reuse(getattr(self, "reprs", None), shape, dtype, device)

    def buffers(self):
        return {**self.ring.buffers(), **self.memory.buffers(), "buf_k": self.buf_k, "buf_v": self.buf_v,
                "scratch": self.scratch, **self.index_buffers()}

    def index_buffers(self):
        return {"reprs": self.reprs}

    # --- per step: the memory layout (host ints; identical for every layer and sequence) ---------
    def begin(self, step):
        super().begin(step)
        c, a, T = self.cfg, step.start, step.length
        self.init_len = min(c.n_init, max(0, a - c.n_local))
        self.n_blocks = max(0, a - c.n_local - c.n_init) // c.block_size
        self.rem_start = self.init_len + self.n_blocks * c.block_size
        self.rem_len = max(a - self.rem_start + T - c.n_local, 0)
        dev = step.positions.device
        self.new_slots = self.ring.slots(a, a + T)
        lo = max(0, a - c.n_local + 1)
        self.local_pos = torch.arange(lo, a + T, device=dev)
        self.local_slots = self.local_pos % self.ring_size
        self.rem_slots = self.ring.slots(self.rem_start, self.rem_start + self.rem_len)
        self.mem_angle = torch.tensor([c.distance], device=dev)
        if step.phase == "decode":
            n = a + 1 - lo
            self.local_index = self.local_slots.to(torch.int32).view(1, 1, n).expand(
                self.batch, self.info.num_kv_heads, n).contiguous()
            self.local_counts = torch.full((self.batch, self.info.num_kv_heads), n, dtype=torch.int32, device=dev)

    # --- one layer -----------------------------------------------------------------------------
    def attend(self, layer, q, k, v, rope):
        step, c, scale = self.step, self.cfg, self.info.scaling
        B, Hq, T, D = q.shape
        pos = step.positions
        q_rot, k_rot = rope.apply(q, pos), rope.apply(k, pos)
        self.ring.write(layer, self.new_slots, k, k_rot, v)
        self.q_rot = q_rot                          # the step's queries at their positions (Ltri's query spans)
        q_mem = rope.apply(q, self.mem_angle)  # every query at the one memory distance
        n_mem = self.fill_memory(layer, q_mem)
        ring = self.ring
        if step.phase == "decode":
            out_l, lse_l = sparse_decode_tokens_lse(q_rot[:, :, 0].contiguous(), ring.k_rot[layer], ring.v[layer],
                                                    self.local_index, self.local_counts, scale, scores=self.scratch)
            lengths = torch.full((B,), n_mem, dtype=torch.int32, device=q.device)
            out_g, lse_g = decode_attention_lse(q_mem[:, :, 0].contiguous(), self.buf_k[layer], self.buf_v[layer],
                                                lengths, scale, max_length=n_mem)
            out, lse = merge_attention([(out_l, lse_l), (out_g, lse_g)])
            raw = self.scratch.index_select(-1, self.local_slots)
            mass = torch.where(torch.isfinite(raw), torch.exp(raw * scale - lse.unsqueeze(-1)), 0.0)
            self.observe(layer, q_rot, lse.unsqueeze(-1), raw)
            self.record(layer, self.local_pos.numel() + n_mem)
            out = out.view(B, 1, Hq * D)
        else:
            kl = ring.k_rot[layer].index_select(2, self.local_slots)
            vl = ring.v[layer].index_select(2, self.local_slots)
            out_l, lse_l = window_attention_lse(q_rot, kl, vl, scale, pos, self.local_pos, 0, c.n_local - 1)
            dmin = c.n_local if c.remainder_visibility == "query" else -FAR
            out_g, lse_g = window_attention_lse(q_mem, self.buf_k[layer, :, :, :n_mem],
                                                self.buf_v[layer, :, :, :n_mem], scale, pos,
                                                self.memory_positions(n_mem, q.device), dmin, FAR)
            out, lse = merge_attention([(out_l, lse_l), (out_g, lse_g)])
            mass = window_mass(q_rot, kl, scale, pos, self.local_pos, lse, 0, c.n_local - 1)
            self.observe(layer, q_rot, lse, None)
            out = out.transpose(1, 2).reshape(B, T, Hq * D)
        ring.score[layer].index_add_(2, self.local_slots, mass)
        self.after_step(layer, q_mem)
        return out

    def observe(self, layer, q_rot, lse, raw_local) -> None:
        """After the attention of a step: q_rot [B, Hq, T, D], the merged lse [B, Hq, T], in decode the raw
        local logits at local_slots [B, Hq, n]. InfLLM needs nothing more (Ltri-LLM records its map)."""

    def memory_positions(self, n_mem: int, device) -> torch.Tensor:
        """Positions of the memory prefix, for the per-query remainder mask: sinks and blocks are out of
        every window of this chunk (0 stands for them), the remainder has its own."""
        pos = torch.zeros(n_mem, dtype=torch.long, device=device)
        if self.rem_len:
            pos[n_mem - self.rem_len:] = torch.arange(self.rem_start, self.rem_start + self.rem_len, device=device)
        return pos

    # --- the needle: recall and injection (Ltri-LLM section 2) -----------------------------------
    def set_samples(self, params: list[dict]) -> None:
        """Called by the run loop before a batch: the needle's token span per sequence, if the task gives one."""
        spans = [(p.get("needle_token"), p.get("needle_end")) for p in params]
        self.needle = spans if self.cfg.evidence != "none" and all(a is not None and b for a, b in spans) else None
        self.recall = {layer: [] for layer in range(self.info.num_layers)} if self.info else {}

    def inject(self, sel: list[list[list[int]]]) -> list[list[list[int]]]:
        """The blocks holding the needle first, then the retrieval's own, cut to its length."""
        c, out = self.cfg, []
        for b, units in enumerate(sel):
            s, e = self.needle[b]
            lo, hi = max(0, s - c.n_init) // c.block_size, (e - 1 - c.n_init) // c.block_size
            must = [i for i in range(lo, hi + 1) if 0 <= i < self.n_blocks and e > c.n_init]
            out.append([(must + [x for x in u if x not in must])[:len(u)] for u in units])
        return out

    def record_recall(self, layer: int, sel) -> None:
        """Share of the needle's tokens this decode step attends (window, sinks, retrieved blocks, remainder)."""
        c, p = self.cfg, self.step.start
        vals = []
        for b, (s, e) in enumerate(self.needle):
            blocks = {x for u in sel[b] for x in u} if sel else set()
            seen = sum(1 for t in range(s, e) if t > p - c.n_local or t < self.init_len
                       or self.rem_start <= t < self.rem_start + self.rem_len
                       or (t >= c.n_init and (t - c.n_init) // c.block_size in blocks))
            vals.append(seen / max(1, e - s))
        self.recall[layer].append(sum(vals) / len(vals))

    # --- memory: retrieval, cache, the contiguous memory buffer ----------------------------------
    def fill_memory(self, layer: int, q_mem: torch.Tensor) -> int:
        """Retrieve and lay out this step's memory in buf_k/buf_v[layer]: [sinks | blocks | remainder];
        returns its length."""
        c = self.cfg
        n_sel = 0
        sel = None
        if self.n_blocks > 0:
            sel = self.select(layer, q_mem)
            if self.needle is not None and c.evidence == "inject":
                sel = self.inject(sel)
            self.selected[layer] = sel
            n_sel = len(sel[0][0])
            for b in range(self.batch):
                wanted = list(dict.fromkeys(blk for unit in sel[b] for blk in unit))
                slots = self.memory.ensure(layer, b, wanted)
                for u in range(self.units):
                    self._arrange(layer, b, u, sel[b][u], slots)
        if self.needle is not None and self.step.phase == "decode":
            self.record_recall(layer, sel)
        start = self.init_len + n_sel * c.block_size
        if self.rem_len:
            self.buf_k[layer, :, :, start:start + self.rem_len] = self.ring.k_raw[layer].index_select(2, self.rem_slots)
            self.buf_v[layer, :, :, start:start + self.rem_len] = self.ring.v[layer].index_select(2, self.rem_slots)
        return start + self.rem_len

    def _arrange(self, layer, b, u, blocks, slots):
        """InfLLM's buffer reuse: a block already in a buffer slot stays there; a new one takes the first
        slot whose block is no longer wanted (only those are copied)."""
        c, held = self.cfg, self.buf_blocks[layer][b][u]
        want = set(blocks)
        heads = slice(None) if not self.cfg.per_head else slice(u, u + 1)
        for blk in sorted(want):
            if blk in held:
                continue
            j = next(i for i, h in enumerate(held) if h is None or h not in want)
            held[j] = blk
            s = c.n_init + j * c.block_size
            m = self.memory
            self.buf_k[layer, b, heads, s:s + c.block_size] = m.cache_k[layer, b, slots[blk], heads]
            self.buf_v[layer, b, heads, s:s + c.block_size] = m.cache_v[layer, b, slots[blk], heads]

    def select(self, layer: int, q_mem: torch.Tensor) -> list[list[list[int]]]:
        """Block ids per (sequence, retrieval unit): every block while there are at most topk, else the
        topk by <chunk-mean memory query, representative> summed over the unit's query heads."""
        c, nb = self.cfg, self.n_blocks
        if nb <= c.topk:
            return [[list(range(nb)) for _ in range(self.units)] for _ in range(self.batch)]
        qm = q_mem.float().mean(2)                                            # [B, Hq, D]
        s = torch.einsum("bhd,bnhd->bhn", qm, self.reprs[layer, :, :nb].float())
        s = s.unflatten(1, (self.units, -1)).sum(2)                          # [B, units, nb]
        return top_first(s, c.topk).tolist()

    # --- after the step: sinks and blocks leave the window ---------------------------------------
    def after_step(self, layer: int, q_mem: torch.Tensor) -> None:
        c, E = self.cfg, self.step.end
        init_new = min(c.n_init, max(0, E - c.n_local))
        if init_new > self.init_len:   # sinks go to the head of the memory buffer, once
            sl = self.ring.slots(self.init_len, init_new)
            self.buf_k[layer, :, :, self.init_len:init_new] = self.ring.k_raw[layer].index_select(2, sl)
            self.buf_v[layer, :, :, self.init_len:init_new] = self.ring.v[layer].index_select(2, sl)
        nb_new = max(0, E - c.n_local - c.n_init) // c.block_size
        for i in range(self.n_blocks, nb_new):
            start = c.n_init + i * c.block_size
            sl = self.ring.slots(start, start + c.block_size)
            k = self.ring.k_raw[layer].index_select(2, sl)
            self.memory.put(layer, i, k, self.ring.v[layer].index_select(2, sl))
            self.index_block(layer, i, k, self.ring.score[layer].index_select(2, sl))
        if layer == self.info.num_layers - 1:
            self.formed_blocks = nb_new

    def index_block(self, layer: int, i: int, k: torch.Tensor, score: torch.Tensor) -> None:
        """Representative of block i per query head: mean of its repr_topk most-attended keys."""
        g = self.info.group
        top = top_first(score, self.cfg.repr_topk)                # [B, Hq, r]
        kk = k.repeat_interleave(g, 1)                                        # [B, Hq, bs, D]
        picked = kk.gather(2, top.unsqueeze(-1).expand(-1, -1, -1, k.shape[-1]))
        self.reprs[layer, :, i] = picked.float().mean(2).to(self.reprs.dtype)

    # --- reporting -----------------------------------------------------------------------------
    def stats(self):
        out = super().stats()
        m = self.memory
        out.update({"blocks": self.formed_blocks, "block_loads": m.transfers, "block_stores": m.stores,
                    "device_cache_bytes": m.device_bytes(), "host_bytes": m.host_bytes()})
        if self.needle is not None:
            out["needle_recall"] = {layer: [round(x, 4) for x in v] for layer, v in self.recall.items()}
        return out


def _reuse(t, shape, dtype, device):
    if t is not None and t.shape == shape and t.dtype == dtype and t.device == torch.device(device):
        return t
    return torch.empty(shape, device=device, dtype=dtype)
