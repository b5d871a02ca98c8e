"""Cells of an item's sweep and the result runs that fill them.

A cell is one run of the sweep: its plain overrides (Hydra's own parser expands the comma sweeps),
their typed values, and its place in the table. A result run (results/runs/<task>/<model>/<method>/
<hash>/) fills a cell when its resolved config has the cell's value at every overridden key and its
other method and task options at their YAML defaults, so tables are rendered from the stored configs
alone (no Hydra composition, fast for 1000-run sweeps) and stay correct when runner-only keys (W&B,
progress, results_dir, task.limit) differ.
"""
from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from analysis import compact
from analysis.shared_data import canonical_data_path
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
    """One result run: a run directory under results/runs, or its compact copy under results/rows."""
    path: Path
    config: dict
    n_rows: int
    has_summary: bool
    mtime: float
    run_id: str = ""
    source: str = "runs"             # runs | rows
    info: dict = field(default_factory=dict)   # commit, device, dtype (compact copies carry them)
    _rows: list | None = field(default=None, repr=False)
    _load: Any = field(default=None, repr=False)

    def rows(self) -> list[dict]:
        if self._rows is None:
            self._rows = self._load() if self._load else read_rows(self.path / "samples.jsonl")
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
    """Lazy index of result runs by (task, model, method), over a results directory (results/runs)
    and, when given, the committed compact rows (results/rows, analysis/compact.py)."""

    def __init__(self, results_dir: str | Path | None, rows_dir: str | Path | None = None):
        self.root = Path(results_dir) if results_dir is not None else None
        self.rows_root = Path(rows_dir) if rows_dir is not None else None
        self._index: dict[tuple[str, str, str], list[Run]] = {}

    def runs(self, task: str, model: str, method: str) -> list[Run]:
        key = (task, model, method)
        if key not in self._index:
            found = []
            if self.root is not None:
                found += [r for d in sorted((self.root / task / model / method).glob("*"))
                          if (r := _load_run(d)) is not None]
            if self.rows_root is not None:
                found += [_load_compact(f) for f in sorted((self.rows_root / task / model / method).glob("*.jsonl"))]
            self._index[key] = found
        return self._index[key]

    def fill(self, cell: Cell) -> Cell:
        """Attach the best matching run and set the cell's status."""
        v = cell.values
        if not method_exists(v["method"]):
            cell.status, cell.run = "not implemented", None
            return cell
        found = [r for r in self.runs(v["task"], v["model"], v["method"]) if matches(r.config, v)]
        if not found and isinstance(v.get("task.tasks"), (list, tuple)):
            return self._fill_from_superset(cell)
        if not found:
            cell.status, cell.run = "missing", None
            return cell
        run = max(found, key=rank)
        cell.run = run
        cell.expected = expected_samples(run.config, v)
        complete = run.has_summary and (cell.expected is None or run.n_rows >= cell.expected)
        cell.status = "done" if complete else "partial"
        return cell

    def _fill_from_superset(self, cell: Cell) -> Cell:
        """A cell over some of a task's subtasks (RULER's task.tasks) is filled by a run over more of them
        with everything else equal: its samples are the same (each derives from task.seed and its own
        subtask), so the cell reads that run's rows of its subtasks. Tactic's Tables 2-5 are Table 1's
        run read per task group instead of four more runs of the same samples. Only a finished run
        counts (a partial one may not have reached the cell's subtasks)."""
        v = cell.values
        want = [str(t) for t in v["task.tasks"]]
        found = [r for r in self.runs(v["task"], v["model"], v["method"]) if r.has_summary
                 and set(want) <= _tasks_of(r.config) and matches(r.config, v, skip=("task.tasks",))]
        if not found:
            cell.status, cell.run = "missing", None
            return cell
        cell.run, cell.expected, cell.status = subset_view(max(found, key=rank), want), None, "done"
        return cell


def _tasks_of(config: dict) -> set[str]:
    """The run's task.tasks as strings (empty when it has none)."""
    tasks = lookup(config, "task.tasks")
    return {str(t) for t in tasks} if isinstance(tasks, (list, tuple)) else set()


def subset_view(run: Run, subtasks: list[str]) -> Run:
    """The run restricted to rows whose params.subtask is in `subtasks` (source "view": analysis.compact
    exports the run itself, never a view)."""
    keep = set(subtasks)
    rows = [r for r in run.rows() if str((r.get("params") or {}).get("subtask")) in keep]
    return Run(run.path, run.config, len(rows), run.has_summary, run.mtime, run_id=run.run_id, source="view",
               info=run.info, _rows=rows)


def rank(run: Run) -> tuple:
    """Best run first: most rows, then finished, then newest, then the committed copy (so that a
    run and its compact copy, equal in all else, resolve the same way everywhere)."""
    return (run.n_rows, run.has_summary, run.mtime, run.source == "rows", run.run_id)


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
    return Run(d, config, n, summary.exists(), mtime, run_id=d.name, source="runs")


