"""Hugging Face hub reachability: go offline at once when the hub cannot be reached.

Without this, every hub lookup of a missing dataset or model retries with back-off for about a
minute and logs each attempt (~20 warning lines) before its error. We probe the endpoint once per
process (one HTTP HEAD through the hub client's own session, so proxies and HF_ENDPOINT apply, 3 s
timeout); when it fails we switch the hub libraries to offline mode: files already in the local HF
cache still load, anything else fails immediately with the task's or the loader's one-line error.
HF_HUB_OFFLINE=1 set by the user skips the probe.
"""
from __future__ import annotations

import os
import re
import sys

TIMEOUT_S = 3.0
_state: dict[str, bool] = {}


def offline_if_unreachable() -> bool:
    """True when the hub is (now) in offline mode. Probes once per process."""
    if "offline" not in _state:
        forced = os.environ.get("HF_HUB_OFFLINE", os.environ.get("TRANSFORMERS_OFFLINE", "")).upper()
        _state["forced"] = forced in ("1", "ON", "YES", "TRUE")
        offline = _state["forced"] or not _reachable()
        if offline:
            set_offline()
        _state["offline"] = offline
    return _state["offline"]


def why_offline() -> str:
    """Why the hub is not asked, in the user's words (not the hub client's OfflineModeIsEnabled)."""
    if _state.get("forced"):
        return "the hub is switched off (HF_HUB_OFFLINE=1)"
    return "there is no network (the Hugging Face hub cannot be reached)"


def plain(message: str) -> str:
    """An error line with the hub client's offline exception named as what it means."""
    if "OfflineModeIsEnabled" not in message:
        return message
    return re.sub(r"OfflineModeIsEnabled(: [^;)]*)?", why_offline(), message)


def _reachable() -> bool:
    try:
        from huggingface_hub import constants, get_session

        get_session().head(constants.ENDPOINT, timeout=TIMEOUT_S)
        return True
    except Exception:   # DNS failure, refused, timeout, proxy error: all mean "not reachable"
        return False


def set_offline() -> None:
    """Offline mode for this process and its children, also for hub libraries already imported
    (they read the variable once, at import)."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    hub = sys.modules.get("huggingface_hub.constants")
    if hub is not None:
        hub.HF_HUB_OFFLINE = True
    ds = sys.modules.get("datasets.config")
    if ds is not None:
        ds.HF_HUB_OFFLINE = True
        if hasattr(ds, "HF_DATASETS_OFFLINE"):
            ds.HF_DATASETS_OFFLINE = True
