"""The attention-method interface and its registry.

A method is handed, per layer, the projected q, k, v *before* RoPE and a `Rope` helper that rotates
by any positions. Its options are a typed dataclass (`Config`, see methods/config.py); its attention
math goes through the `kernels` dispatchers only (Triton on CUDA, the torch references elsewhere),
so the same method code runs on every device. It owns its KV storage and any state that flows from layer to layer within one
step (TidalDecode's selected tokens, LycheeDecode's per-KV-head sets). The engine only calls
`setup` once per sequence batch, `begin` at the start of each prefill chunk or decode step, and
`attend` once per layer; it never looks inside the storage.

Shapes (B batch, T new tokens, Hq query heads, Hkv KV heads, D head dim):
    q: [B, Hq, T, D]   k, v: [B, Hkv, T, D]   -> attend returns [B, T, Hq * D]
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from common.registry import Registry
from methods.config import MethodConfig


@dataclass(frozen=True)
class ModelInfo:
    """Architecture facts a method needs; built from the model YAML (before loading) or HF config."""

    arch: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    max_position: int
    vocab_size: int = 0

    @property
    def group(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def scaling(self) -> float:
        return self.head_dim ** -0.5

    @classmethod
    def from_hf_config(cls, config) -> "ModelInfo":
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(
            arch=config.model_type,
            num_layers=config.num_hidden_layers,
            num_heads=config.num_attention_heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
            head_dim=head_dim,
            hidden_size=config.hidden_size,
            max_position=config.max_position_embeddings,
            vocab_size=config.vocab_size,
        )


@dataclass
class Step:
    """One engine call: a prefill chunk or a decode step.

    `start` is the number of tokens of this sequence already seen (the absolute position of the
    first new token); `positions` holds the absolute positions of the new tokens on the device.
    Methods that re-assign positions (StreamingLLM, Cascading) ignore them and use their own.
    """

    phase: str  # "prefill" | "decode" | "correct" (dense re-run of cached tokens, see correction_span)
    start: int
    length: int
    positions: torch.Tensor  # [T] int64
    graphed: bool = False    # inside a captured CUDA graph: use `positions`, not start/end ints

    @property
    def end(self) -> int:
        return self.start + self.length


class Method:
    """Base class. Subclasses set `name` and `Config`, implement `setup` and `attend`, and declare
    their persistent tensors in `buffers`; the rest has defaults."""

    name: ClassVar[str] = ""
    Config: ClassVar[type[MethodConfig]] = MethodConfig
    # True if `attend` in decode is static-shape and host-sync-free given device `step.positions`
    # (no Python ints from the step, no allocation-dependent shapes): the engine may then capture
    # decode in a CUDA graph, re-capturing whenever a tensor of `buffers()` moves.
    graph_safe: ClassVar[bool] = False
    # True if running a decode step twice at the same position leaves the state of running it once
    # (it only writes the slots of that position, or merges idempotently: min/max). The engine warms
    # a graph up by running the step before capturing it; for a method that is not idempotent
    # (scores accumulated, tokens evicted) it saves and restores the declared buffers around that.
    decode_idempotent: ClassVar[bool] = False

    def __init__(self, cfg: Any):
        self.cfg = cfg if isinstance(cfg, self.Config) else self.Config.parse(cfg)
        self.info: ModelInfo | None = None
        self.step: Step | None = None
        self._attended: dict[int, float] = {}

    @property
    def prefill_chunk(self) -> int | None:
        return getattr(self.cfg, "prefill_chunk", None)

    # --- validation before any model loads -------------------------------------------------
    @classmethod
    def validate(cls, cfg: Any, info: ModelInfo) -> MethodConfig:
        """The typed config; ConfigError (one line) for settings that cannot work on this model."""
        return cls.Config.parse(cfg, info)

    # --- life cycle --------------------------------------------------------------------------
    def setup(self, info: ModelInfo, batch: int, max_len: int, device: torch.device, dtype: torch.dtype) -> None:
        """Allocate (or reuse, when the shapes match) storage for `batch` sequences of up to
        `max_len` tokens and reset every per-sequence state: a method object serves many samples."""
        raise NotImplementedError

    def begin(self, step: Step) -> None:
        """Start of a prefill chunk or decode step; per-step state that flows across layers resets here."""
        self.step = step

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope) -> torch.Tensor:
        raise NotImplementedError

    def buffers(self) -> dict[str, torch.Tensor]:
        """Every persistent device tensor (allocated in `setup`, living across steps) that a decode
        step reads or writes: KV stores, page bounds, score accumulators, head masks. A captured
        CUDA graph replays raw pointers, so the engine re-captures whenever one of these moves; the
        conformance suite fails a method that mutates or keeps a tensor it did not declare, and
        fills these with NaN/garbage between samples to prove that nothing stale leaks."""
        return {}

    def release(self) -> None:
        """Drop every buffer (the engine calls this when it is closed): device memory goes back at
        once, not when the garbage collector finds the engine."""
        for key, value in list(vars(self).items()):
            if isinstance(value, torch.Tensor) or hasattr(value, "buffers"):
                setattr(self, key, None)

    @staticmethod
    def device_lengths(step: Step, batch: int) -> torch.Tensor:
        """KV length after this step per sequence, int32 [B] on the device, computed from
        `step.positions` (no host int): what the decode kernels read, CUDA-graph safe."""
        return (step.positions[-1:] + 1).to(torch.int32).expand(batch).contiguous()

    def before_decode(self, seq_len: int) -> None:
        """Asked by the engine before each decode step, on the host and outside any CUDA graph:
        work that changes what the step reads (Tactic clusters the prompt's keys before the first
        decode step). Such work must move a declared buffer so that the engine re-captures; done
        inside the step instead, a graph's warm-up would run it and then restore the buffers from
        before it."""

    def correction_span(self, seq_len: int) -> tuple[int, int] | None:
        """Asked by the engine after each decode step: a span (start, end) of cached tokens to re-run
        densely (TidalDecode's KV cache correction), or None. The engine then feeds those tokens
        again as a step of phase "correct" at their own positions; the method rewrites their KV
        (like a prefill chunk over the cache) and the sequence length does not move."""
        return None

    # --- reporting ---------------------------------------------------------------------------
    def record(self, layer: int, attended: float | torch.Tensor) -> None:
        """Note how many keys `layer` attended in this step (mean over batch/heads if a tensor).

        Only decode steps are recorded: that is where the budget applies and what papers report.
        Tensors are kept on the device (no host sync in the step); `stats` converts them.
        """
        if self.step is not None and self.step.phase == "decode":
            self._attended[layer] = attended

    def stats(self) -> dict:
        """Keys attended per layer in the last decode step (and per head where the method varies)."""
        per_layer = {}
        for layer, n in sorted(self._attended.items()):
            per_layer[layer] = float(n.float().mean()) if isinstance(n, torch.Tensor) else float(n)
        out = {"attended_per_layer": per_layer}
        if per_layer:
            out["attended_mean"] = sum(per_layer.values()) / len(per_layer)
        return out

    def semantics(self) -> dict:
        """Budget semantics and every option, recorded in each result row (from the typed config)."""
        return {"method": self.name, **self.cfg.semantics()}


REGISTRY = Registry("method", "methods", skip=("base", "config", "rope", "selection", "stores"))
register = REGISTRY.register
