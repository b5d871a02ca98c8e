"""The transcribed paper numbers (analysis/paper_numbers/{cascade,lychee,tactic,ltri}.yaml) against the
paper texts in ../shared/papers: every printed row is looked up in the text span of its table, in row
order, its cells in column order; every quoted fact is found verbatim with its number. The shape checks
run without the texts; the text checks skip when ../shared/papers is absent."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from analysis import papers_data as pd_

ROOT = Path(__file__).resolve().parents[1]
PAPERS_DIR = ROOT.parent / "shared" / "papers"
NUMBER = re.compile(r"[+-]?\d+(?:\.\d+)?")
TAG = re.compile(r"<[^>]+>")
WORD = re.compile(r"[A-Za-z]{3,}")

# Numeric cells per item, counted by hand from the printed tables (rows x columns less "-", "OOM" and
# the Avg. cells the text extraction lost): a dropped or added row fails here even if it matches.
EXPECTED_CELLS = {
    "cascade.table1": 33, "cascade.table2": 33, "cascade.table3": 3, "cascade.table4": 40, "cascade.table6": 11,
    "cascade.table8": 20, "cascade.table9": 133, "cascade.table10": 12,
    "lychee.table1": 146, "lychee.table2": 50, "lychee.table3": 6, "lychee.table4": 90, "lychee.table5-6": 216,
    "tactic.table1-5": 200,
    "ltri.table1": 16, "ltri.table2": 72, "ltri.table3": 42, "ltri.table4": 80, "ltri.table8": 252,
    "ltri.table5": 109, "ltri.table6": 32, "ltri.table7": 32, "ltri.retrieval_heads": 42,
}


def paper_text(paper: str) -> str:
    path = PAPERS_DIR / pd_.TEXTS[paper]
    if not path.exists():
        pytest.skip(f"{path} is not present")
    return path.read_text()


def numbers(s: str) -> list[float]:
    return [float(m) for m in NUMBER.findall(s)]


def squash(s: str) -> str:
    """Markup and whitespace removed: how a marker cell ("OOM", "90th percentile") is compared."""
    return "".join(TAG.sub("", s).split())


def label_words(label: str) -> list[str]:
    """The words of 3+ letters of a row label ("TidalDecode w/ Cache Correction" -> tidaldecode, cache,
    correction): they must be printed on the row's line. Labels without such words are not checked."""
    return [w.lower() for w in WORD.findall(label)]


def span_of(text: str, span: dict) -> str:
    """The text from the start anchor (unique in the paper) to the end anchor (or the end of the text)."""
    start, end = span["start"], span.get("end")
    assert text.count(start) == 1, f"span start {start!r} occurs {text.count(start)} times"
    i = text.index(start)
    if end is None:
        return text[i:]
    j = text.find(end, i + len(start))
    assert j > i, f"span end {end!r} not found after {start!r}"
    return text[i:j]


def units(span: str, unit: str) -> list[tuple[str, list[float]]]:
    """The text units that each hold one printed row, with their numbers."""
    lines = [ln for ln in span.splitlines() if ln.strip()]
    if unit == "line":
        return [(ln, numbers(ln)) for ln in lines]
    if unit == "label":     # a table printed in halves: a row's lines joined, the label field left out
        groups: dict[str, list[str]] = {}
        for ln in lines:
            label, _, rest = ln.partition("\t")
            groups.setdefault(label.strip(), []).append(rest)
        return [("\t".join(g), numbers("\t".join(g))) for g in groups.values()]
    if unit == "span":
        return [(span, numbers(span))]
    raise ValueError(f"unknown unit_of_match {unit!r}")


def find_run(values: list[float], tokens: list[float], mode: str, start: int = 0) -> int | None:
    """End index in tokens of `values` found from `start`: as one run, or in order with gaps."""
    n = len(values)
    if mode == "contiguous":
        for i in range(start, len(tokens) - n + 1):
            if tokens[i:i + n] == values:
                return i + n
        return None
    if mode == "subsequence":
        i = start
        for v in values:
            while i < len(tokens) and tokens[i] != v:
                i += 1
            if i == len(tokens):
                return None
            i += 1
        return i
    raise ValueError(f"unknown match mode {mode!r}")


