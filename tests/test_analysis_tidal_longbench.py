"""TidalDecode Tables 3 and 4 (LongBench, analysis/papers/tidal_longbench.py): the sweep's cells are the
paper's rows x columns one for one, and with no LongBench here each renders its no-data table: every
number the paper prints (analysis/paper_numbers/tidal.yaml) beside an empty cell, and the command that
fills it where the data is."""
from __future__ import annotations

import pandas as pd
import pytest

import analysis.papers  # noqa: F401
from analysis import catalogue, nodata
from analysis.__main__ import main
from analysis.runs import expand

TABLES = {"tidal.table3": ("table3", "llama3"), "tidal.table4": ("table4", "llama31_8b")}


@pytest.mark.parametrize("key", sorted(TABLES))
def test_cells_are_the_papers_rows_and_columns(key):
    impl = catalogue.get(key).impl
    name, model = TABLES[key]
    cells = expand(impl.sweeps["paper"], [], impl.label)
    got = {(c.row, c.col) for c in cells}
    assert len(got) == len(cells) == 40                                        # 5 rows x 8 tasks, each once
    t = catalogue.paper_numbers("tidal")[name]
    assert got == {(r, c) for r in t["rows"] for c in t["columns"] if c != "Avg."}
    for c in cells:
        assert c.values["model"] == model and c.values["task.decode_tail"] == "quest"
        if c.values["method"] == "tidal":
            assert int(c.values["method.reselect_layer"]) == 13


@pytest.mark.parametrize("key", sorted(TABLES))
def test_no_data_table_holds_every_paper_number_and_the_command(key, tmp_path, capsys):
    empty = tmp_path / "empty"
    assert main(["render", key, "--profile", "paper", "--results", str(empty), "--rows", str(empty),
                 "--out", str(tmp_path / "out")]) == 0
    line = nodata.line(catalogue.get(key), "paper")
    assert f"python -m analysis make {key} --profile paper -- task.data_dir=<dir>" in line
    assert line in capsys.readouterr().out
    md = (tmp_path / "out" / "tables" / f"{key}.md").read_text()
    assert md.splitlines()[2] == line
    csv = pd.read_csv(tmp_path / "out" / "tables" / f"{key}.csv")
    assert csv["ours"].isna().all() and (csv["n"] == 0).all()
    t = catalogue.paper_numbers("tidal")[TABLES[key][0]]
    for row, vals in t["rows"].items():
        printed = next(ln for ln in md.splitlines() if ln.startswith(f"| {row} |"))
        assert printed == "| " + " | ".join([row, *(f"— ({v:.2f})" for v in vals), "0"]) + " |"
