"""The catalogue: every paper item (items.yaml, the full map of shared/PAPERS.md) and, for the items
implemented so far, what produces and renders them.

Per-paper modules (analysis/papers/<paper>*.py) register their implementations here with
`register(key, impl)`; this module imports none of them, so a new paper is one new file under
analysis/papers/ and no edit here. `import analysis.papers` loads them all (the CLI does).

An implemented item names either
  sweeps[profile]   Hydra override lists (comma sweeps allowed) whose runs produce its rows; every
                    list names task=, model= and method= explicitly, so a run matches a cell by value;
  label(values)     the (block, row, column) of one run in the rendered table, from its overrides;
  render(...)       writes results/tables/<key>.md + .csv and results/figures/<key>.png;
  paper             the paper's reported numbers (analysis/paper_numbers/<paper>.yaml);
or `bench`: the GPU benchmark JSON files (results/bench/) it renders from, each with the one command
that writes it and the code it measures (a file older than that code is flagged stale).
An item may also be data-bound (`data`): its runs read a data set the harness cannot generate and these
machines lack (no hub access). It runs wherever `task.data_dir` points, and with no rows it renders a
"no data" table (the paper's numbers, ours empty) instead of failing (analysis/nodata.py).
"""
from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
PAPERS = {"tidal": "TidalDecode", "tactic": "Tactic", "lychee": "LycheeDecode", "ltri": "Ltri-LLM",
          "cascade": "Cascading KV Cache", "harness": "the harness (every method)"}
PROFILES = ("paper", "embedded")


class NotImplementedItem(Exception):
    """An item the catalogue knows but cannot run or render yet (one clear line, exit code 2)."""


class MissingResults(Exception):
    """Nothing to render from: no rows, or no benchmark JSON (one clear line, exit code 2)."""


@dataclass(frozen=True)
class BenchFile:
    """One benchmark JSON and the one command that writes it (run from the repository root, with
    `--out <dir>/<name>` appended)."""
    name: str
    command: str
    measures: tuple[str, ...]        # repo paths (files or folders) whose code the numbers measure
    gpu: bool = True                 # needs a CUDA device (False: a CPU benchmark)


@dataclass
class Bench:
    """A GPU-benchmark item: renders from JSON files, not from run rows."""
    files: list[BenchFile]
    render: Callable[..., list[Path]]   # render(item, impl, sources: [provenance.Source], out) -> paths


@dataclass(frozen=True)
class Dataset:
    """A data set an item's runs read and cannot generate: what it is, where the hub keeps it and how a
    run is pointed at a local copy (the override and the layout the task reads there)."""
    name: str                        # "LongBench"
    parts: tuple[str, ...]           # the subsets / files the item needs
    source: str                      # where it comes from by default (the hub repo and file)
    override: str                    # the Hydra override that points a run at a copy: task.data_dir=<dir>
    layout: str                      # what the task reads there
    profile: str | None = None       # the one profile whose runs read it (None: every profile)


@dataclass
class Impl:
    title: str
    sweeps: dict[str, list[list[str]]]
    label: Callable[[dict[str, Any]], tuple[str, str, Any]]
    render: Callable[..., list[Path]]
    paper: list[dict[str, Any]] = field(default_factory=list)   # rows {block,row,col,paper}
    setup: dict[str, str] = field(default_factory=dict)          # profile -> what "ours" ran
    paper_setup: str = ""
    metric: str = "accuracy"
    scale: float = 100.0
    bench: Bench | None = None
    # a cell's statistic from its run, {"ours", "ci_lo", "ci_hi", "ci", "n"} (default: the mean of
    # `metric` per sample, analysis.runs.metric_stats); e.g. token-weighted perplexity over books
    aggregate: Callable[[Any], dict[str, Any] | None] | None = None
    # second-stage sweeps computed from the filled cells of `sweeps` (profile, cells) -> override lists:
    # runs whose settings depend on other runs' results (Tactic Fig. 11: Quest and StreamingLLM at the
    # mean budget Tactic selected). They appear once the first stage has rows.
    derive: Callable[[str, list], list[list[str]]] | None = None
    # data-bound: the data sets its runs need that are not generated (empty: none, or all generated);
    # with no rows for any cell the item renders its no-data table instead of raising MissingResults
    data: tuple[Dataset, ...] = ()
    data_note: str = ""              # what else the no-data line must say (e.g. columns that need no data)


@dataclass
class Item:
    key: str
    siblings: list[str]            # other keys of the same PAPERS.md row
    content: str
    methods: str
    task: str
    setup: str
    impl: Impl | None = None

    @property
    def paper(self) -> str:
        return self.key.split(".", 1)[0]

    @property
    def implemented(self) -> bool:
        return self.impl is not None

    def require(self) -> Impl:
        if self.impl is None:
            raise NotImplementedItem(
                f"{self.key} ({self.content}; {self.methods}; {self.task}) is in the catalogue but not "
                f"implemented in analysis/ yet; implemented: {', '.join(implemented_keys())}")
        return self.impl

    def target(self) -> str:
        return self.key.replace(".", "-")


@functools.lru_cache(maxsize=1)
def _map() -> dict[str, Item]:
    raw = yaml.safe_load((HERE / "items.yaml").read_text())
    out: dict[str, Item] = {}
    for entries in raw.values():
        for e in entries:
            for k in e["keys"]:
                out[k] = Item(k, [s for s in e["keys"] if s != k], e["content"], e["methods"], e["task"],
                              e.get("setup", ""))
    return out


def register(key: str, impl: Impl) -> Impl:
    """Attach an implementation to a catalogue item (called by analysis/papers/* at import)."""
    items = _map()
    if key not in items:
        raise KeyError(f"register({key!r}): not an item of analysis/items.yaml")
    if items[key].impl is not None and items[key].impl is not impl:
        raise ValueError(f"{key} is implemented twice")
    items[key].impl = impl
    return impl


def items() -> dict[str, Item]:
    """key -> Item, in catalogue order, with the implementations registered so far."""
    return _map()


def implemented_keys() -> list[str]:
    return [k for k, it in items().items() if it.implemented]


def get(key: str) -> Item:
    all_items = items()
    if key in all_items:
        return all_items[key]
    alt = key.replace("-", ".", 1) if "." not in key else key    # accept the make-target spelling
    if alt in all_items:
        return all_items[alt]
    raise KeyError(f"unknown item {key!r}; `python -m analysis list` shows the catalogue")


def table_key(number: int, paper: str) -> str:
    """`make table<N>` -> the key of table N of `paper`, ranges included (table7-12 holds 9)."""
    if paper not in PAPERS:
        raise KeyError(f"unknown paper {paper!r}; one of {', '.join(PAPERS)}")
    for key in items():
        p, _, name = key.partition(".")
        m = re.fullmatch(r"table(\d+)(?:-(\d+))?", name)
        if p == paper and m and int(m.group(1)) <= number <= int(m.group(2) or m.group(1)):
            return key
    raise KeyError(f"{PAPERS[paper]} has no table {number} in the catalogue")


@functools.cache
def paper_numbers(paper: str) -> dict[str, Any]:
    """The numbers a paper reports (analysis/paper_numbers/<paper>.yaml), as data."""
    return yaml.safe_load((HERE / "paper_numbers" / f"{paper}.yaml").read_text())
