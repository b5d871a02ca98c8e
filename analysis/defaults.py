"""Method defaults the analysis needs (e.g. TidalDecode's re-selection layer when a sweep leaves it
at its default), read from the method's typed config (methods/<name>.py), where each option is
stated once, instead of repeated as literals in the paper modules."""
from __future__ import annotations

from typing import Any

import methods


def method_default(method: str, key: str) -> Any:
    """The default of `method.<key>` for `method` (KeyError if the method has no such option)."""
    try:
        defaults = methods.get(method).Config.defaults()
    except Exception as e:  # an unknown method: the registry's one-line error, as a KeyError
        raise KeyError(str(e)) from None
    if key not in defaults:
        raise KeyError(f"method {method!r} has no option {key!r} (options: {', '.join(defaults)})")
    return defaults[key]
