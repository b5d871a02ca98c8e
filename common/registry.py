"""A registry of classes by name, filled by importing every module of a package on first use.

Methods and tasks both register this way: `@REGISTRY.register` on the class (its `name` attribute is
the key); `REGISTRY.get(name)` imports the package's modules once and raises a one-line ConfigError
for an unknown name."""
from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator

from common.errors import ConfigError


class Registry:
    def __init__(self, kind: str, package: str, skip: tuple[str, ...] = ()):
        self.kind = kind              # "method" | "task": the word used in error messages
        self.package = package        # the package whose modules register into this registry
        self.skip = set(skip)         # top-level modules that hold no registered class (the interface)
        self._classes: dict[str, type] = {}
        self._loaded = False

    def register(self, cls: type) -> type:
        name = getattr(cls, "name", "")
        if not name:
            raise ValueError(f"{cls.__qualname__} has no name")
        if name in self._classes and self._classes[name] is not cls:
            raise ValueError(f"{self.kind} {name!r} registered twice")
        self._classes[name] = cls
        return cls

    def load(self) -> None:
        """Import every top-level module of the package once (each one registers its classes); its
        subpackages (a method's shared parts, a task's scorers) register nothing and are not scanned."""
        if self._loaded:
            return
        pkg = importlib.import_module(self.package)
        for mod in pkgutil.iter_modules(pkg.__path__):
            if not mod.ispkg and mod.name not in self.skip and not mod.name.startswith("_"):
                importlib.import_module(f"{self.package}.{mod.name}")
        self._loaded = True

    def get(self, name: str) -> type:
        self.load()
        if name not in self._classes:
            raise ConfigError(f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}")
        return self._classes[name]

    def names(self) -> list[str]:
        self.load()
        return sorted(self._classes)

    def __contains__(self, name: str) -> bool:
        return name in self._classes

    def __getitem__(self, name: str) -> type:
        return self._classes[name]

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._classes))

    def __len__(self) -> int:
        return len(self._classes)
