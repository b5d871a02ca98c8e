"""tidal.fig5 (PG-19 perplexity token by token): its sweeps expand to one cell per (method, K) in both
profiles with the reference's protocol, and it renders token-weighted perplexities with book-cluster
intervals and the NLL-window curves from synthetic runs."""
from __future__ import annotations

import math

from analysis_fakes import fake_metrics_run

import analysis.papers  # noqa: F401  (registers the implementations)
from analysis import catalogue
from analysis.__main__ import main
from analysis.runs import expand


def cells(profile):
    impl = catalogue.get("tidal.fig5").impl
    return expand(impl.sweeps[profile], [], impl.label)


def test_sweeps_follow_the_reference_protocol():
    paper = {(c.row, c.col): c.values for c in cells("paper")}
    assert set(paper) == {("Full", "all")} | {(r, k) for r in ("Quest", "TD+L9", "TD+L13", "TD+L15")
                                              for k in (2048, 4096)}
    v = paper[("TD+L13", 4096)]
    assert (v["task.protocol"], v["task.num_eval_tokens"], v["task.books"], v["model"]) == ("decode", 32000, 1, "llama3")
    assert v["method.reselect_layer"] == 13 and "task.data_dir" not in v      # the hub's first test book
    emb = {(c.row, c.col): c.values for c in cells("embedded")}
    assert {k for _, k in emb} == {"all", 512, 1024} and emb[("Quest", 512)]["task.books"] == 4


def test_renders_token_weighted_perplexity_and_curves(tmp_path):
    results, out, rows = tmp_path / "runs", tmp_path / "out", tmp_path / "rows"
    for c in cells("embedded"):
        nll = {"full": 3.0, "quest": 3.4, "tidal": 3.2}[c.values["method"]]
        if c.values["method"] == "quest" and c.values["method.budget"] == 1024:
            continue                                                          # a missing cell
        fake_metrics_run(results, c.values, [
            {"nll_sum": nll * 8000, "tokens": 8000, "ppl": 0.0, "nll_curve": [nll] * 32},
            {"nll_sum": (nll + 0.1) * 8000, "tokens": 8000, "ppl": 0.0, "nll_curve": [nll + 0.1] * 32}])
    assert main(["render", "tidal.fig5", "--profile", "embedded", "--results", str(results), "--rows", str(rows),
                 "--out", str(out)]) == 0
    md = (out / "tables" / "tidal.fig5.md").read_text()
    td = f"{math.exp(3.25):.2f} ["
    assert f"| TD+L9 | {td}" in md and "| Quest | " + f"{math.exp(3.45):.2f} [" in md
    assert "| Quest | " in md and " | — | 2 |" in md                          # Quest at K=1024: no result yet
    assert f"Full attention (every token, the same books): {math.exp(3.05):.2f} [" in md and "(n=2)" in md
    assert "8 cells done, 1 missing" in md and "token-weighted perplexity" in md and "in %" not in md
    assert (out / "figures" / "tidal.fig5.png").stat().st_size > 1000
    # paired on the same books: (3.2 - 3.4) per token on both books, so exp(-0.2) with no spread
    assert f"| TD+L13 | {math.exp(-0.2):.3f} [{math.exp(-0.2):.3f}–{math.exp(-0.2):.3f}] | — | 2 |" in md
