"""Ltri-LLM's retrieval of a step (methods/ltri.py): each indexing layer's own top-k, the collaborative vote of
the retrieval layers up to a layer, and the ids handed to the attention. A mixin of Ltri.

The votes accumulate across a step's layers in one tensor (`_votes`): layer l's rank is the sum of the weights
of the voters up to l, which the layers add in ascending order as they retrieve, the same adds in the same
order as a fresh sum over the voters at every layer (the same bits), one scatter per voter instead of one per
(voter, later layer). The device path keeps the ids on the device (no host copy of the retrieval)."""
from __future__ import annotations

import torch

from methods.parts.selection import top_first


class Voting:
    def begin_votes(self) -> None:
        """A step's start: no votes yet (layers vote in order; the accumulator's width is the step's n_blocks)."""
        self._votes, self._latest = None, None

    def _vote(self, layer: int) -> None:
        """After layer `layer` retrieved with its own index: its vote joins the step's tally if it is a voter."""
        if self.rh and layer not in self.rh:
            return
        self._latest = layer
        if not self.cfg.voting:
            return
        top = self.own_top[layer]
        w = self.rh[layer][1] if self.rh else 1.0
        if self._votes is None:
            self._votes = torch.zeros(self.batch, self.n_blocks, dtype=torch.float64, device=top.device)
        elif self._votes.device != top.device:      # layers split over GPUs: the tally follows them
            self._votes = self._votes.to(top.device)
        self._votes.scatter_add_(1, top, torch.full(top.shape, float(w), dtype=torch.float64, device=top.device))

    def _top(self, layer: int, q_mem: torch.Tensor) -> torch.Tensor | None:
        """[B, topk] block ids of this layer's retrieval (rank order), None while every block is taken."""
        c, nb = self.cfg, self.n_blocks
        if layer in self.own:
            self.own_scores[layer] = self.block_scores(layer, q_mem)
            self.own_top[layer] = top_first(self.own_scores[layer], min(c.topk, nb))
            self._vote(layer)
        return None if nb <= c.topk else top_first(self.rank(layer), c.topk)

    def select(self, layer, q_mem):
        c, nb = self.cfg, self.n_blocks
        if self.step.phase == "decode" and c.persistent:
            return self.persist[layer] if self.persist[layer] is not None else [[[]] for _ in range(self.batch)]
        top = self._top(layer, q_mem)
        sel = [[list(range(nb))] for _ in range(self.batch)] if top is None else [[ids] for ids in top.tolist()]
        if self.step.phase != "decode":
            self.persist[layer] = sel
        return sel

    def select_device(self, layer, q_mem):
        """Resident: decode reads the persisted retrieval (no host work); a prefill chunk (or a decode step
        without persistence) scores spans (their slots copied to the host) and ranks on the device: the ids
        [B, 1, topk] in block order never leave it."""
        c = self.cfg
        if self.step.phase == "decode" and c.persistent:
            return self.persist_ids[layer], self.persist_counts[layer]
        if self.n_blocks == 0:   # host int: this path runs eagerly
            z = torch.zeros(self.batch, 1, 0, dtype=torch.int32, device=q_mem.device)
            return z, z.new_zeros(self.batch, 1)
        top = self._top(layer, q_mem)
        k = min(self.n_blocks, c.topk)
        ids = torch.zeros(self.batch, 1, c.topk, dtype=torch.int32, device=q_mem.device)
        if top is None:
            ids[:, 0, :k] = torch.arange(k, dtype=torch.int32, device=q_mem.device)
        else:
            ids[:, 0, :k] = top.sort(-1).values
        counts = torch.full((self.batch, 1), k, dtype=torch.int32, device=q_mem.device)
        if self.step.phase != "decode":
            self.persist_ids[layer].copy_(ids)
            self.persist_counts[layer].copy_(counts)
        return ids, counts

    def voters(self, layer: int) -> list[tuple[int, float]]:
        if self.rh:
            return [(l, s) for l, (_, s) in sorted(self.rh.items()) if l <= layer]
        return [(l, 1.0) for l in range(layer + 1)]

    def rank(self, layer: int) -> torch.Tensor:
        """[B, n_blocks] ranking key of this layer's retrieval (higher first)."""
        c = self.cfg
        if layer in self.own and (not c.voting or (self.rh and layer not in self.rh)):
            return self.own_scores[layer]
        latest = self.own_scores[self._latest]   # a layer without an index: the latest retrieval layer's choice
        if not c.voting:
            return latest
        # ties by the latest voter's similarity, then the lower block (a stable order: the same in a batch
        # as alone), as a fraction in [0, 1): below any vote
        pos = torch.sort(latest.double(), stable=True, dim=-1, descending=True).indices.argsort(-1)
        tie = (self.n_blocks - 1 - pos) / max(1, self.n_blocks)
        return self._votes * 1e6 + tie
