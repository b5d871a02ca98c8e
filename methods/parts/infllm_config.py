"""InfLLM / Ltri-LLM's options (methods/infllm.py, methods/ltri.py): the context memory they share
(MemoryConfig) and InfLLM's representative keys (InfLLMConfig)."""
from __future__ import annotations

from dataclasses import dataclass

from common.errors import ConfigError
from methods.config import MethodConfig, option


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
    max_cached_block: int = option(32, "the host path's GPU cache (offload=true with an evidence option): blocks "
                                   "per layer and sequence kept on the GPU, evicted least recently used; the "
                                   "device path (evidence none) has no cache and does not read it", min=1)
    offload: bool = option(True, "true: every token's key and value in host memory (pinned on CUDA). With evidence "
                           "none the device path: retrieval on the GPU; a layer's retrieved blocks are gathered from "
                           "host memory into its GPU staging slots by a kernel when they are new to them "
                           "(InfLLM's buffer reuse; sinks kept on the GPU, the remainder taken from the window; "
                           "unified addressing: no host sync, decode CUDA-graph captured); device memory flat "
                           "in the context. With an evidence option the host path: retrieval synced to the "
                           "host every layer, max_cached_block blocks LRU-cached on the GPU. false: every token "
                           "stays on the GPU (the device path with nothing moved)")
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
        if self.offload and self.evidence != "none" and self.max_cached_block < need:
            raise ConfigError(f"method.max_cached_block={self.max_cached_block} is below the {need} blocks one "
                              f"retrieval needs resident (topk{' x KV heads' if self.per_head else ''})")

    @property
    def path(self) -> str:
        """Which implementation runs (methods/infllm.py): the needle options need the host path."""
        if self.evidence != "none":
            return "host (LRU cache)" if self.offload else "host (every block on the GPU)"
        return "device, offloaded" if self.offload else "device, resident"

    def describe(self):
        host = self.evidence != "none"
        return {"budget_unit": "tokens per KV head: n_init sinks + topk blocks + n_local window (+ the evicted "
                               "remainder, < block_size + chunk)",
                "budget_total": self.n_init + self.topk * self.block_size + self.n_local,
                "retrieval": "per KV head" if self.per_head else "shared by all heads of a layer",
                "positions": f"local window at real relative positions; sinks, blocks and remainder un-rotated "
                             f"at distance {self.distance}",
                "path": self.path,
                "prefill": f"chunks of {self.exc_block_size}, one retrieval each ({'host' if host else 'device'}); "
                           f"per chunk and layer one kernel over window + memory (<= {self.n_local} + "
                           f"{self.n_init + (self.topk + 1) * self.block_size + self.exc_block_size} keys a query, "
                           f"less than full attention's beyond that) and one more pass over the window for the "
                           f"attention mass each key receives (the representatives' rule)"
                           + ("; one host sync per layer and chunk" + (" (the LRU cache is kept on the host) and "
                              "the blocks' device<->host moves" if self.offload else "") if host else
                              "; the chunk's memory rows staged from host memory" if self.offload else ""),
                "offload": (f"host memory, {self.max_cached_block} blocks GPU-cached (LRU); retrieval synced to the "
                            f"host every layer") if host and self.offload else
                ("host memory (pinned); per layer a GPU staging buffer of n_init + topk blocks + the remainder, "
                 "a decode step gathering only the retrieved blocks new to its slots (<= topk * block_size rows "
                 "per KV head), a prefill chunk its whole memory (max_cached_block unused); retrieval on the "
                 "device, decode CUDA-graph captured") if self.offload
                else "none (every token on the GPU)" + ("" if host else "; retrieval on the device, decode "
                                                        "CUDA-graph captured"),
                "dense_layers": 0}

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
