"""Per-paper implementations of catalogue items: importing this package imports every module in it,
and each registers its items with `analysis.catalogue.register`. A new paper is a new module here
(nothing else to edit); modules import the catalogue and the shared helpers, never each other
across papers."""
from __future__ import annotations

import importlib
import pkgutil

for _mod in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_mod.name}")
