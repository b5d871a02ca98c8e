"""Method defaults the analysis needs (e.g. TidalDecode's re-selection layer when a sweep leaves it
at its default), read from one place instead of repeated as literals in the paper modules.

For now the source is conf/method/<method>.yaml; when each method has a typed config, this helper
reads that instead and nothing else changes."""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import yaml

CONF_METHOD = Path(__file__).resolve().parents[1] / "conf" / "method"


@functools.cache
def _method_conf(method: str) -> dict[str, Any]:
    path = CONF_METHOD / f"{method}.yaml"
    if not path.exists():
        raise KeyError(f"no config for method {method!r} ({path} does not exist)")
    return yaml.safe_load(path.read_text()) or {}


def method_default(method: str, key: str) -> Any:
    """The default of `method.<key>` for `method` (KeyError if the method has no such key)."""
    conf = _method_conf(method)
    if key not in conf:
        raise KeyError(f"method {method!r} has no key {key!r} (keys: {', '.join(conf)})")
    return conf[key]
