"""Attention methods: one module per method, registered by name.

Adding a method is one file here (a `Method` subclass decorated with `@register`) plus one YAML in
`conf/method/`; every module in this package is imported on first use so the registry is complete.
"""
from __future__ import annotations

from methods.base import REGISTRY, Method, ModelInfo, Step, register


def get(name: str) -> type[Method]:
    return REGISTRY.get(name)


def build(cfg, info: ModelInfo) -> Method:
    cls = get(cfg.name)
    cls.validate(cfg, info)
    return cls(cfg)


__all__ = ["Method", "ModelInfo", "Step", "register", "get", "build", "REGISTRY"]
