"""Data-bound items (Impl.data: LongBench, InfiniteBench's read tasks, Booksum, MMLU; none of them on
these machines): with no rows they render their no-data table, through their own renderer to the usual
files, holding every number the paper prints for the item, `—` and n = 0 for ours, and one line naming
the missing data and the task.data_dir override; with task.data_dir given, or for an item that is not
data-bound, no rows still fails (MissingResults, exit code 2) and writes nothing."""
from __future__ import annotations

import re

import pandas as pd
import pytest

import analysis.papers  # noqa: F401  (registers the implementations)
from analysis import catalogue, nodata, papers_data
from analysis.__main__ import main

DATA_BOUND = {"cascade.table2", "cascade.table4", "cascade.fig9", "cascade.table9", "cascade.table10",
              "tactic.fig11", "ltri.table2", "lychee.table1", "lychee.table3", "lychee.table5-6", "lychee.fig5"}
# paper numbers a render leaves out by design, said on the table: LycheeDecode's Table 6 (sparsity) is
# not rendered (analysis/papers/lychee.py T56_NOTES), with rows or without
NOT_RENDERED = {"lychee.table5-6": "Table 6", "lychee.fig5": "Table 6"}


def _profile(key: str) -> str:
    """The profile the item is data-bound in (embedded first): lychee.table3's LongBench is its paper
    profile's only, its embedded profile runs passkey."""
    impl = catalogue.get(key).impl
    bound = [p for p in ("embedded", *impl.sweeps) if p in impl.sweeps and nodata.applies(impl, [], p)]
    return bound[0] if bound else "embedded" if "embedded" in impl.sweeps else next(iter(impl.sweeps))


def _render(key: str, tmp_path, *extra: str) -> int:
    empty = tmp_path / "empty"
    return main(["render", key, "--profile", _profile(key), "--results", str(empty), "--rows", str(empty),
                 "--out", str(tmp_path / "out"), *extra])


def _table_rows(md: str) -> list[list[str]]:
    """The body rows of every markdown table, cells stripped (label first, n last)."""
    rows, body = [], False
    for ln in md.splitlines():
        if ln.startswith("|---"):
            body = True
        elif body and ln.startswith("|"):
            rows.append([c.strip() for c in ln.strip().strip("|").split("|")])
        else:
            body = False
    return rows


def _printed(md: str) -> list[tuple[float, int]]:
    """Numbers printed in parentheses (the paper's, beside ours), with their decimals."""
    return [(float(m), len(m.partition(".")[2])) for m in re.findall(r"\((-?\d+(?:\.\d+)?)\)", md)]


def test_the_data_bound_items_are_these():
    bound = {k for k, it in catalogue.items().items() if it.impl is not None and it.impl.data}
    # TidalDecode's LongBench tables: their numbers are in tidal.yaml, not papers_data (the same checks:
    # tests/test_analysis_tidal_longbench.py)
    assert bound == DATA_BOUND | {"tidal.table3", "tidal.table4"}


@pytest.mark.parametrize("key", sorted(DATA_BOUND))
def test_a_data_bound_item_without_rows_renders_its_no_data_table(key, tmp_path, capsys):
    item = catalogue.get(key)
    assert _render(key, tmp_path) == 0
    line = nodata.line(item, _profile(key))
    assert "no data here" in line and "task.data_dir=<dir>" in line
    for d in item.impl.data:
        assert d.name in line and d.source in line and all(p in line for p in d.parts)
    assert line in capsys.readouterr().out
    out = tmp_path / "out"
    md = (out / "tables" / f"{key}.md").read_text()
    csv = pd.read_csv(out / "tables" / f"{key}.csv")
    assert (out / "figures" / f"{key}.png").stat().st_size > 0
    assert md.startswith(f"# {key}: ") and md.splitlines()[2] == line          # the line under the title
    assert csv["ours"].isna().all() and (csv["n"] == 0).all()
    rows = _table_rows(md)
    assert rows and all(r[-1] == "0" for r in rows)                             # n = 0 on every row
    assert all(c == "" or c.startswith("—") for r in rows for c in r[1:-1])     # ours: a dash in every cell
    skip = NOT_RENDERED.get(key)
    want = [r for r in papers_data.rows(key) if not (skip and r["block"].startswith(skip))]
    assert want or papers_data.item(key).get("plot_only")                      # tactic.fig11: bars only
    got = csv["paper"].dropna().tolist()
    printed = _printed(md)
    for r in want:
        v = float(r["paper"])
        assert any(abs(v - g) < 1e-9 for g in got), f"{key}: paper {r} not in the CSV"
        assert any(abs(v - x) <= 0.5 * 10 ** -d + 1e-9 for x, d in printed), f"{key}: paper {r} not in the table"


def test_with_data_given_or_not_data_bound_no_rows_still_fails(tmp_path, capsys):
    assert _render("cascade.table2", tmp_path, "--", "task.data_dir=/somewhere") == 2   # data there: runs not done
    assert _render("cascade.table1", tmp_path) == 2                                     # PG-19 books are here
    assert _render("tactic.table1-5", tmp_path) == 2                                    # RULER is generated
    empty = str(tmp_path / "empty")                     # LongBench is lychee.table3's paper profile's only
    assert main(["render", "lychee.table3", "--profile", "embedded", "--results", empty, "--rows", empty,
                 "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("no rows for any cell") == 4 and "no data here" not in err
    assert not (tmp_path / "out").exists()


def test_render_of_a_paper_only_item_still_needs_its_profile(tmp_path, capsys):
    """Only `tables` falls back to a paper-only data-bound item's own profile (tests/test_analysis_rows.py)."""
    impl = catalogue.get("lychee.table1").impl
    assert "embedded" not in impl.sweeps and impl.data
    assert main(["render", "lychee.table1", "--results", str(tmp_path), "--rows", str(tmp_path)]) == 2
    assert "no 'embedded' profile" in capsys.readouterr().err                   # render alone keeps asking
