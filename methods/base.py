"""The attention-method interface and its registry.

A method is handed, per layer, the projected q, k, v *before* RoPE and a `Rope` helper that rotates
by any positions. It owns its KV storage and any state that flows from layer to layer within one
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

from common.errors import ConfigError
from common.registry import Registry


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
    """Base class. Subclasses set `name` and implement `setup`, `attend`; the rest has defaults."""

    name: ClassVar[str] = ""
    # True if `attend` in decode is static-shape and host-sync-free given device `step.positions`
    # (no Python ints from the step, no allocation-dependent shapes) and `setup` keeps the same
    # buffers for the same (batch, max_len): the engine may then capture decode in a CUDA graph.
    graph_safe: ClassVar[bool] = False
    # Keys every result row carries to say what the budget means (filled by `semantics`).
    semantics_keys: ClassVar[tuple[str, ...]] = ()

    def __init__(self, cfg: Any):
        self.cfg = cfg
        self.prefill_chunk: int | None = cfg.get("prefill_chunk") if hasattr(cfg, "get") else None
        self.info: ModelInfo | None = None
        self.step: Step | None = None
        self._attended: dict[int, float] = {}

    # --- validation before any model loads -------------------------------------------------
    @classmethod
    def validate(cls, cfg: Any, info: ModelInfo) -> None:
        """Raise ConfigError (one line) for settings that cannot work on this model."""
        chunk = cfg.get("prefill_chunk")
        if chunk is not None and int(chunk) <= 0:
            raise ConfigError(f"method.prefill_chunk must be a positive integer or null, got {chunk}")

    # --- life cycle --------------------------------------------------------------------------
    def setup(self, info: ModelInfo, batch: int, max_len: int, device: torch.device, dtype: torch.dtype) -> None:
        raise NotImplementedError

    def begin(self, step: Step) -> None:
        """Start of a prefill chunk or decode step; per-step state that flows across layers resets here."""
        self.step = step

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope) -> torch.Tensor:
        raise NotImplementedError

    def graph_key(self) -> tuple:
        """Addresses of the buffers a captured decode graph reads and writes: the engine captures
        again whenever they change (a graph replays raw pointers)."""
        tensors = [getattr(obj, name) for obj in (getattr(self, "store", None), getattr(self, "bounds", None))
                   if obj is not None for name in ("k", "v", "kmin", "kmax") if getattr(obj, name, None) is not None]
        return tuple(t.data_ptr() for t in tensors)

    @staticmethod
    def device_lengths(step: Step, batch: int) -> torch.Tensor:
        """KV length after this step per sequence, int32 [B] on the device, computed from
        `step.positions` (no host int): what the decode kernels read, CUDA-graph safe."""
        return (step.positions[-1:] + 1).to(torch.int32).expand(batch).contiguous()

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
        """Budget semantics and every option that changes behaviour, recorded in each result row."""
        return {"method": self.name, **{k: _plain(self.cfg.get(k)) for k in self.cfg.keys() if k != "name"}}


def _plain(value):
    try:
        from omegaconf import OmegaConf

        if OmegaConf.is_config(value):
            return OmegaConf.to_container(value, resolve=True)
    except ImportError:  # pragma: no cover
        pass
    return value


REGISTRY = Registry("method", "methods", skip=("base", "rope", "attention", "stores"))
register = REGISTRY.register
