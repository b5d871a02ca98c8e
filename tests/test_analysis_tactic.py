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
    assert len(cells) == 3 * 10                         # Table 1 only: 3 lengths x (full + 3 x 3 methods)
    assert {c.block for c in cells} == {"Table 1: average"}
    rows = {c.row for c in cells}
    assert {"Full", "Tactic 50%", "Tactic 90%", "Quest 416", "StreamingLLM (4,52)"} <= rows
    # the paper profile's rows and columns are the paper's: every Table 1 number except Avg. has a cell
    paper_cells = expand(impl.sweeps["paper"], [], impl.label)
    have = {(c.block, c.row, c.col) for c in paper_cells}
    assert {(r["block"], r["row"], r["col"]) for r in impl.paper
            if r["col"] != "Avg." and r["block"] == "Table 1: average"} <= have
    c = next(c for c in cells if c.row == "Tactic 70%" and c.col == "4K")
    tasks = [str(t) for t in c.values["task.tasks"]]
    assert len(tasks) == 8 and "qa_1" not in tasks and "method.target=0.7" in c.overrides   # QA: not offline
    # one finished run over the 8 tasks, 2 samples each: vt 1/0, cwe 1/1, every other task 0/0
    score = {"vt": [1.0, 0.0], "cwe": [1.0, 1.0]}
    params = [{"subtask": t, "index": i} for t in tasks for i in range(2)]
    _fake_rows = [{"score": score.get(p["subtask"], [0.0, 0.0])[p["index"]]} for p in params]
    fake_metrics_run(tmp_path / "runs", c.values, _fake_rows, params=params)
    md = _render(tmp_path, "tactic.table1-5")
    table = {b.split("\n", 1)[0]: b for b in md.split("### ")[1:]}
    line = lambda block: next(x for x in table[block].splitlines() if x.startswith("| Tactic 70% |"))
    assert "| 19 [" in line("Table 1: average")           # 3 of 16
    assert "| 50 [" in line("Table 4: VT") and "| 50 [" in line("Table 5: aggregation")   # groups: its rows
    assert "| 0 [" in line("Table 2: NIAH")
    assert "— (92)" in md                                 # the paper's Full 16K


def test_a_cell_over_some_ruler_tasks_reads_a_finished_run_over_more(tmp_path):
    """analysis.runs: a cell whose task.tasks is a subset of a finished run's (all else equal) is that
    run's rows of those tasks; a partial run, a run with another option, or missing tasks do not fill it."""
    from analysis.runs import Store

    impl = catalogue.get("tactic.table1-5").impl
    c = next(c for c in expand(impl.sweeps["embedded"], [], impl.label) if c.row == "Quest 128" and c.col == "2K")
    tasks = [str(t) for t in c.values["task.tasks"]]
    sub = dict(c.values, **{"task.tasks": ["vt"]})
    subcell = next(iter(expand([[o for o in c.overrides if not o.startswith("task.tasks=")] + ["task.tasks=[vt]"]],
                               [], impl.label)))
    assert subcell.block == "Table 4: VT" and subcell.values == sub
    params = [{"subtask": t} for t in tasks]
    fake_metrics_run(tmp_path / "partial", c.values, [{"score": 1.0}] * 8, params=params, summary=False)
    assert Store(tmp_path / "partial").fill(subcell).status == "missing"
    other = dict(c.values, **{"method.budget": 56})
    fake_metrics_run(tmp_path / "other", other, [{"score": 1.0}] * 8, params=params)
    assert Store(tmp_path / "other").fill(subcell).status == "missing"
    fake_metrics_run(tmp_path / "ok", c.values, [{"score": float(t == "vt")} for t in tasks], params=params)
    filled = Store(tmp_path / "ok").fill(subcell)
    assert filled.status == "done" and filled.run.source == "view" and filled.run.n_rows == 1
    assert [r["metrics"]["score"] for r in filled.run.rows()] == [1.0]
    no_tasks = {k: x for k, x in c.values.items() if k != "task.tasks"}   # a run config without task.tasks
    fake_metrics_run(tmp_path / "bare", no_tasks, [{"score": 1.0}], params=[{"subtask": "vt"}])
    assert Store(tmp_path / "bare").fill(subcell).status == "missing"
    outside = next(iter(expand([[o for o in c.overrides if not o.startswith("task.tasks=")] + ["task.tasks=[qa_1]"]],
                               [], impl.label)))
    assert Store(tmp_path / "ok").fill(outside).status == "missing"


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
