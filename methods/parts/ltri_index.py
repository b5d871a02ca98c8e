"""Ltri-LLM's indexing of the blocks that leave the window (methods/ltri.py; a mixin of Ltri): a step's leaving
blocks of every sequence cut into spans in one call (maps sequence-major: map b n + j is sequence b's j-th block),
their index vectors stored in one IndexVectors.add_rows.

On the device path (the span work on the maps' GPU, methods/parts/ltri_device.py) the cut is launched when the
blocks leave, but its per-map sizes reach the host only with the next query spans of the same layer (one
device-to-host copy for both, `take_pending`), just before the index is read: the host does not wait for the
cut, nor for the chunk's attention queued before it. Every reader of the index flushes first (`flush_index`); a
decode step stores its blocks at once and flushes what prefill left (no tensor kept across decode steps)."""
from __future__ import annotations

import torch

from methods.parts import ltri_device as LD


class Indexing:
    def block_maps(self, layer: int, ids: list[int]) -> torch.Tensor:
        """[B, n, bs, bs] attention maps of blocks `ids` (rows queries, lower triangle), in one gather (a
        prefill chunk's leaving blocks are consecutive: one run of slots)."""
        W, s0 = self.cfg.block_size, self.cfg.n_init + ids[0] * self.cfg.block_size
        if ids == list(range(ids[0], ids[0] + len(ids))):
            slots = self.ring.slots(s0, s0 + len(ids) * W)
        else:
            slots = torch.cat([self.ring.slots(self.cfg.n_init + i * W, self.cfg.n_init + (i + 1) * W) for i in ids])
        rows = self.band[layer].index_select(1, slots).view(self.batch, len(ids), W, W)     # [B, n, bs, W]
        i = torch.arange(W, device=rows.device)
        d = i.view(-1, 1) - i.view(1, -1)
        return torch.where(d >= 0, rows.gather(-1, d.clamp(min=0).expand(rows.shape)), 0.0)

    def index_blocks(self, layer, blocks):
        """Index vectors of the blocks leaving the window at this step (all of a prefill chunk's at once)."""
        if layer not in self.own or not blocks:
            return
        self.flush_index(layer)
        h, B, n, bs = self.own[layer], self.batch, len(blocks), self.cfg.block_size
        ids = [i for i, _, _ in blocks]
        maps = self.block_maps(layer, ids).flatten(0, 1)                            # [B n, bs, bs]
        votes = torch.stack([score[:, h] if h is not None else score.sum(1) for _, _, score in blocks], 1)
        votes = votes.flatten(0, 1)                                                  # [B n, bs]
        keys = self._space(layer, torch.cat([k for _, k, _ in blocks], 2), kv=True).reshape(B * n * bs, -1)
        where, args = self._span_work(maps), self._span_args(layer)
        if where == "device":   # launched now, stored when its sizes come with the next query spans' copy
            rows, meta = LD._run(LD._index_flat, maps.detach(), votes.detach(), args=args)
            rows, meta = rows.clone(), meta.clone()     # a replayed graph's outputs are rewritten by its next replay
            self._pending[layer] = (rows, meta, keys, ids, maps, votes, args)
            if self.step.phase == "decode":     # a decode step keeps no tensor to the next: stored now
                self.flush_index(layer)
            return
        rows, sizes, n_spans = LD.cut_blocks(maps, votes, args, where)
        self._store(layer, rows, keys, ids, sizes, n_spans)

    def take_pending(self, layer: int) -> torch.Tensor | None:
        """The layer's pending cut's device meta [3, N] (sizes, span counts, finite flags), for the caller to copy
        to the host with its own data and hand to `flush_index`; None when nothing is pending."""
        p = self._pending.get(layer)
        return None if p is None else p[1]

    def flush_index(self, layer: int, meta: list | None = None) -> None:
        """Store the layer's pending cut (meta: its host copy, if the caller made one)."""
        p = self._pending.pop(layer, None)
        if p is None:
            return
        rows, meta_d, keys, ids, maps, votes, args = p
        sizes, n_spans, ok = meta if meta is not None else meta_d.cpu().tolist()
        if not all(ok):      # a non-finite map or vote: the whole call by the host's rules (ltri_device's fallback)
            rows, sizes, n_spans = LD.cut_blocks(maps, votes, args, "host")
        else:
            rows = rows[:, :max(sum(sizes), sum(n_spans))]
        self._store(layer, rows, keys, ids, sizes, n_spans)

    def flush_all(self) -> None:
        for layer in list(getattr(self, "_pending", {})):
            self.flush_index(layer)

    def _store(self, layer, rows, keys, ids, sizes, n_spans) -> None:
        """rows [4, width] (ltri_device.index_rows): every map's picks into the index in one add_rows."""
        B, n, bs = self.batch, len(ids), self.cfg.block_size
        total, ns = sum(sizes), sum(n_spans)
        vectors = keys.index_select(0, rows[2, :total] * bs + rows[0, :total])
        if ids == list(range(ids[0], ids[0] + n)):
            span_block = rows[3, :ns] % n + ids[0]
        else:
            span_block = torch.tensor(ids, device=rows.device)[rows[3, :ns] % n]
        self.index.add_rows(layer, vectors, rows[1, :total], span_block, sizes, n_spans, n)
        self.vectors_per_block.setdefault(layer, []).extend(
            sum(sizes[b * n + j] for b in range(B)) / B for j in range(n))
