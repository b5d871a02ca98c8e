"""Attention methods: one module per method, registered by name.

Adding a method is one file here (a `Method` subclass decorated with `@register`) plus one YAML in
`conf/method/`; every module in this package is imported on first use so the registry is complete.
"""
from __future__ import annotations

import importlib
import pkgutil

from methods.base import REGISTRY, Method, ModelInfo, Step, register
from runners.errors import ConfigError

_SKIP = {"base", "rope", "attention", "stores"}


def _import_all() -> None:
    for mod in pkgutil.iter_modules(__path__):
        if mod.name not in _SKIP and not mod.name.startswith("_"):
            importlib.import_module(f"{__name__}.{mod.name}")


def get(name: str) -> type[Method]:
    _import_all()
    if name not in REGISTRY:
        raise ConfigError(f"unknown method {name!r}; known: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[name]


def build(cfg, info: ModelInfo) -> Method:
    cls = get(cfg.name)
    cls.validate(cfg, info)
    return cls(cfg)


__all__ = ["Method", "ModelInfo", "Step", "register", "get", "build", "REGISTRY"]
