"""Tactic's motivation and estimation figures (analysis/papers/tactic_figs.py): each renders the
metric its paper figure reads from synthetic run rows (fails if a cell reads another metric)."""
from __future__ import annotations

import math

from analysis_fakes import fake_metrics_run as _fake

from analysis import catalogue
from analysis.__main__ import main
from analysis.papers import tactic_figs
from analysis.runs import expand


def _cells(key, profile="embedded"):
    impl = catalogue.get(key).impl
    return expand(impl.sweeps[profile], [], impl.label)


def _render(tmp_path, key):
    assert main(["render", key, "--profile", "embedded", "--results", str(tmp_path / "runs"),
                 "--rows", str(tmp_path / "rows"), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "figures" / f"{key}.png").exists()
    return (tmp_path / "out" / "tables" / f"{key}.md").read_text()


def test_fig8_shows_three_budgets_of_the_fig7_runs(tmp_path):
    cells = _cells("tactic.fig8")
    assert [c.overrides for c in cells] == [c.overrides for c in _cells("tactic.fig7")]   # the same runs
    c = next(c for c in cells if c.col == "90%")
    _fake(tmp_path / "runs", c.values, [{"method_budget_global": 10.0, "method_budget_cluster": 20.0,
                                         "method_budget_tactic": 30.0 + i} for i in range(2)])
    md = _render(tmp_path, "tactic.fig8")
    assert "| Global optimal | " in md and "10.0 [" in md and "20.0 [" in md and "30.5 [" in md


def test_fig5_reads_the_first_step_budget_per_context(tmp_path):
    cells = _cells("tactic.fig5")
    assert [int(c.values["task.prefix"]) for c in cells] == tactic_figs.FIG5_LENGTHS["embedded"]
    assert all(c.values["method.target"] == 0.9 and c.values["task.steps"] == 1 for c in cells)
    _fake(tmp_path / "runs", cells[1].values, [{"method_budget_global_first": v, "method_budget_global": 1e6}
                                               for v in (100.0, 120.0)])
    md = _render(tmp_path, "tactic.fig5")
    assert "110.0 [" in md and "1000000" not in md


def test_fig1_tables_the_cdf_by_step_and_by_context(tmp_path):
    (c,) = _cells("tactic.fig1")
    assert c.values["method.target"] == 1.0 and c.values["method.probe_layer"] == 15
    rows = [{"method_cdf_t1@1": 0.2, "method_cdf_t1@2": 0.3, "method_cdf_t2@1": 0.4, "method_cdf_t2@2": 0.6},
            {"method_cdf_t1@1": 0.4, "method_cdf_t1@2": 0.5, "method_cdf_t2@1": 0.4, "method_cdf_t2@2": 0.8}]
    _fake(tmp_path / "runs", c.values, rows)
    md = _render(tmp_path, "tactic.fig1")
    assert "| 1 | 30.0 | 40.0 | 2 |" in md and "| 2 | 40.0 | 70.0 | 2 |" in md      # (a) means by step
    assert "| s1 | 40.0 | 50.0 |" in md                                             # (b) one context


def test_fig3_4_kl_and_ruler_against_weight_percentage(tmp_path):
    cells = _cells("tactic.fig3-4")
    assert {c.values["method.mode"] for c in cells} == {"oracle_global"}
    assert {c.row for c in cells} == {"KL", tactic_figs.FIG4_ALL}        # one RULER run per percentage
    kl = next(c for c in cells if c.row == "KL" and c.col == "70%")
    ruler = next(c for c in cells if c.row == tactic_figs.FIG4_ALL and c.col == "99%")
    assert "task.samples_per_task=20" in ruler.overrides
    _fake(tmp_path / "runs", kl.values, [{"kl": 0.25}, {"kl": 0.35}])
    tasks = tactic_figs.FIG4_TASKS
    params = [{"subtask": t} for t in tasks for _ in range(2)]
    _fake(tmp_path / "runs", ruler.values,
          [{"score": {"vt": [1.0, 0.5]}.get(p["subtask"], [0.0, 0.0])[i % 2]} for i, p in enumerate(params)],
          params=params)
    md = _render(tmp_path, "tactic.fig3-4")
    assert "0.3000 [" in md
    assert "| vt | " in md and "75.0 [" in md            # the vt row reads the 5-task run's vt rows
    assert "| mean of the 5 tasks | " in md and "15.0 [" in md   # 1.5 of 10


def test_fig6_is_token_weighted_perplexity(tmp_path):
    cells = _cells("tactic.fig6")
    assert {c.row for c in cells} == {"Full", "Quest", "StreamingLLM", "Tactic (top-K)"}
    t = next(c for c in cells if c.row == "Tactic (top-K)")
    assert t.values["method.mode"] == "topk" and t.values["method.budget"] == 128
    # token by token Tactic must re-cluster, or it is full attention (tests/test_methods_tactic.py)
    assert t.values["method.recluster_every"] == 64 and t.values["method.cluster_size"] == 8
    _fake(tmp_path / "runs", t.values, [{"nll_sum": 2.0 * 100, "tokens": 100}, {"nll_sum": 4.0 * 300, "tokens": 300}])
    md = _render(tmp_path, "tactic.fig6")
    assert f"{math.exp(3.5):.2f} [" in md                                             # not the mean of books' ppl