def block_errors(key: str, block: pd_.Block, text: str) -> list[str]:
    where = f"{key} [{block.name}]" if block.name else key
    if block.span is None:
        return [f"{where}: no span to look the table up in"]
    try:
        span = span_of(text, block.span)
    except AssertionError as e:
        return [f"{where}: {e}"]
    errors = [f"{where}: printed {k}={v} not in the table text" for k, v in block.printed.items()
              if float(v) not in numbers(span)]
    found = units(span, block.unit_of_match)
    raws = [raw for raw, _ in found]
    toks = [t for _, t in found]
    if block.interleave:            # n numbers per printed cell: this block's are the k-th of each
        toks = [t[block.interleave["at"]::block.interleave["of"]] for t in toks]
    prev, pos = -1, 0           # line-like units: rows on increasing units; span: increasing positions
    for label, cells in block.rows.items():
        vals = [float(v) for v in cells if isinstance(v, (int, float))]
        marks = [squash(v) for v in cells if isinstance(v, str)]
        words = label_words(str(label))
        if not vals and not marks:
            continue

        def fits(i: int, start: int = 0, vals=vals, marks=marks, words=words) -> int | None:
            """End of this row's cells in unit i (from token `start`), if its markers and label are there."""
            plain = TAG.sub("", raws[i]).lower()
            if not (all(m in squash(raws[i]) for m in marks) and all(w in plain for w in words)):
                return None
            return find_run(vals, toks[i], block.match, start)

        if block.unit_of_match == "span":
            end = fits(0, pos)
            if end is None:
                errors.append(f"{where} row {label!r}: {cells} not found in order after the previous row")
            else:
                pos = end
            continue
        hit = next((i for i in range(prev + 1, len(raws)) if fits(i) is not None), None)
        if hit is None:
            errors.append(f"{where} row {label!r}: {cells} not found on a line after the previous row's")
        else:
            prev = hit
    return errors


def fact_errors(key: str, fact: dict, text: str) -> list[str]:
    flat = " ".join(text.split())
    quote = " ".join(fact["quote"].split())
    if quote not in flat:
        return [f"{key} fact {fact['name']}: quote not in the paper: {quote!r}"]
    if "printed" in fact:
        ok = str(fact["printed"]) in quote
    else:
        ok = float(fact["value"]) in numbers(quote)
    return [] if ok else [f"{key} fact {fact['name']}: value {fact['value']} not in its quote"]


def item_errors(key: str) -> list[str]:
    text = paper_text(key.partition(".")[0])
    e = pd_.item(key)
    errors = [] if "data_from" in e else [err for b in pd_.blocks(key) for err in block_errors(key, b, text)]
    return errors + [err for f in pd_.facts(key) for err in fact_errors(key, f, text)]


ALL_KEYS = pd_.keys()


# --- shape: no paper texts needed ------------------------------------------------------------------

def test_every_catalogue_item_of_the_four_papers_has_an_entry():
    listed = yaml.safe_load((ROOT / "analysis" / "items.yaml").read_text())
    catalogue = {k for paper in pd_.PAPERS for it in listed[paper] for k in it["keys"]}
    assert catalogue <= set(ALL_KEYS), sorted(catalogue - set(ALL_KEYS))
    assert set(pd_.keys(catalogue_only=True)) == catalogue      # nothing outside the catalogue unmarked


@pytest.mark.parametrize("key", ALL_KEYS)
def test_entry_is_a_table_or_a_figure(key):
    e = pd_.item(key)
    assert e.get("source"), f"{key}: no source"
    assert pd_.setup(key) and pd_.setup_text(key), f"{key}: no setup (the paper's run, for renderers)"
    if e.get("plot_only"):
        assert "columns" not in e, f"{key}: a plot-only figure with a table of its own"
        if "data_from" in e:
            assert pd_.rows(key), f"{key}: data_from names a table without cells"
        for f in pd_.facts(key):
            assert {"name", "value", "quote"} <= set(f), f"{key}: fact {f} lacks name/value/quote"
    else:
        assert "columns" in e, f"{key}: neither a table nor plot_only"
        assert all(b.span for b in pd_.blocks(key)), f"{key}: a block without a text span"


