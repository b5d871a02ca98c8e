"""Tasks: one module per task, registered by name (a `Task` subclass with `@register` and a typed
`Config`, from which `python -m tasks` writes `conf/task/<name>.yaml`). Every module in this package
is imported on first use."""
from __future__ import annotations

from tasks.base import REGISTRY, ModelSpec, Sample, Task, register


def get(name: str) -> type[Task]:
    return REGISTRY.get(name)


def build(cfg, tokenizer, model: ModelSpec) -> Task:
    cls = get(cfg.name)
    cls.validate(cfg, model)
    return cls(cfg, tokenizer, model)


__all__ = ["Task", "Sample", "ModelSpec", "register", "get", "build", "REGISTRY"]
