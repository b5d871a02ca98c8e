"""LycheeDecode (HITsz-TMG/TMGNLP LycheeDecode/, src/llama/modeling_llama.py): hybrid-head sparse decoding.

Roles are per KV head, read from a head file (methods/parts/headfile.py; layers x KV heads, layer 0 all
retrieval). In a decode step, layer by layer:
  * retrieval KV heads attend every cached token (dense output) and pick a token set from q̄·K,
    UNSCALED, with q̄ the query averaged over the GQA group, over the whole cache; the set is
    written for that KV-head index (reference: `sparse_mask[:, full_heads_idx] = mask`);
  * sparse KV heads attend only the set most recently written for their KV-head index by an
    EARLIER layer of the same step (not necessarily the previous layer); sets never persist across
    steps (the reference recomputes the mask every step; layer 0 being all retrieval guarantees a set).
Selection modes (methods/parts/lychee_sets.py): topk (K counts 128 sinks + 256 recent, the reference's
defaults), ratio, topp, threshold; the reference's hard-coded 128^-0.5 softmax scale of topp and
threshold is `prob_scale: reference` (model = the model's own head_dim^-0.5).
Prefill is dense. Cache correction (paper sec. 4.2.2, Table 2 "w/ Cache Correction"; not in the
public code): every `correction_interval` decoded tokens their KV is recomputed densely.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

import kernels
from kernels.hybrid import hybrid_decode
from methods.base import Method, register
from methods.config import ChunkedPrefill, option
from methods.parts import headfile, lychee_sets
from methods.parts.stores import FullStore

MODES = ("topk", "ratio", "topp", "threshold")
REFERENCE_SCALE = 128 ** -0.5  # utils.py get_sparse_attn_mask_from_topp/threshold default `scale`


@dataclass(frozen=True)
class HeadConfig(ChunkedPrefill):
    """Shared by LycheeDecode and DuoAttention: where the head roles come from."""

    heads: str = option("auto", "auto (methods/heads/<model>-<recipe>.json) | a head-file path | random:SEED[:N] "
                        "(N random retrieval heads) | inline:ROWS (0/1 per KV head, rows split by '/') | all")
    recipe: str = option("passkey-hardkuma", "training recipe of the auto head file (the file name's suffix)")
    head_model: str | None = option("${oc.select:model.name,null}", "model name of heads=auto (Hydra fills it from "
                                    "model.name; null outside a composed config)")


@dataclass(frozen=True)
class LycheeConfig(HeadConfig):
    """LycheeDecode (HITsz-TMG/TMGNLP LycheeDecode): retrieval KV heads attend densely and select tokens
    (q̄·K over the whole cache), sparse KV heads reuse the latest set of their KV-head index.
    Defaults follow the reference LongBench setting (topk, K = 4096 including 128 sinks + 256 recent)."""

    mode: str = option("topk", "selection rule of the retrieval heads (reference --sparse_mode; radio = ratio)",
                       choices=MODES)
    budget: int = option(4096, "topk: tokens per KV head, sinks and recent included (reference mode_value)", min=1)
    ratio: float = option(0.5, "ratio: sparsity r, keep int((1 - r) * length) tokens (paper Table 2: 0.5)",
                          min=0.0, max=1.0)
    top_p: float = option(0.999, "topp: probability mass p", min=0.0, max=1.0)
    threshold: float = option(1.0e-5, "threshold: keep tokens with probability > tau", min=0.0, max=1.0)
    prob_scale: str = option("reference", "topp/threshold softmax scale: reference (128^-0.5, hard-coded in the "
                             "code) | model (head_dim^-0.5)", choices=("reference", "model"))
    sink: int = option(128, "topk/ratio: first tokens forced into every set (reference sink_tokens)", min=0)
    recent: int = option(256, "topk/ratio: last tokens forced into every set (reference recent_tokens)", min=0)
    correction_interval: int | None = option(None, "dense KV recompute every T decoded tokens (paper Table 2 'w/ "
                                             "Cache Correction': 32); null = off (public code)", min=1)
    block_size: int = option(1, "1: token sets (the accuracy path); B > 1: sets of B-slot blocks, the top budget/B "
                             "blocks by max-pooled q̄·K, nothing forced (the reference's block-level e2e path, 64)",
                             min=1)

    def check(self, info):
        from common.errors import ConfigError

        if self.block_size > 1 and (self.mode != "topk" or self.block_size & (self.block_size - 1)):
            raise ConfigError(f"method.block_size={self.block_size} needs mode=topk and a power of two")
        if self.block_size > 1 and self.budget < self.block_size:
            raise ConfigError(f"method.budget={self.budget} is below one block (block_size={self.block_size})")
        self.head_set(info)

    def head_set(self, info) -> headfile.HeadSet:
        return headfile.resolve(self.heads, model=self.head_model, recipe=self.recipe, num_layers=info.num_layers,
                                num_kv_heads=info.num_kv_heads, force_layer0=True, method="LycheeDecode")

    def describe(self):
        blocks = f"{self.budget // self.block_size} blocks of {self.block_size} per KV head, top by max-pooled q̄·K"
        unit = {"topk": blocks if self.block_size > 1 else
                f"tokens per KV head ({self.budget}, incl. {self.sink} sinks + {self.recent} recent)",
                "ratio": f"int((1 - {self.ratio}) x length) tokens per KV head, incl. sinks + recent",
                "topp": f"top-p {self.top_p} of softmax({self.prob_scale} scale x q̄·K)",
                "threshold": f"probability > {self.threshold} (softmax, {self.prob_scale} scale)"}[self.mode]
        return {"budget_unit": unit, "selection_score": "q̄·K unscaled, group-averaged query, whole cache",
                "set_scope": "per KV head, written by retrieval heads, reused by later sparse heads of that "
                             "KV index within the step", "dense_layers": [0], "prefill": "dense",
                "current_token": "in the recent window" if self.mode in ("topk", "ratio") else "competes"}

    @classmethod
    def variants(cls):
        heads = "inline:11/10/01/00/11/01"
        return [{"heads": "random:0:3", "budget": 20, "sink": 4, "recent": 8},
                {"heads": heads, "mode": "ratio", "ratio": 0.6, "sink": 2, "recent": 4, "correction_interval": 5},
                {"heads": heads, "mode": "topp", "top_p": 0.6, "prob_scale": "model", "prefill_chunk": 16},
                {"heads": heads, "mode": "threshold", "threshold": 0.015},
                {"heads": heads, "budget": 6, "sink": 2, "recent": 6},
                {"heads": heads, "budget": 16, "block_size": 4}]

    def full_equivalent(self, context):
        return {"mode": "topk", "budget": max(self.budget, -(-context // self.block_size) * self.block_size)}


class _Deferred:
    """A recorded count that `Method.stats` reads with float(): computed then, after the step, so the
    step itself launches no kernels for it (a captured step replays every kernel it launched)."""

    def __init__(self, fn):
        self.fn = fn

    def __float__(self):
        return float(self.fn().float().mean())


class HybridHeads(Method):
    """Shared machinery of LycheeDecode and DuoAttention: a full store of rotated keys, dense
    prefill/correction, per-layer roles as device masks (declared buffers), hybrid decode."""

    graph_safe = True  # static shapes (index span = capacity on CUDA), device lengths and roles
    # a step writes only its own position's KV; the index sets live for one step and are rebuilt from
    # layer 0 (all retrieval) every step, so nothing carries over between two runs of a step
    decode_idempotent = True

    def head_set(self, info) -> headfile.HeadSet:
        return self.cfg.head_set(info)

    def setup(self, info, batch, max_len, device, dtype):
        self.info, self.batch = info, batch
        self.store = getattr(self, "store", None) or FullStore()  # reuse: a captured graph points at it
        self.store.allocate(info.num_layers, batch, info.num_kv_heads, max_len, info.head_dim, device, dtype)
        hs = self.head_set(info)
        self.heads_source = hs.source
        self.roles_host = [tuple(r) for r in hs.roles]
        roles = torch.tensor(hs.roles, dtype=torch.bool)
        # retrieval KV-head ids per layer, left-aligned (row l: the first n_ret(l) entries)
        ids = torch.stack([torch.cat([torch.nonzero(r).flatten(), torch.nonzero(~r).flatten()]) for r in roles])
        if getattr(self, "roles", None) is None or self.roles.shape != roles.shape \
                or self.roles.device != torch.device(device):
            self.roles = torch.empty(roles.shape, dtype=torch.bool, device=device)
            self._ret_ids = torch.empty(ids.shape, dtype=torch.long, device=device)
        # refilled every sample (buffers are reused across samples; the suite poisons them in between)
        self.roles.copy_(roles)
        self._ret_ids.copy_(ids)
        self._clean_end = 0

    def buffers(self):
        return {**self.store.buffers(), "roles": self.roles, "ret_ids": self._ret_ids}

    def begin(self, step):
        super().begin(step)
        self.lengths = self.device_lengths(step, self.batch)
        self.index = self.counts = None
        if step.phase != "decode":
            self._clean_end = max(self._clean_end, step.end)

    def correction_span(self, seq_len: int):
        interval = getattr(self.cfg, "correction_interval", None)
        if interval and seq_len - self._clean_end >= interval:
            return self._clean_end, seq_len
        return None

    def attend(self, layer, q, k, v, rope):
        step = self.step
        q = rope.apply(q, step.positions)
        k = rope.apply(k, step.positions)
        self.store.write(layer, step.positions, k, v)  # a correction step rewrites the polluted KV here
        if step.phase != "decode":
            keys, values = self.store.view(layer, step.end)
            return self.prefill(layer, q, keys, values)
        B = q.shape[0]
        q1 = q[:, :, 0].contiguous()
        out = self.decode(layer, q1, self.store.k[layer], self.store.v[layer])
        return out.view(B, 1, -1)

    def prefill(self, layer, q, keys, values):
        return kernels.prefill_attention(q, keys, values, self.info.scaling)

    def n_ret(self, layer) -> int:
        return sum(self.roles_host[layer])

    def ret_ids(self, layer) -> torch.Tensor:
        return self._ret_ids[layer, :self.n_ret(layer)]

    def record_hybrid(self, layer, retrieval_all: bool, block: int = 1):
        if retrieval_all or self.counts is None:
            self.record(layer, self.lengths)
            return
        roles, counts, lengths = self.roles[layer].view(1, -1), self.counts, self.lengths

        # evaluated by stats(), after the step, from the tensors this layer read (no kernels in the step).
        # `counts` is this layer's own tensor (sets index_copy'd per layer) or LycheeDecode's in-place set
        # buffer, whose rows all hold min(k, live entries) by then in the top-k modes (see decode)
        def attended():
            sparse = torch.clamp(counts * block, max=lengths.view(-1, 1))  # a partial last block counts whole
            return torch.where(roles, lengths.view(-1, 1), sparse).float()
        self.record(layer, _Deferred(attended))


@register
class LycheeDecode(HybridHeads):
    name = "lychee"
    Config = LycheeConfig

    def setup(self, info, batch, max_len, device, dtype):
        super().setup(info, batch, max_len, device, dtype)
        c = self.cfg
        # top-k modes have a fixed set width: the step's per-KV-head sets live in one buffer that each
        # layer's selection writes in place (rows of its retrieval heads; layer 0 writes every row)
        width = c.budget // c.block_size if c.block_size > 1 else \
            max(c.budget, c.sink + c.recent) if c.mode == "topk" else None
        sets = getattr(self, "_sets", None)
        if width is None:
            self._sets = None
        elif sets is None or sets[0].shape != (batch, info.num_kv_heads, width) or sets[0].device != torch.device(device):
            self._sets = (torch.zeros(batch, info.num_kv_heads, width, dtype=torch.int32, device=device),
                          torch.zeros(batch, info.num_kv_heads, dtype=torch.int32, device=device))
        # the selection runs on a side stream where there is one (CUDA): it overlaps the rest of the layer
        # (o_proj, MLP, the next QKV), and only the next layer's attention waits for it (_join)
        cuda = torch.device(device).type == "cuda"
        if getattr(self, "_side", None) is None and cuda:
            self._side = torch.cuda.Stream(device=device)
        elif not cuda:
            self._side = None
        self._pending = None

    def begin(self, step):
        self._join()
        super().begin(step)

    def _join(self):
        """The current stream waits for the last selection launched on the side stream."""
        if getattr(self, "_pending", None) is not None:
            torch.cuda.current_stream().wait_stream(self._side)
            self._pending = None

    def _select_sets(self, scores, heads):
        """This layer's sets into the step's set buffer, on the side stream when there is one."""
        if self._side is None:
            return self.select(scores, out=self._sets, rows=heads)
        self._side.wait_stream(torch.cuda.current_stream())   # the scores are written
        with torch.cuda.stream(self._side):
            self.select(scores, out=self._sets, rows=heads)
        # kept until the join: freed earlier, the allocator could hand the scores' memory to the main
        # stream while the side stream still reads it
        self._pending = (scores, heads)
        return self._sets

    def buffers(self):
        sets = {} if self._sets is None else {"set_index": self._sets[0], "set_counts": self._sets[1]}
        return {**super().buffers(), **sets}

    def decode(self, layer, q1, keys, values):
        self._join()  # the sets of the layers before are complete before this layer's sparse heads read them
        c, cap, scale = self.cfg, self.store.capacity, self.info.scaling
        n_ret, all_ret = self.n_ret(layer), all(self.roles_host[layer])
        # sparse heads read the sets of earlier layers: attend before this layer writes its own; the
        # retrieval heads' selection scores come out of the same kernel (their keys are read once)
        bs = c.block_size
        heads = self.ret_ids(layer) if n_ret else None
        # an all-retrieval layer reads no set; it passes the step's sets where there are some (after layer 0),
        # None at layer 0 (the kernel then needs no index at all)
        # top-k token sets: the kernel writes the forced sinks + recent slots as +inf (-inf elsewhere when
        # they fill the budget), so the selection is the top-k alone (no mask and fill a layer, issue 33)
        force = (c.sink, c.recent, c.budget <= c.sink + c.recent) if c.mode == "topk" and bs == 1 else None
        res = hybrid_decode(q1, keys, values, self.lengths, self.roles[layer], self.index, self.counts, scale,
                            max_length=cap, page=bs, roles=self.roles_host[layer], score_heads=heads,
                            score_block=bs, score_force=force)
        out, scores = res if n_ret else (res, None)
        self.record_hybrid(layer, all_ret, bs)
        if layer == self.info.num_layers - 1:
            return out  # the last layer's sets would be read by no one (sets do not outlive the step)
        if n_ret and self._sets is not None:
            # in place: the rows of sets that this layer's sparse heads read stay as they were. In the
            # top-k modes every row then holds min(k, live entries) counts (what record_hybrid relies on)
            self.index, self.counts = self._select_sets(scores, heads)
        elif n_ret:
            index, counts = self.select(scores)
            if self.index is None:  # layer 0 (all retrieval): the step's sets start here
                self.index, self.counts = index, counts
            else:
                self.index = self.index.index_copy(1, heads, index)
                self.counts = self.counts.index_copy(1, heads, counts)
        return out

    def select(self, scores, out=None, rows=None):
        c = self.cfg
        scale = REFERENCE_SCALE if c.prob_scale == "reference" else self.info.scaling
        # timing switches (bench.profile_decode --alt lychee:topk_chunks=1 / topk_radix_max=0 / topk_block=4096):
        # the top-k's two-stage split, the row length past which token rows go to torch.topk
        # (lychee_sets.RADIX_MAX) and the radix kernel's scores per loop step (fewer, longer steps on 11K-16K
        # token chunks; unmeasured)
        chunks = getattr(self, "topk_chunks", None)   # None: lychee_sets' defaults
        if c.block_size > 1:
            return lychee_sets.top_blocks(scores, c.budget // c.block_size, out=out, rows=rows, chunks=chunks)
        if c.mode == "topk":   # scores boosted by the attention kernel (decode's score_force)
            return lychee_sets.topk(scores, self.lengths, c.budget, c.sink, c.recent, out=out, rows=rows,
                                    boosted=True, chunks=chunks, radix_max=getattr(self, "topk_radix_max", None),
                                    block=getattr(self, "topk_block", None))
        if c.mode == "ratio":
            return lychee_sets.ratio(scores, self.lengths, c.ratio, c.sink, c.recent)
        if c.mode == "topp":
            return lychee_sets.topp(scores, self.lengths, c.top_p, scale)
        return lychee_sets.threshold(scores, self.lengths, c.threshold, scale)