def _load_compact(path: Path) -> Run:
    """A committed compact run (analysis/rows.py); its rows are expanded only when read."""
    head = compact.read_head(path)
    return Run(path, head["config"], head["n_rows"], head["complete"], head["time"], run_id=head["run_id"],
               source="rows", info={k: head.get(k) for k in ("commit", "device", "dtype")},
               _load=lambda: compact.read_rows(path))


# Options added later whose default is NOT what runs recorded before them did: such a run ran with the
# value here (BigBird drew its random tokens per query position until `draw`, default `block`, came in
# 2026-11-28), so it fills only cells at that value, not the new default's.
OLDER_RUNS: dict[tuple[str, str], Any] = {("bigbird", "method.draw"): "query"}


def _older(config: dict, key: str) -> Any:
    node = config.get("method")
    name = node.get("name") if isinstance(node, dict) else None
    return OLDER_RUNS.get((name, key), _MISSING)


def lookup(config: dict, key: str) -> Any:
    value = _lookup(config, key)
    return _older(config, key) if value is _MISSING else value


def _lookup(config: dict, key: str) -> Any:
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


def matches(config: dict, values: dict[str, Any], skip: tuple[str, ...] = ()) -> bool:
    """The run has the cell's value at every key the cell sets, and its method and task options the
    cell does not set are at their YAML defaults: a cell that leaves `method.selection` alone is not
    filled by the sibling run that turned it off (cascade.table3 was, once both had run). Keys in `skip`
    are compared by the caller (Store._fill_from_superset: task.tasks as a subset)."""
    return all(_ignored(k) or k in skip or same(lookup(config, k), v) for k, v in values.items()) and \
        all(_at_default(config, values, group) for group in ("method", "task"))


def _at_default(config: dict, values: dict[str, Any], group: str) -> bool:
    node = config.get(group)
    defaults = _group_defaults(group, str(values.get(group, "")))
    if not isinstance(node, dict) or defaults is None:
        return True
    for key, default in defaults.items():
        dotted = f"{group}.{key}"
        if key == "name" or dotted in values or _ignored(dotted) or any(k.startswith(dotted + ".") for k in values):
            continue                # set by the cell (or part of it), or not hashed
        if key not in node:         # older than the key: it ran as the default, unless OLDER_RUNS says not
            if _older(config, dotted) is _MISSING or same(_older(config, dotted), default):
                continue
            return False
        if isinstance(default, str) and "${" in default:
            continue                # derived from other settings (LycheeDecode's head_model = model.name)
        if not same(node[key], default):
            return False
    return True


@functools.cache
def _group_defaults(group: str, name: str) -> dict | None:
    """conf/<group>/<name>.yaml as plain values (no defaults lists there), or None when absent."""
    from omegaconf import OmegaConf

    from runners.cli import CONF_DIR

    path = Path(CONF_DIR) / group / f"{name}.yaml"
    if not name or not path.is_file():
        return None
    return OmegaConf.to_container(OmegaConf.load(path), resolve=False)


def same(a: Any, b: Any) -> bool:
    if a is _MISSING:
        return False
    a, b = canonical_data_path(a), canonical_data_path(b)   # older runs' data path = data/X (shared_data)
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


def metric_stats(run: Run, metric: str, scale: float) -> dict[str, Any] | None:
    """Mean of the per-sample metric over the run's rows and its 95% interval, scaled (x100 for
    percentages): {"ours", "ci_lo", "ci_hi", "ci", "n"}; None when no row has the metric."""
    from analysis.stats import interval

    vals = [r["metrics"][metric] for r in run.rows()
            if isinstance(r.get("metrics"), dict) and isinstance(r["metrics"].get(metric), (int, float))]
    if not vals:
        return None
    lo, hi, how = interval(vals)
    return {"ours": sum(vals) / len(vals) * scale, "ci_lo": lo * scale, "ci_hi": hi * scale, "ci": how,
            "n": len(vals)}


def book_rows(run: Run) -> list[dict]:
    """The rows of a perplexity run that scored a book (metrics nll_sum and tokens)."""
    return [r for r in run.rows() if isinstance((r.get("metrics") or {}).get("nll_sum"), (int, float))]


def ppl_stats(run: Run) -> dict[str, Any] | None:
    """Token-weighted perplexity over the run's books, exp(total NLL / total predictions) as the
    references compute it, with a 95% interval from the books as clusters (analysis.stats.token_ppl)."""
    from analysis.stats import token_ppl

    books = book_rows(run)
    return token_ppl([float(r["metrics"]["nll_sum"]) for r in books],
                     [int(r["metrics"]["tokens"]) for r in books]) if books else None
