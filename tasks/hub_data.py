"""Hub datasets for tasks whose data comes from the Hugging Face hub unless `task.data_dir` (or a
task's own path key) points at a local copy. Any failure to get it (offline, gated, renamed, a
network error while streaming) is one `error:` line naming the local alternative, never a traceback
from inside `datasets`."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from common.errors import ConfigError


def _error(hub_id: str, e: Exception, fix: str) -> ConfigError:
    first = str(e).strip().splitlines()[0][:160] if str(e).strip() else ""
    return ConfigError(f"cannot load {hub_id} from the hub ({type(e).__name__}{': ' + first if first else ''}); {fix}")


def load(hub_id: str, *args, fix: str, **kwargs) -> Any:
    """datasets.load_dataset(hub_id, *args, **kwargs); `fix` says how to run without the hub."""
    import datasets

    try:
        return datasets.load_dataset(hub_id, *args, **kwargs)
    except Exception as e:
        raise _error(hub_id, e, fix) from e


def stream(hub_id: str, *args, fix: str, **kwargs) -> Iterator[dict]:
    """Rows of a streamed hub dataset; a failure while iterating is the same one line."""
    rows = load(hub_id, *args, fix=fix, streaming=True, **kwargs)
    try:
        yield from rows
    except ConfigError:
        raise
    except Exception as e:
        raise _error(hub_id, e, fix) from e
