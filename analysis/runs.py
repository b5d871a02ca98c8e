"""Cells of an item's sweep and the result runs that fill them.

A cell is one run of the sweep: its plain overrides (Hydra's own parser expands the comma sweeps),
their typed values, and its place in the table. A result run (results/runs/<task>/<model>/<method>/
<hash>/) fills a cell when its resolved config has the cell's value at every overridden key, so
tables are rendered from the stored configs alone (no Hydra composition, fast for 1000-run sweeps)
and stay correct when runner-only keys (W&B, progress, results_dir, task.limit) differ.
"""
from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runners.results import NOT_HASHED
from runners.store import read_rows as _store_read_rows

GROUPS = ("method", "task", "model", "runner")
_MISSING = object()


@dataclass
class Cell:
    overrides: list[str]
    values: dict[str, Any]
    block: str
    row: str
    col: Any
    status: str = "missing"          # missing | partial | done | not implemented
    run: Run | None = None
    expected: int | None = None
    sweep: int = 0                   # index of the sweep (override list) the cell comes from


@dataclass
class Run:
    path: Path
    config: dict
    n_rows: int
    has_summary: bool
    mtime: float
    _rows: list | None = field(default=None, repr=False)

    def rows(self) -> list[dict]:
        if self._rows is None:
            self._rows = read_rows(self.path / "samples.jsonl")
        return self._rows


@functools.lru_cache(maxsize=1)
def _parser():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


def parse(overrides: list[str]) -> dict[str, Any]:
    """key -> python value of plain overrides (`method=tidal`, `task.lengths=[4096]`, `+x.y=1`)."""
    out = {}
    for o in _parser().parse_overrides(overrides):
        out[o.key_or_group] = o.value()
    return out


def expand(sweeps: list[list[str]], extra: list[str], label) -> list[Cell]:
    """Every run of every sweep, extra overrides appended (they take part in matching too)."""
    from runners.cli import expand as hydra_expand

    cells, seen = [], set()
    for n, sweep in enumerate(sweeps):
        for combo in hydra_expand(list(sweep) + list(extra)):
            values = parse(combo)
            for g in ("task", "model", "method"):
                if g not in values:
                    raise ValueError(f"sweep {sweep} must name {g}= explicitly")
            block, row, col = label(values)
            key = tuple(sorted(combo))
            if key not in seen:
                seen.add(key)
                cells.append(Cell(combo, values, block, row, col, sweep=n))
    return cells


# --- the results store -----------------------------------------------------------------------------

def read_rows(path: Path) -> list[dict]:
    """samples.jsonl rows, one per id, through the run loop's own reader (runners.store.read_rows:
    a torn last line or a corrupt line is skipped, a duplicate id counted once)."""
    return _store_read_rows(path)


class Store:
    """Lazy index of results_dir by (task, model, method)."""

    def __init__(self, results_dir: str | Path):
        self.root = Path(results_dir)
        self._index: dict[tuple[str, str, str], list[Run]] = {}

    def runs(self, task: str, model: str, method: str) -> list[Run]:
        key = (task, model, method)
        if key not in self._index:
            self._index[key] = [r for d in sorted((self.root / task / model / method).glob("*"))
                                if (r := _load_run(d)) is not None]
        return self._index[key]

    def fill(self, cell: Cell) -> Cell:
        """Attach the best matching run (most rows, then newest) and set the cell's status."""
        v = cell.values
        if not method_exists(v["method"]):
            cell.status, cell.run = "not implemented", None
            return cell
        found = [r for r in self.runs(v["task"], v["model"], v["method"]) if matches(r.config, v)]
        if not found:
            cell.status, cell.run = "missing", None
            return cell
        run = max(found, key=lambda r: (r.n_rows, r.mtime))
        cell.run = run
        cell.expected = expected_samples(run.config, v)
        complete = run.has_summary and (cell.expected is None or run.n_rows >= cell.expected)
        cell.status = "done" if complete else "partial"
        return cell


def method_exists(name: str) -> bool:
    import methods
    from common.errors import ConfigError

    try:
        methods.get(name)
    except ConfigError:
        return False
    return True


def _load_run(d: Path) -> Run | None:
    if not d.is_dir():
        return None
    summary, cfg_path = d / "summary.json", d / "config.yaml"
    if summary.exists():
        try:
            config = json.loads(summary.read_text())["config"]
        except (json.JSONDecodeError, KeyError):
            config = None
    else:
        config = None
    if config is None:
        if not cfg_path.exists():
            return None
        import yaml

        config = yaml.safe_load(cfg_path.read_text())
    samples = d / "samples.jsonl"
    n = sum(1 for line in samples.read_text().splitlines() if line.strip()) if samples.exists() else 0
    mtime = max((p.stat().st_mtime for p in (summary, samples, cfg_path) if p.exists()), default=0.0)
    return Run(d, config, n, summary.exists(), mtime)


def lookup(config: dict, key: str) -> Any:
    if key in GROUPS:                          # a group choice: compare with the group's `name`
        node = config.get(key)
        return node.get("name", _MISSING) if isinstance(node, dict) else _MISSING
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _ignored(key: str) -> bool:
    return key.startswith("hydra") or any(key == k or key.startswith(k + ".") for k in NOT_HASHED)


def matches(config: dict, values: dict[str, Any]) -> bool:
    return all(_ignored(k) or same(lookup(config, k), v) for k, v in values.items())


def same(a: Any, b: Any) -> bool:
    if a is _MISSING:
        return False
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(float(a), float(b), rel_tol=0, abs_tol=1e-12)
    return a == b or (a is not None and b is not None and str(a) == str(b))


def expected_samples(config: dict, values: dict[str, Any]) -> int | None:
    """Samples the run must hold: the task's grid (lengths x depths x rounds/repeats), with the cell's
    task.limit applied per length as the run loop does (tasks.base.Task.limited; no limit in the
    cell = the whole grid); None when the task has no such grid (then a summary means complete)."""
    task = config.get("task", {})
    per_length = None
    if task.get("lengths") and task.get("depths"):
        per_length = len(task["depths"]) * int(task.get("rounds") or task.get("repeats") or 1)
    limit = values.get("task.limit")   # the cell's own limit, not the last launch's (not hashed)
    if per_length is None:
        return None if limit is None else int(limit)
    n_lengths = len(set(task["lengths"]))
    return n_lengths * (per_length if limit is None else min(int(limit), per_length))


def accuracy(run: Run, metric: str, scale: float) -> float | None:
    """Mean of the per-sample metric over the run's rows, scaled (x100 for percentages)."""
    import pandas as pd

    rows = run.rows()
    if not rows:
        return None
    df = pd.json_normalize(rows)
    col = f"metrics.{metric}"
    if col not in df.columns:
        return None
    return float(df[col].mean()) * scale
