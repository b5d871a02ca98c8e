"""Attention methods: one module per method, registered by name.

Each top-level module here is one method, besides the interface (base.py: `Method`, `register`;
config.py: the typed `option(...)` config); the parts several methods share (stores, selection
rules, rope, head and pattern files, k-means) are in methods/parts/.

Adding a method is one file here (a `Method` subclass decorated with `@register`, with its typed
`Config`) plus its YAML in `conf/method/`, generated from that config by `python -m methods`;
every top-level module of this package is imported on first use so the registry is complete, and
the conformance suite (tests/test_methods_conformance.py) tests it without any test being edited.
"""
from __future__ import annotations

from methods.base import REGISTRY, Method, ModelInfo, Step, register


def get(name: str) -> type[Method]:
    return REGISTRY.get(name)


def build(cfg, info: ModelInfo) -> Method:
    """The method named by `cfg.name`, its typed options parsed and checked against the model."""
    cls = get(cfg.name)
    return cls(cls.validate(cfg, info))


__all__ = ["Method", "ModelInfo", "Step", "register", "get", "build", "REGISTRY"]
