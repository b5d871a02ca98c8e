"""Tasks: one module per task, registered by name (a `Task` subclass with `@register` plus one YAML
in `conf/task/`). Every module in this package is imported on first use."""
from __future__ import annotations

import importlib
import pkgutil

from runners.errors import ConfigError
from tasks.base import REGISTRY, ModelSpec, Sample, Task, register

_SKIP = {"base", "metrics"}


def _import_all() -> None:
    for mod in pkgutil.iter_modules(__path__):
        if mod.name not in _SKIP and not mod.name.startswith("_"):
            importlib.import_module(f"{__name__}.{mod.name}")


def get(name: str) -> type[Task]:
    _import_all()
    if name not in REGISTRY:
        raise ConfigError(f"unknown task {name!r}; known: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[name]


def build(cfg, tokenizer, model: ModelSpec) -> Task:
    cls = get(cfg.name)
    cls.validate(cfg, model)
    return cls(cfg, tokenizer, model)


__all__ = ["Task", "Sample", "ModelSpec", "register", "get", "build", "REGISTRY"]
