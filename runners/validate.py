"""Validation of a composed config before any model loads: one ConfigError line for what cannot run."""
from __future__ import annotations

from omegaconf import DictConfig

import methods
import tasks
from methods.base import ModelInfo
from common.errors import ConfigError
from runners.models import SUPPORTED, check_device_name
from tasks.base import ModelSpec

WANDB_MODES = ("disabled", "offline", "online")
ON_ERROR = ("record", "raise")
POSITION_FREE_ROPE = ("default", "linear", "llama3")   # inv_freq does not depend on max_position_embeddings


def model_info(model_cfg) -> ModelInfo:
    """Architecture facts from the model YAML's `arch` block (no download, no load)."""
    arch = model_cfg.get("arch")
    if arch is None:
        raise ConfigError(f"model {model_cfg.get('name')!r} has no arch block in its YAML")
    heads = int(arch.num_attention_heads)
    return ModelInfo(
        arch=str(arch.model_type),
        num_layers=int(arch.num_hidden_layers),
        num_heads=heads,
        num_kv_heads=int(arch.get("num_key_value_heads") or heads),
        head_dim=int(arch.get("head_dim") or int(arch.hidden_size) // heads),
        hidden_size=int(arch.hidden_size),
        max_position=max_position(model_cfg),
        vocab_size=int(arch.get("vocab_size") or 0),
    )


def max_position(model_cfg) -> int:
    """The positions a method may use: `model.max_position` where set, else the model's
    max_position_embeddings. Setting it higher runs RoPE past the trained length, as the Cascading
    reference ran Qwen2-7B (32768 positions) with caches whose in-cache positions pass 32768; HF's
    default, linear and llama3 RoPE compute any position, the quality there is the model's."""
    over = model_cfg.get("max_position")
    if over is None:
        return int(model_cfg.arch.max_position_embeddings)
    if isinstance(over, bool) or not isinstance(over, int) or over < 1:
        raise ConfigError(f"model.max_position must be a positive integer or null, got {over!r}")
    rope = (model_cfg.arch.get("rope_parameters") or {}).get("rope_type", "default")
    if rope not in POSITION_FREE_ROPE:
        # YaRN / dynamic / longrope read max_position_embeddings to scale: raising it would change the model
        raise ConfigError(f"model.max_position needs a RoPE that ignores the model's length ("
                          f"{', '.join(POSITION_FREE_ROPE)}); {model_cfg.name} has rope_type {rope!r}")
    return over


def model_spec(model_cfg, method=None) -> ModelSpec:
    """What a task may know of the model, as read through `method` (a typed method config): a
    method whose `max_context` is None reads any length, so the task's lengths are not refused
    (the prompt-building length, max_length, stays the model's: LongBench still truncates there)."""
    info = model_info(model_cfg)
    limit = info.max_position if method is None else method.max_context(info)
    return ModelSpec(
        name=str(model_cfg.name),
        max_length=min(int(model_cfg.max_length), info.max_position, limit or info.max_position),
        chat_template=bool(model_cfg.get("chat_template", True)),
        stop_tokens=list(model_cfg.get("stop_tokens") or []),
        max_position=min(info.max_position, limit or info.max_position),
        any_length=limit is None,
    )


def validate(cfg: DictConfig) -> None:
    for group in ("method", "task", "model", "runner"):
        if group not in cfg or cfg[group] is None or "name" not in cfg[group]:
            raise ConfigError(f"config group {group!r} is missing or has no name")
    runner = cfg.runner
    if int(runner.batch_size) < 1:
        raise ConfigError(f"runner.batch_size must be >= 1, got {runner.batch_size}")
    if runner.wandb.mode not in WANDB_MODES:
        raise ConfigError(f"runner.wandb.mode must be one of {', '.join(WANDB_MODES)}, got {runner.wandb.mode!r}")
    check_device_name(runner.device)
    devices = runner.get("devices", 1)
    if not (devices == "auto" or (isinstance(devices, int) and not isinstance(devices, bool) and devices >= 1)):
        raise ConfigError(f"runner.devices must be a number of GPUs >= 1 or auto, got {devices!r}")
    if runner.get("on_error", "record") not in ON_ERROR:
        raise ConfigError(f"runner.on_error must be record or raise, got {runner.on_error!r}")
    if runner.dtype not in ("auto", "float32", "fp32", "bfloat16", "bf16", "float16", "fp16"):
        raise ConfigError(f"runner.dtype must be auto, float32, bfloat16 or float16, got {runner.dtype!r}")
    if cfg.model.get("weights", "pretrained") not in ("pretrained", "random"):
        raise ConfigError(f"model.weights must be pretrained or random, got {cfg.model.weights!r}")
    info = model_info(cfg.model)
    if info.arch not in SUPPORTED:
        raise ConfigError(f"model family {info.arch!r} is not supported; supported: {', '.join(SUPPORTED)}")
    method = methods.get(cfg.method.name).validate(cfg.method, info)
    tasks.get(cfg.task.name).validate(cfg.task, model_spec(cfg.model, method))