def test_rows_have_the_renderer_shape_and_expected_counts():
    for key, n in EXPECTED_CELLS.items():
        assert pd_.cell_count(key) == n, key
    tables = [k for k in ALL_KEYS if "columns" in pd_.item(k)]
    assert set(tables) == set(EXPECTED_CELLS)
    r = pd_.rows("cascade.table1")
    assert r[0] == {"block": "16384", "row": "Qwen2-7B", "col": "Flash Attn. 2 (strided)", "paper": 9.50}
    assert {"block": "65536", "row": "LLaMA3.1-8B", "col": "Big Bird (strided)", "paper": "OOM"} in \
        pd_.rows("cascade.table1", marks=True)
    assert pd_.rows("cascade.fig9") == pd_.rows("cascade.table9")       # a figure reads its table
    assert pd_.setup("lychee.fig5") == pd_.setup("lychee.table5-6")
    assert pd_.rows("tactic.fig6") == [] and pd_.item("tactic.fig6")["plot_only"]
    assert "budget: 1024" in pd_.setup_text("tactic.fig6")


def test_loader_rejects_a_ragged_row(monkeypatch):
    bad = {"t": {"source": "x", "columns": ["a", "b"], "rows": {"r": [1]}}}
    monkeypatch.setattr(pd_, "entries", lambda paper: bad)
    with pytest.raises(ValueError, match="1 cells for 2 columns"):
        pd_.blocks("cascade.t")


# --- against the paper texts ----------------------------------------------------------------------

@pytest.mark.parametrize("key", ALL_KEYS)
def test_numbers_are_printed_in_the_paper(key):
    assert item_errors(key) == []


def _with_row(block: pd_.Block, label: str, cells: list) -> pd_.Block:
    return dataclasses.replace(block, rows={**block.rows, label: cells})


def test_a_wrong_number_is_not_found():
    text = paper_text("cascade")
    block = pd_.blocks("cascade.table1")[0]
    assert block_errors("cascade.table1", block, text) == []
    row = block.rows["Qwen2-7B"]
    assert block_errors("t", _with_row(block, "Qwen2-7B", [9.51, *row[1:]]), text)         # 9.50 -> 9.51
    assert block_errors("t", _with_row(block, "Qwen2-7B", [row[2], row[1], row[0], *row[3:]]), text)  # columns swapped
    t3 = pd_.blocks("cascade.table3")[0]
    assert block_errors("t", dataclasses.replace(t3, rows=dict(reversed(t3.rows.items()))), text)     # rows swapped
    ltri = pd_.blocks("ltri.table8")
    assert block_errors("ltri.table8", ltri[2], paper_text("ltri")) == []
    sign = _with_row(ltri[2], "8192", [abs(v) for v in ltri[2].rows["8192"]])               # (-8.0) read as 8.0
    assert block_errors("t", sign, paper_text("ltri"))
    math = pd_.blocks("lychee.table2")[0]                                                     # labels swapped
    swapped = {("LycheeDecode" if r == "TidalDecode" else "TidalDecode" if r == "LycheeDecode" else r): v
               for r, v in math.rows.items()}
    assert block_errors("t", dataclasses.replace(math, rows=swapped), paper_text("lychee"))
    oom = pd_.blocks("cascade.table6")[0]
    assert block_errors("t", _with_row(oom, "Minference", [5.11, 12.84, 28.41, 60.47, 1.0, "OOM", "OOM"]), text)


def test_every_cell_is_pinned_by_the_text():
    """Moving any one printed cell by 0.5 (or a marker by a letter) makes its row unfindable: no cell
    passes only because the lookup is loose."""
    survivors = []
    for key in ALL_KEYS:
        if "data_from" in pd_.item(key) or "columns" not in pd_.item(key):
            continue
        text = paper_text(key.partition(".")[0])
        for block in pd_.blocks(key):
            for label, cells in block.rows.items():
                for j, v in enumerate(cells):
                    if v is None:
                        continue
                    wrong = [*cells[:j], v + "X" if isinstance(v, str) else v + 0.5, *cells[j + 1:]]
                    if not block_errors(key, _with_row(block, label, wrong), text):
                        survivors.append((key, block.name, label, block.columns[j]))
    assert survivors == []


def test_a_wrong_fact_is_not_found():
    text = paper_text("cascade")
    fact = pd_.facts("cascade.fig6")[3]
    assert fact_errors("f", fact, text) == []
    assert fact_errors("f", {**fact, "value": 6.9}, text)
    assert fact_errors("f", {**fact, "quote": fact["quote"].replace("6.8", "6.9")}, text)
