"""InfLLM / Ltri-LLM's device path with offload (methods/infllm.py): the memory a step attends, staged on the
device from the positional store in pinned host memory (methods/parts/infllm_device.py PositionalStore),
with InfLLM's own buffer reuse done on the device.

Per layer a staging buffer [B, Hkv, cap, D]: [n_init sinks | topk slots of block_size | the remainder].
- sinks: a token at a position < n_init is written to its column when it arrives (`write_sinks`): they
  never cross PCIe again;
- blocks (a decode step): InfLLM's _arrange (methods/parts/infllm_host.py) on the device. Which block each
  slot holds is a tag ([L, B, units, topk], -1 none); a retrieved block already in a slot stays there, a
  new one takes the first slot whose block is no longer wanted, and only the new ones are gathered from
  host memory (kernels/memory_stage.py, one launch for keys and values). A decode step whose retrieval
  did not change (Ltri-LLM's persistent decode) moves no block at all;
- remainder (a decode step): from the window ring on the device (where the host path takes it too);
- a prefill chunk stages [sinks | blocks | remainder] contiguously from host memory (its geometry is host
  ints), which is the slot layout with slot i = the i-th retrieved block; the tags say so.

A decode step reads its memory through token indices into the buffer (kernels/memory_decode.py) in block
order, as the resident path reads its store: the same keys in the same order, the same floats. All of it
is static-shape and sync-free, and a step run twice at one position finds its blocks in place (nothing
moved, nothing changed: idempotent), so the engine captures it in a CUDA graph.
"""
from __future__ import annotations

import torch

from kernels.memory_prefill import memory_positions
from kernels.memory_stage import gather_rows, scatter_rows
from kernels.slot_stage import assign_slots, stage_rows
from methods.parts.infllm_device import Geometry, MemoryLayout, reuse


class SlotStage:
    def __init__(self):
        self.k = self.v = self.tags = self.moved = None

    def allocate(self, layers, batch, kv_heads, units, n_init, topk, block_size, cap, head_dim, device, dtype):
        self.k = reuse(self.k, (layers, batch, kv_heads, cap, head_dim), dtype, device)
        self.v = reuse(self.v, (layers, batch, kv_heads, cap, head_dim), dtype, device)
        self.tags = reuse(self.tags, (layers, batch, units, topk), torch.int32, device)
        self.moved = reuse(self.moved, (1,), torch.long, device)   # blocks gathered in decode steps (per unit)
        self.tags.fill_(-1)
        self.moved.zero_()
        self.n_init, self.topk, self.bs, self.kv_heads = n_init, topk, block_size, kv_heads
        self.rem_col = n_init + topk * block_size

    def buffers(self) -> dict[str, torch.Tensor]:
        return {"stage_k": self.k, "stage_v": self.v, "stage_tags": self.tags, "stage_moved": self.moved}

    def device_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.k, self.v, self.tags) if t is not None)

    def write_sinks(self, layer, positions, k, v) -> None:
        scatter_rows(self.k[layer], self.v[layer], positions, k, v, limit=self.n_init)

    # --- a prefill chunk ---------------------------------------------------------------------------
    def prefill(self, layer, store, blocks2) -> int:
        """Stage [sinks | blocks | remainder] (blocks2: kernels/memory_prefill.py's tuple) in one gather from
        host memory; returns its length. Slot i holds the i-th retrieved block from now on."""
        ids, n_mem, nsel = blocks2[0], blocks2[-1], blocks2[4]
        pos = memory_positions(ids, self.kv_heads, *blocks2[1:])
        cnt = torch.full(pos.shape[:2], n_mem, dtype=torch.int32, device=pos.device)
        gather_rows(self.k[layer], self.v[layer], store.k[layer], store.v[layer], pos, cnt)
        tags = self.tags[layer]
        tags.fill_(-1)
        n = min(nsel, ids.shape[-1], self.topk)
        if n:
            tags[..., :n] = ids[..., :n]
        return n_mem

    # --- a decode step -----------------------------------------------------------------------------
    def layout(self, geo: Geometry, width: int, device) -> MemoryLayout:
        """Once per decode step: buffer columns of [sinks | retrieved blocks' slots | remainder]."""
        g = Geometry(geo.init_len, geo.n_blocks, self.rem_col, geo.rem_len)
        return MemoryLayout(g, self.n_init, self.bs, width, self.kv_heads, self.k.shape[3], device)

    def decode(self, layer, store, ring_k, ring_v, ids, counts, geo: Geometry, ring_size: int, layout: MemoryLayout):
        """Bring the retrieved blocks into slots (only the new ones move) and the remainder from the ring;
        -> (columns int32 [B, Hkv, width], counts int32 [B, Hkv]) of the memory in the buffer, block order.
        Three launches (kernels/slot_stage.py: the slots, the rows; kernels/memory_index.py: the columns)."""
        slot, src_blk, dst_slot, n_new = assign_slots(self.tags[layer], ids, counts, self.moved)
        stage_rows(self.k[layer], self.v[layer], store.k[layer], store.v[layer], ring_k, ring_v, src_blk, dst_slot,
                   n_new, self.n_init, self.bs, geo.rem_start, geo.rem_len, self.rem_col)
        return layout.index(slot, counts)
