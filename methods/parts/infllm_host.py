"""InfLLM / Ltri-LLM's host path (the evidence options, which edit and record retrievals on the host; with
evidence none both offload settings take the device path, methods/parts/infllm_device.py and
infllm_stage.py): the retrieval synced to the host every layer, the blocks made resident in the LRU cache (stores_blocks.BlockMemory) and copied into one
contiguous memory buffer per layer (InfLLM's slot reuse), and the needle bookkeeping (Ltri-LLM section 2:
which blocks hold the sample's needle, forcing them into a retrieval, the share of its tokens a decode
step attends). A mixin of methods/infllm.py's InfLLM."""
from __future__ import annotations

import torch


class HostPath:
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

    def memory_pos(self, n_mem: int) -> torch.Tensor:
        """memory_positions as [B, n_mem] (the prefill kernel's layout), made once per step (begin clears it)."""
        if n_mem not in self._mem_pos:
            self._mem_pos[n_mem] = self.memory_positions(n_mem, self.q_pos.device).expand(self.batch, n_mem).contiguous()
        return self._mem_pos[n_mem]

    def memory_positions(self, n_mem: int, device) -> torch.Tensor:
        """Positions of the memory prefix, for the per-query remainder mask: sinks and blocks are out of
        every window of this chunk (0 stands for them), the remainder has its own."""
        pos = torch.zeros(n_mem, dtype=torch.long, device=device)
        if self.rem_len:
            pos[n_mem - self.rem_len:] = torch.arange(self.rem_start, self.rem_start + self.rem_len, device=device)
        return pos

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
            self._selected[layer] = sel
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
        slot whose block is no longer wanted (only those are copied: one gather and one index_copy for
        all of them, not a copy per block)."""
        c, held = self.cfg, self.buf_blocks[layer][b][u]
        want = set(blocks)
        heads = slice(None) if not self.cfg.per_head else slice(u, u + 1)
        src, dst = [], []
        for blk in sorted(want):
            if blk in held:
                continue
            j = next(i for i, h in enumerate(held) if h is None or h not in want)
            held[j] = blk
            src.append(slots[blk])
            dst.append(j)
        if not src:
            return
        m, bs = self.memory, c.block_size
        if len(src) == 1:
            s = c.n_init + dst[0] * bs
            self.buf_k[layer, b, heads, s:s + bs] = m.cache_k[layer, b, src[0], heads]
            self.buf_v[layer, b, heads, s:s + bs] = m.cache_v[layer, b, src[0], heads]
            return
        dev = self.buf_k.device
        s_idx = torch.tensor(src, device=dev)
        d_idx = (torch.tensor(dst, device=dev).unsqueeze(1) * bs + (c.n_init + torch.arange(bs, device=dev))).flatten()
        for cache, buf in ((m.cache_k, self.buf_k), (m.cache_v, self.buf_v)):
            part = cache[layer, b].index_select(0, s_idx)[:, heads]                   # [n, H, bs, D]
            buf[layer, b, heads].index_copy_(1, d_idx, part.transpose(0, 1).flatten(1, 2))
