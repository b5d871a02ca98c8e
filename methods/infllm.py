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
the host path's GPU cache is LRU as in ContextManager.remove_lru_blocks, and the offloaded device path
keeps InfLLM's buffer slots (a block already staged stays). Scores accumulate in fp32 (InfLLM: the model
dtype).
"""
from __future__ import annotations

import torch

from kernels.lse import decode_attention_lse, merge_attention, sparse_decode_tokens_lse
from kernels.memory_decode import two_part_workspace
from kernels.memory_prefill import two_part_prefill_lse
from kernels.window import FAR, window_mass
from methods.base import Method, Step, register
from methods.parts.infllm_config import InfLLMConfig, MemoryConfig  # noqa: F401 (methods/ltri.py's)
from methods.parts.infllm_decode import DeviceDecode
from methods.parts.infllm_device import (
    Geometry,
    PendingMass,
    PositionalStore,
    live_blocks,
    select_blocks,
    staged,
)
from methods.parts.infllm_device import (
    reuse as _reuse,  # methods/ltri.py's too
)
from methods.parts.infllm_host import HostPath
from methods.parts.infllm_stage import SlotStage
from methods.parts.selection import top_first
from methods.parts.stores_blocks import BlockMemory, WindowRing


@register
class InfLLM(HostPath, DeviceDecode, Method):
    """Also the base of Ltri-LLM (methods/ltri.py), which replaces how blocks are indexed and chosen."""

    name = "infllm"
    Config = InfLLMConfig

    def __init__(self, cfg):
        super().__init__(cfg)
        # The device path (methods/parts/infllm_device.py): every token in a positional store, retrieval on
        # the device, the decode step static-shape, sync-free and idempotent at a position. offload=false keeps
        # the store on the GPU; offload=true in pinned host memory, a step's memory rows gathered into a device
        # staging buffer (kernels/memory_stage.py). The needle options (evidence) edit and record retrievals on
        # the host, so they take the host path (methods/parts/infllm_host.py: LRU cache, max_cached_block).
        self.device_path, self.offloaded = self.cfg.path.startswith("device"), self.cfg.path == "device, offloaded"
        self.graph_safe = self.decode_idempotent = self.device_path

    @property
    def prefill_chunk(self):
        return self.cfg.exc_block_size

    # --- life cycle ------------------------------------------------------------------------------
    def setup(self, info, batch, max_len, device, dtype):
        c = self.cfg
        self.info, self.batch, self.dtype = info, batch, dtype
        self.step = None                  # no step since setup: form_due has nothing to form
        L, Hq, Hkv, D = info.num_layers, info.num_heads, info.num_kv_heads, info.head_dim
        self.ring_size = c.n_local + c.block_size + self.largest_chunk()
        self.ring = getattr(self, "ring", None) or WindowRing()
        self.ring.allocate(L, batch, Hkv, Hq, self.ring_size, D, device, dtype)
        self.max_blocks = max(0, max_len - c.n_init - c.n_local) // c.block_size
        self.memory = getattr(self, "memory", None) or BlockMemory()
        # resident: the blocks are the positional store's rows; BlockMemory keeps a token allocation
        self.memory.allocate(L, batch, Hkv, c.block_size, D, 0 if self.device_path else self.max_blocks,
                             offload=c.offload and not self.device_path, budget=c.max_cached_block, device=device,
                             dtype=dtype)
        self.units = Hkv if c.per_head else 1
        self.buf_cap = c.n_init + c.topk * c.block_size + c.block_size + self.largest_chunk()
        if self.device_path:
            self.store = getattr(self, "store", None) or PositionalStore()
            self.store.allocate(L, batch, Hkv, max_len, D, device, dtype, host=self.offloaded)
            self.pending = getattr(self, "pending", None) or PendingMass()
            self.pending.allocate(L, batch, Hq, c.n_local, device)
            self.buf_k = self.buf_v = None
            width = c.n_init + c.topk * c.block_size + c.block_size    # a decode step's memory index
            self.stage = None   # offloaded: the memory staged on the device per layer, InfLLM's slot reuse
            if self.offloaded:
                self.stage = getattr(self, "stage", None) or SlotStage()
                self.stage.allocate(L, batch, Hkv, self.units, c.n_init, c.topk, c.block_size, self.buf_cap, D,
                                    device, dtype)
            self.partials = two_part_workspace(batch, Hq, D, [(Hkv, c.n_local), (Hkv, width)], device,
                                               getattr(self, "partials", None))
        else:
            self.store = self.pending = self.partials = self.stage = None
            self.buf_k = _reuse(getattr(self, "buf_k", None), (L, batch, Hkv, self.buf_cap, D), dtype, device)
            self.buf_v = _reuse(getattr(self, "buf_v", None), (L, batch, Hkv, self.buf_cap, D), dtype, device)
        self.scratch = _reuse(getattr(self, "scratch", None), (batch, Hq, self.ring_size), torch.float32, device)
        self.setup_index(info, batch, device, dtype)
        # host state: which block sits in each buffer slot, per (layer, sequence, retrieval unit)
        self.buf_blocks = [[[[None] * c.topk for _ in range(self.units)] for _ in range(batch)] for _ in range(L)]
        self._selected = [None] * L       # the last retrieval per layer: [B][units][ids] or (ids, counts)
        self.formed_blocks = 0            # blocks formed (identical for every layer after a step)
        self.staged_rows = self.staged_blocks = 0   # offloaded device path: per sequence and KV head, all layers
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
        # resident: fp32, so the device retrieval reads them without an fp32 copy of every layer's index
        self.reprs = _reuse(getattr(self, "reprs", None), shape, torch.float32 if self.device_path else dtype, device)

    def buffers(self):
        extra = {**self.store.buffers(), **self.pending.buffers()} if self.device_path else {}
        if getattr(self, "partials", None) is not None:
            extra.update(partials_op=self.partials[0], partials_lp=self.partials[1])
        if self.offloaded:
            extra.update(self.stage.buffers())
        return {**self.ring.buffers(), **self.memory.buffers(), "buf_k": self.buf_k, "buf_v": self.buf_v,
                "scratch": self.scratch, **extra, **self.index_buffers()}

    @property
    def selected(self) -> list:
        """The last retrieval per layer, [B][units][block ids] (None before any)."""
        out = []
        for sel in self._selected:
            if isinstance(sel, tuple):
                ids, cnt = (t.tolist() for t in sel)
                sel = [[u[:n] for u, n in zip(ib, cb)] for ib, cb in zip(ids, cnt)]
            out.append(sel)
        return out

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
        self.new_slots = step.positions % self.ring_size
        self.q_pos = self.ring_pos = self.live = None   # no undeclared tensor lives into a graphed decode
        self._mem_pos = {}
        if self.device_path:
            self.begin_device(step)
            if step.phase == "decode":
                return
            if self.offloaded:
                self.count_staged(a, T)
        lo = max(0, a - c.n_local + 1)
        if step.phase != "decode":   # the prefill kernels' positions, once per step: queries [B, T], ring slots
            last, R = a + T - 1, self.ring_size
            self.q_pos = step.positions.view(-1, T).expand(self.batch, T).contiguous()
            ring_pos = last - (last - torch.arange(R, device=dev)).remainder(R)
            self.ring_pos = torch.where(ring_pos >= 0, ring_pos, FAR).expand(self.batch, R).contiguous()
        self.local_pos = torch.arange(lo, a + T, device=dev)
        self.local_slots = self.local_pos % self.ring_size
        self.rem_slots = self.ring.slots(self.rem_start, self.rem_start + self.rem_len)
        self.mem_angle = torch.tensor([c.distance], device=dev)
        if step.phase == "decode":
            n = a + 1 - lo
            self.local_index = self.local_slots.to(torch.int32).view(1, 1, n).expand(
                self.batch, self.info.num_kv_heads, n).contiguous()
            self.local_counts = torch.full((self.batch, self.info.num_kv_heads), n, dtype=torch.int32, device=dev)

    def begin_device(self, step):
        """The step's memory geometry; in decode everything from the device position (graph-safe): the
        local window newest first (column j = distance j, the valid ones a prefix)."""
        c, B, Hkv = self.cfg, self.batch, self.info.num_kv_heads
        decode = step.phase == "decode"
        self.first = step.positions[:1] if decode else step.start
        self.geo = Geometry.of(self.first, step.length, c.n_init, c.n_local, c.block_size)
        self.pending_at = self.pending.prepare(self.first)     # the pending masses' position if due, else -1
        if not decode:      # a prefill chunk's kernel reads the block ids (no token index)
            return
        a, n = self.first, c.n_local
        self.local_pos = self.local_slots = self.rem_slots = None   # the kernels take them from `first`
        lpos = a - torch.arange(n, device=a.device)
        self.local_index = lpos.remainder(self.ring_size).to(torch.int32).view(1, 1, n).expand(B, Hkv, n).contiguous()
        self.local_counts = (a + 1).clamp(max=n).to(torch.int32).expand(B, Hkv).contiguous()
        self.mem_angle = torch.full((1,), c.distance, dtype=torch.long, device=a.device)

    # --- one layer -----------------------------------------------------------------------------
    def attend(self, layer, q, k, v, rope):
        step, c, scale = self.step, self.cfg, self.info.scaling
        B, Hq, T, D = q.shape
        pos = step.positions
        q_rot, k_rot = rope.apply(q, pos), rope.apply(k, pos)
        ring, decode = self.ring, step.phase == "decode"
        if self.device_path and decode:   # the pending mass folded, the token into ring, store, sinks: one kernel
            self.write_decode(layer, k, k_rot, v)
        elif self.device_path:   # the last decode step's local mass first (PendingMass), then this step's keys
            if self.pending.held:
                self.pending.fold(layer, ring.score[layer], self.pending_at)
            self.pending.clear(layer)
            self.store.write(layer, pos, k, v)
            if self.offloaded:
                self.stage.write_sinks(layer, pos, k, v)
        if not (self.device_path and decode):
            ring.write(layer, self.new_slots, k, k_rot, v)
        self.q_rot = q_rot                          # the step's queries at their positions (Ltri's query spans)
        q_mem = rope.apply(q, self.mem_angle)  # every query at the one memory distance
        if self.device_path:
            ids, counts = self._selected[layer] = self.select_device(layer, q_mem)
        else:
            n_mem = self.fill_memory(layer, q_mem)
        if decode:
            q1 = q_rot[:, :, 0].contiguous()
            if self.device_path:   # the memory's columns, then window and memory in one combine, the mass held
                out, lse = self.attend_decode(layer, q1, q_mem, ids, counts)
            else:
                out_l, lse_l = sparse_decode_tokens_lse(q1, ring.k_rot[layer], ring.v[layer], self.local_index,
                                                        self.local_counts, scale, scores=self.scratch)
                lengths = torch.full((B,), n_mem, dtype=torch.int32, device=q.device)
                out_g, lse_g = decode_attention_lse(q_mem[:, :, 0].contiguous(), self.buf_k[layer],
                                                    self.buf_v[layer], lengths, scale, max_length=n_mem)
                out, lse = merge_attention([(out_l, lse_l), (out_g, lse_g)])
                raw = self.scratch.index_select(-1, self.local_slots)
                mass = torch.where(torch.isfinite(raw), torch.exp(raw * scale - lse.unsqueeze(-1)), 0.0)
                self.observe(layer, q_rot, lse.unsqueeze(-1), raw)
                self.record(layer, self.local_pos.numel() + n_mem)
            out = out.view(B, 1, Hq * D)
        else:
            # one kernel over the window (the ring in place, each slot at its position) and the memory, one
            # softmax (kernels/memory_prefill.py); then the local mass under its lse, straight into the ring
            dmin = c.n_local if c.remainder_visibility == "query" else -FAR
            if self.device_path:   # host ints in prefill: the memory's length needs no sync
                g = self.geo
                nsel = min(g.n_blocks, c.topk)
                blocks2 = (ids, g.init_len, c.n_init, c.block_size, nsel, g.rem_start,
                           g.init_len + nsel * c.block_size + g.rem_len)
                k2, v2, p2, mem = self.store.k[layer], self.store.v[layer], None, {"blocks2": blocks2}
                if self.offloaded:   # [sinks | blocks | remainder] staged from host memory, as the host path lays it
                    n = self.stage.prefill(layer, self.store, blocks2)
                    k2, v2, p2, mem = self.stage.k[layer, :, :, :n], self.stage.v[layer, :, :, :n], self.memory_pos(n), {}
            else:
                k2, v2, p2, mem = self.buf_k[layer, :, :, :n_mem], self.buf_v[layer, :, :, :n_mem], \
                    self.memory_pos(n_mem), {}
            out, lse = two_part_prefill_lse(q_rot, ring.k_rot[layer], ring.v[layer], self.ring_pos, 0, c.n_local - 1,
                                            q_mem, k2, v2, p2, dmin, FAR, self.q_pos, scale, **mem)
            mass = window_mass(q_rot, ring.k_rot[layer], scale, self.q_pos, self.ring_pos, lse, 0, c.n_local - 1)
            self.observe(layer, q_rot, lse, None)
            out = out.transpose(1, 2).reshape(B, T, Hq * D)
        if not decode:      # every slot's mass (0 out of every window)
            ring.score[layer].add_(mass)
        elif not self.device_path:   # (the device path held its mass: two_part_decode_mass)
            ring.score[layer].index_add_(2, self.local_slots, mass)
        if not step.graphed:      # graphed decode: the engine's host hooks form blocks (correction_span)
            self.after_step(layer, q_mem)
        return out

    def select_device(self, layer: int, q_mem: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Retrieval on the device (resident): (ids int32 [B, units, k] in block order, counts [B, units])."""
        g, c = self.geo, self.cfg
        if isinstance(g.n_blocks, int) and g.n_blocks == 0:
            z = torch.zeros(self.batch, self.units, 0, dtype=torch.int32, device=q_mem.device)
            return z, z.new_zeros(self.batch, self.units)
        if self.step.phase != "decode":
            return select_blocks(q_mem.float().mean(2), self.reprs[layer], g.n_blocks, self.units, c.topk)
        if self.live is None:   # once per decode step (its first layer): which blocks exist
            self.live = live_blocks(self.reprs.shape[2], g.n_blocks, q_mem.device)
        return select_blocks(q_mem[:, :, 0].float(), self.reprs[layer], g.n_blocks, self.units, c.topk, self.live)

    def form_due(self, seq_len: int) -> None:
        """The engine's host hooks before and after every decode step (graphed ones too): a block that left
        the window in a graphed step is formed here, before the next retrieval. Never asks for a re-run."""
        c = self.cfg
        if self.info is None or self.step is None or max(0, seq_len - c.n_local - c.n_init) // c.block_size <= self.formed_blocks:
            return
        self.step = Step(phase="decode", start=seq_len - 1, length=1, positions=torch.tensor([seq_len - 1]))
        for layer in range(self.info.num_layers):
            self.after_step(layer, None)

    def observe(self, layer, q_rot, lse, raw_local) -> None:
        """After the attention of a step: q_rot [B, Hq, T, D], the merged lse [B, Hq, T], in decode the raw
        local logits at local_slots [B, Hq, n] (host path), or on the device path the local window's held
        mass [B, Hq, n_local], newest first. InfLLM needs nothing more (Ltri-LLM records its map)."""

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
    def after_step(self, layer: int, q_mem: torch.Tensor | None) -> None:
        """Host ints of the step's end: sinks and blocks that left the window (resident: they stay in the
        positional store; only their index is made)."""
        c, E = self.cfg, self.step.end
        init_new = min(c.n_init, max(0, E - c.n_local))
        if init_new > self.init_len and not self.device_path:   # sinks go to the head of the memory buffer, once
            sl = self.ring.slots(self.init_len, init_new)
            self.buf_k[layer, :, :, self.init_len:init_new] = self.ring.k_raw[layer].index_select(2, sl)
            self.buf_v[layer, :, :, self.init_len:init_new] = self.ring.v[layer].index_select(2, sl)
        nb_new = max(0, E - c.n_local - c.n_init) // c.block_size
        new, n = [], nb_new - self.formed_blocks
        if n > 0:   # the step's leaving blocks gathered at once (a prefill chunk's exc_block_size / block_size)
            start, bs = c.n_init + self.formed_blocks * c.block_size, c.block_size
            sl = self.ring.slots(start, start + n * bs)
            k_all = self.ring.k_raw[layer].index_select(2, sl)
            s_all = self.ring.score[layer].index_select(2, sl)
            v_all = None if self.device_path else self.ring.v[layer].index_select(2, sl)
            for j, i in enumerate(range(self.formed_blocks, nb_new)):
                k = k_all[:, :, j * bs:(j + 1) * bs]
                if not self.device_path:
                    self.memory.put(layer, i, k, v_all[:, :, j * bs:(j + 1) * bs])
                new.append((i, k, s_all[:, :, j * bs:(j + 1) * bs]))
        self.index_blocks(layer, new)
        if layer == self.info.num_layers - 1:
            self.formed_blocks = nb_new

    def index_blocks(self, layer: int, blocks: list) -> None:
        """Representative of each new block (i, raw keys, scores; consecutive ids) per query head: mean of
        its repr_topk most-attended keys. All of a step's blocks in one pass (no loop of kernels per block)."""
        if not blocks:
            return
        k = torch.stack([b[1] for b in blocks], 2)                              # [B, Hkv, n, bs, D]
        top = top_first(torch.stack([b[2] for b in blocks], 2), self.cfg.repr_topk)   # [B, Hq, n, r]
        B, Hkv, n, bs, D = k.shape
        G = self.info.group
        top = top.view(B, Hkv, G, n, -1, 1).expand(-1, -1, -1, -1, -1, D)
        picked = k.unsqueeze(2).expand(B, Hkv, G, n, bs, D).gather(4, top)      # [B, Hkv, G, n, r, D]
        rep = picked.float().mean(4).flatten(1, 2).transpose(1, 2)              # [B, n, Hq, D]
        i0 = blocks[0][0]
        self.reprs[layer, :, i0:i0 + n] = rep.to(self.reprs.dtype)

    correction_span = form_due
    before_decode = form_due

    def count_staged(self, a: int, T: int) -> None:
        """Offloaded device path, a prefill chunk: rows and blocks it stages (per sequence and KV head)."""
        rows, blocks = staged(Geometry.of(a, T, self.cfg.n_init, self.cfg.n_local, self.cfg.block_size), self.cfg)
        self.staged_rows += self.info.num_layers * rows
        self.staged_blocks += self.info.num_layers * blocks

    # --- reporting -----------------------------------------------------------------------------
    def stats(self):
        out = super().stats()
        m = self.memory
        out.update({"blocks": self.formed_blocks, "block_loads": m.transfers, "block_stores": m.stores,
                    "device_cache_bytes": (self.store if self.device_path else m).device_bytes(),
                    "host_bytes": m.host_bytes()})
        out["path"] = self.cfg.path
        if self.offloaded:   # prefill chunks stage their memory whole; decode steps only the blocks new to a slot
            Hkv, c = self.info.num_kv_heads, self.cfg
            row = self.info.head_dim * 2 * self.store.k.element_size()   # one token's k and v of one KV head
            moved = int(self.stage.moved.item())                         # per (sequence, retrieval unit), all layers
            heads = 1 if c.per_head else Hkv
            out.update({"block_loads": self.staged_blocks * self.batch * self.units + moved,
                        "staged_bytes": (self.staged_rows * self.batch * Hkv + moved * c.block_size * heads) * row,
                        "block_stores": 0, "host_pinned": self.store.pinned, "host_bytes": self.store.host_bytes(),
                        "device_cache_bytes": self.stage.device_bytes()})
        if self.needle is not None:
            out["needle_recall"] = {layer: [round(x, 4) for x in v] for layer, v in self.recall.items()}
        return out
