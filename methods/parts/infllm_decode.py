"""InfLLM / Ltri-LLM's decode step on the device path (methods/infllm.py), per layer, in few launches: inside
a CUDA graph every small kernel still costs ~2 us, and the torch version of this bookkeeping was ~100 (~160
with offload) kernels per layer, several ms a step (notes/perf_bench.md, issue 33). Now:

- `write_decode`: the last step's pending mass folded into the ring's scores, the token into the ring, the
  positional store and (offload) the sink columns: one launch (kernels/memory_write.py);
- the retrieval (methods/infllm.py select_device): one GEMV with the step's live-block bias, one top-k;
- `attend_decode`: offload: the slots and the staging copies (kernels/slot_stage.py, 2 launches); the
  memory's token columns (kernels/memory_index.py, 1); the two parts' split-K partials (2) and one epilogue
  (kernels/memory_decode.py: combine, lse, local mass held for the next step).

Everything reads the step's position from the device (`first`): static-shape, sync-free and idempotent at a
position. The torch references of these kernels are the operations they replace (the CPU runs them).
"""
from __future__ import annotations

import torch

from kernels.memory_decode import two_part_decode_mass
from kernels.memory_write import decode_write
from methods.parts.infllm_device import MemoryLayout


class DeviceDecode:
    """Mixed into InfLLM (methods/infllm.py), whose setup allocates what these read."""

    def write_decode(self, layer: int, k: torch.Tensor, k_rot: torch.Tensor, v: torch.Tensor) -> None:
        ring, st = self.ring, self.stage
        decode_write((ring.k_raw[layer], ring.k_rot[layer], ring.v[layer]), ring.score[layer], self.first, k, k_rot,
                     v, (self.store.k[layer], self.store.v[layer]), (st.k[layer], st.v[layer]) if self.offloaded else None,
                     self.cfg.n_init, self.pending.mass[layer], self.pending_at)

    def attend_decode(self, layer: int, q1: torch.Tensor, q_mem: torch.Tensor, ids: torch.Tensor,
                      counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q1 [B, Hq, D] at the real positions, q_mem [B, Hq, 1, D] at the memory distance, the layer's
        retrieval (ids [B, U, k], counts [B, U]) -> (out [B, Hq, D], lse [B, Hq])."""
        c, ring = self.cfg, self.ring
        k2, v2 = self.store.k[layer], self.store.v[layer]
        width = c.n_init + c.topk * c.block_size + c.block_size   # (a layout holds no tensor: built here)
        if self.offloaded:   # new blocks from host memory into their slots; columns of the buffer
            m_index, m_counts = self.stage.decode(layer, self.store, ring.k_raw[layer], ring.v[layer], ids, counts,
                                                  self.geo, self.ring_size, self.stage.layout(self.geo, width, q1.device))
            k2, v2 = self.stage.k[layer], self.stage.v[layer]
        else:
            m_index, m_counts = MemoryLayout(self.geo, c.n_init, c.block_size, width, self.info.num_kv_heads,
                                             k2.shape[2]).index(ids, counts)
        mass = self.pending.mass[layer]
        out, lse = two_part_decode_mass(q1, ring.k_rot[layer], ring.v[layer], self.local_index, self.local_counts,
                                        q_mem[:, :, 0].contiguous(), k2, v2, m_index, m_counts, self.info.scaling,
                                        scores=self.scratch, first=self.first, ring_size=self.ring_size,
                                        mass_out=mass, pos_out=self.pending.pos[layer], workspace=self.partials)
        self.pending.held = True
        self.observe(layer, self.q_rot, lse.unsqueeze(-1), mass)
        self.record(layer, self.local_counts + m_counts)
        return out, lse
