"""The reported numbers of Cascading KV Cache, LycheeDecode, Tactic and Ltri-LLM, as rows for renderers.

Data: analysis/paper_numbers/<paper>.yaml, one entry per catalogue item (`cascade.table1` is entry
`table1` of cascade.yaml), checked cell by cell against the paper text by tests/test_paper_numbers.py.
TidalDecode's file (tidal.yaml) predates this layout and is read by analysis/tidal.py.

An entry is one of:
- a table: `columns` and `rows` ({label: [cell per column]}), or `columns` and `blocks`
  ({block: {rows, optional columns/span/printed/setup}}); rows and columns keep the paper's orientation
  and labels. A cell is a number, null (not printed, "-"), or a marker string such as "OOM".
- a figure: `plot_only: true` with `facts` (numbers the text states, each with its `quote`) and
  `data_from` (the table of the same paper holding the plotted numbers), both optional.
Common fields: `source` (table/figure and section), `setup` (what the paper states about the run:
models, lengths, budgets, samples), `metric`, `unit`, `better`, `method_names` (printed label ->
harness method name), `row_info` (printed non-numeric columns), `cell_notes` ("row / col" -> printed
footnote), `notes` (ambiguities, reconstructions), `catalogue: false` for tables that are not
catalogue items (hyperparameter tables kept because the method needs them).
How the test finds a table in the text (item or block level): `span` (start/end anchors; no end = to
the end of the text), `printed` (block numbers printed outside the rows, e.g. book counts),
`unit_of_match`, `match` and `interleave` (see Block).

`rows(key)` gives the shape of analysis/tidal.py's `_paper_rows`: [{block, row, col, paper}], block ""
for unblocked tables; null cells are left out, marker strings too unless `marks=True`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import yaml

DIR = Path(__file__).parent / "paper_numbers"
PAPERS = ("cascade", "lychee", "tactic", "ltri")
TEXTS = {"cascade": "cascading-kv-cache.txt", "lychee": "lycheedecode.txt", "tactic": "tactic.txt",
         "ltri": "ltri-llm.txt"}
# what a block may carry beside its rows (anything else is a data error); META_KEYS describe the block
META_KEYS = {"setup", "source", "metric", "unit", "notes"}
BLOCK_KEYS = {"rows", "columns", "span", "printed", "match", "unit_of_match", "interleave"} | META_KEYS


@dataclass(frozen=True)
class Block:
    name: str
    columns: list
    rows: dict
    span: dict | None = None
    match: str = "contiguous"          # how a row's cells sit in its text unit: contiguous or subsequence
    unit_of_match: str = "line"        # text unit holding one printed row: line, label (lines joined by
    #                                    their first field: a table split in two halves) or span
    interleave: dict | None = None     # {of: n, at: k}: the printed cells hold n numbers each
    #                                    ("92.0/79.0(-8.0)"), this block's are the k-th of every n
    printed: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)


@cache
def entries(paper: str) -> dict:
    if paper not in PAPERS:
        raise KeyError(f"no paper numbers for {paper!r} here (known: {', '.join(PAPERS)})")
    return yaml.safe_load((DIR / f"{paper}.yaml").read_text())


def keys(paper: str | None = None, catalogue_only: bool = False) -> list[str]:
    return [f"{p}.{name}" for p in ([paper] if paper else PAPERS) for name, e in entries(p).items()
            if not (catalogue_only and e.get("catalogue") is False)]


def item(key: str) -> dict:
    paper, _, name = key.partition(".")
    try:
        return entries(paper)[name]
    except KeyError:
        raise KeyError(f"{key}: not in analysis/paper_numbers/{paper}.yaml") from None


def _table_key(key: str) -> str:
    """The entry holding the numbers: the item itself, or the table its `data_from` names."""
    e = item(key)
    return f"{key.partition('.')[0]}.{e['data_from']}" if "data_from" in e else key


def blocks(key: str) -> list[Block]:
    e = item(_table_key(key))
    if "columns" not in e:
        return []
    opts = {"span": e.get("span"), "match": e.get("match", "contiguous"), "unit_of_match": e.get("unit_of_match", "line")}
    if "rows" in e:
        out = [Block("", e["columns"], e["rows"], **opts)]
    else:
        out = []
        for name, b in e["blocks"].items():
            extra = set(b) - BLOCK_KEYS
            if extra:
                raise ValueError(f"{key} block {name!r}: unknown fields {sorted(extra)}")
            out.append(Block(str(name), b.get("columns", e["columns"]), b["rows"],
                             span=b.get("span", opts["span"]), match=b.get("match", opts["match"]),
                             unit_of_match=b.get("unit_of_match", opts["unit_of_match"]),
                             interleave=b.get("interleave"), printed=b.get("printed", {}),
                             meta={k: v for k, v in b.items() if k in META_KEYS}))
    for b in out:
        if len(set(b.columns)) != len(b.columns):
            raise ValueError(f"{key} block {b.name!r}: repeated column labels")
        for r, vals in b.rows.items():
            if len(vals) != len(b.columns):
                raise ValueError(f"{key} block {b.name!r} row {r!r}: {len(vals)} cells for {len(b.columns)} columns")
            for v in vals:
                if not (v is None or isinstance(v, (int, float, str))) or isinstance(v, bool):
                    raise ValueError(f"{key} block {b.name!r} row {r!r}: cell {v!r} is not a number, null or marker")
    return out


def rows(key: str, marks: bool = False) -> list[dict]:
    """[{block, row, col, paper}] for every printed cell of the item (of its `data_from` table)."""
    return [{"block": b.name, "row": str(r), "col": c, "paper": v}
            for b in blocks(key) for r, vals in b.rows.items() for c, v in zip(b.columns, vals)
            if v is not None and (marks or not isinstance(v, str))]


def facts(key: str) -> list[dict]:
    return list(item(key).get("facts", []))


def setup(key: str) -> dict:
    """What the paper states about the run of this item (its `data_from` table's setup if it has none)."""
    e = item(key)
    return dict(e.get("setup") or item(_table_key(key)).get("setup") or {})


def setup_text(key: str) -> str:
    """The paper's setup on one line, for a renderer's "paper setup" note."""
    def fmt(v):
        if isinstance(v, dict):
            return ", ".join(f"{k} {fmt(x)}" for k, x in v.items())
        return "/".join(map(str, v)) if isinstance(v, list) else str(v)
    return "; ".join(f"{k}: {fmt(v)}" for k, v in setup(key).items())


def cell_count(key: str) -> int:
    """Numeric cells the paper prints for this item itself (0 for a figure that borrows a table)."""
    return 0 if "data_from" in item(key) else len(rows(key))
