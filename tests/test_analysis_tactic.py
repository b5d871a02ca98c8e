"""Tactic's catalogue items (analysis/papers/tactic.py) render from run rows with the right metric:
RULER `score` for Tables 1-5 (beside the paper's numbers), `kl` / `match_len` from pg19_compare for
Figs. 9-10, Tactic's probe metric `method_mass_error` for Fig. 7."""
from __future__ import annotations

import pytest
from analysis_fakes import fake_metrics_run

from analysis import catalogue
from analysis.__main__ import main
from analysis.runs import expand


def _fake(results, values, metric, vals):
    fake_metrics_run(results, values, [{metric: v, "other": 123.0} for v in vals])


def _render(tmp_path, key):
    assert main(["render", key, "--profile", "embedded", "--results", str(tmp_path / "runs"),
                 "--rows", str(tmp_path / "rows"), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "figures" / f"{key}.png").exists()
    return (tmp_path / "out" / "tables" / f"{key}.md").read_text()


def test_ruler_tables_cells_and_paper_numbers(tmp_path):
    impl = catalogue.get("tactic.table1-5").impl
    assert impl.metric == "score"
    cells = expand(impl.sweeps["embedded"], [], impl.label)
    assert len(cells) == 5 * 3 * 10                     # 5 tables x 3 lengths x (full + 3 x 3 methods)
    assert {c.block for c in cells} == set(catalogue.paper_numbers("tactic")["table1-5"]["blocks"])
    rows = {c.row for c in cells}
    assert {"Full", "Tactic 50%", "Tactic 90%", "Quest 416", "StreamingLLM (4,52)"} <= rows
    paper_cells = expand(impl.sweeps["paper"], [], impl.label)
    # the paper profile's rows and columns are the paper's: every paper number except Avg. has a cell
    have = {(c.block, c.row, c.col) for c in paper_cells}
    assert {(r["block"], r["row"], r["col"]) for r in impl.paper if r["col"] != "Avg."} <= have
    c = next(c for c in cells if c.block == "Table 4: VT" and c.row == "Tactic 70%" and c.col == "4K")
    assert "task.tasks=[vt]" in c.overrides and "method.target=0.7" in c.overrides
    _fake(tmp_path / "runs", c.values, "score", [1.0, 1.0, 0.0, 1.0])
    md = _render(tmp_path, "tactic.table1-5")
    assert "| Tactic 70% |" in md and "| — | 75 [30–95] | — |" in md and "— (92)" in md   # ours; the paper's Full 16K


@pytest.mark.parametrize("key,metric,vals,expect", [
    ("tactic.fig9", "kl", [0.01, 0.03], "0.0200 ["),
    ("tactic.fig10", "match_len", [64, 128, 96], "96.0 ["),
    ("tactic.fig7", "method_mass_error", [-0.02, 0.0], "-0.0100 ["),
])
def test_pg19_figures_render_their_metric(tmp_path, key, metric, vals, expect):
    impl = catalogue.get(key).impl
    assert impl.metric == metric and impl.scale == 1.0
    cells = expand(impl.sweeps["embedded"], [], impl.label)
    assert all(c.values["task"] == "pg19_compare" for c in cells)
    tactic = [c for c in cells if c.values["method"] == "tactic"]
    assert tactic and (key != "tactic.fig7" or all(c.values["method.diagnostics"] for c in tactic))
    _fake(tmp_path / "runs", tactic[-1].values, metric, vals)
    md = _render(tmp_path, key)
    assert expect in md and "123" not in md
