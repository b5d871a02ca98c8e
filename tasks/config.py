"""Typed task options (the methods' kit, common/options.py): a task states each option once, as a
field of its `Config` dataclass with default, documentation, type, range and choices.

From that one statement come the one-line refusal of a bad option before any model loads
(`Task.validate` parses `cfg.task` first: unknown keys, types, ranges, choices), the documented
`conf/task/<name>.yaml`, written by `python -m tasks` (a test fails when a YAML and its dataclass
disagree), and the defaults. The task's own code keeps reading `self.cfg` (the composed node).

Every task has `limit` and `seed` (tasks/base.py explains `limit`'s grid cells)."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from common.options import Options, option

CONF_DIR = Path(__file__).resolve().parents[1] / "conf" / "task"


@dataclass(frozen=True)
class TaskConfig(Options):
    """Base of every task's options: `limit` and `seed`."""

    group: ClassVar[str] = "task"

    limit: int | None = option(None, "", min=0)
    seed: int = option(0, "")

    @classmethod
    def parse(cls, cfg: Any) -> TaskConfig:
        return cls.parse_values(cfg)

    @classmethod
    def smoke(cls) -> dict:
        """Option overrides under which the shared conformance suite (tests/test_tasks_conformance.py)
        builds a few samples on a 2K-token model in seconds: small lengths and counts. Data a task
        reads from the hub comes from a small generated fixture instead (tests/task_fixtures.py)."""
        return {}


def generated(cls) -> tuple[Path, str]:
    """(the YAML path, its generated text) of a registered task class."""
    module = sys.modules[cls.__module__]
    source = Path(module.__file__).relative_to(CONF_DIR.parents[1]).as_posix()
    return CONF_DIR / f"{cls.name}.yaml", cls.Config.yaml(cls.name, source, "python -m tasks")
