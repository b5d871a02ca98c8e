"""Cascading KV Cache catalogue items: their sweeps expand for both profiles with one place per cell,
and each renders from synthetic runs or benchmark JSON (perplexities with decimals and book-cluster
intervals, passkey curves and the token-span prediction, ROUGE-1/2/L from one run, LongBench means,
latency tables with the paper's numbers and the issue's targets, attention maps)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from analysis_fakes import nested

import analysis.papers  # noqa: F401  (registers the implementations)
from analysis import catalogue
from analysis.__main__ import main
from analysis.runs import expand

KEYS = ["cascade.table1", "cascade.fig7", "cascade.table3", "cascade.fig11", "cascade.fig2", "cascade.fig8",
        "cascade.fig12", "cascade.table2", "cascade.table9", "cascade.fig9", "cascade.table10"]


def cells(key, profile="embedded"):
    impl = catalogue.get(key).impl
    return expand(impl.sweeps[profile], [], impl.label)


@pytest.mark.parametrize("profile", ["paper", "embedded"])
@pytest.mark.parametrize("key", KEYS)
def test_sweeps_expand_with_one_place_per_cell(key, profile):
    cs = cells(key, profile)
    assert cs
    places = [(c.block, c.row, c.col) for c in cs]
    assert len(places) == len(set(places)), key


def write_run(results: Path, values: dict, metrics: list[dict], params=None) -> None:
    d = results / values["task"] / values["model"] / values["method"] / f"h{abs(hash(str(values))) % 10**8}"
    if d.exists():                    # the same cell in two items (Figs. 8 and 12 share runs)
        return
    d.mkdir(parents=True)
    with open(d / "samples.jsonl", "w") as f:
        f.writelines(json.dumps({"id": f"s{i}", "params": (params or {}), "metrics": m, "device": "cpu",
                                "dtype": "torch.float32", "timestamp": 1.0e9 + i}) + "\n" for i, m in enumerate(metrics))
    (d / "summary.json").write_text(json.dumps({"config": nested(values), "n_samples": len(metrics),
                                                "environment": {"git_commit": "abc1234"}}))


def _render(key, results, out, rows_dir, profile="embedded"):
    assert main(["render", key, "--profile", profile, "--results", str(results), "--rows", str(rows_dir),
                 "--out", str(out)]) == 0
    return (out / "tables" / f"{key}.md").read_text()


def test_pg19_items_render_token_weighted_perplexity(tmp_path):
    results, out, rows = tmp_path / "runs", tmp_path / "out", tmp_path / "rows"
    for c in cells("cascade.table1"):
        if c.values["method"] != "cascade" or c.values["method.cache_size"] != 2048:
            continue
        nll = 2.0 if c.values["method.cascades"] == 4 else 2.1
        write_run(results, c.values, [{"nll_sum": nll * 1000, "tokens": 1000, "ppl": 1.0, "nll_curve": [nll] * 3},
                                      {"nll_sum": nll * 3000 + 30, "tokens": 3000, "ppl": 1.0, "nll_curve": [nll] * 5}])
    md = _render("cascade.table1", results, out, rows)
    import math
    ours = math.exp((2.0 * 4000 + 30) / 4000)
    assert f"{ours:.2f} [" in md and "(7.72)" in md and "(7.60)" in md     # ours with interval; paper blocks
    assert "| SmolLM2-135M | 8.23 [8.17–8.29] | 7.44 [7.39–7.50] | — | — | 2 |" in md   # vanilla/Big Bird: no rows yet
    fig7 = _render("cascade.fig7", results, out, rows)
    assert "2 books, windows of 1024 tokens" in fig7
    assert (out / "figures" / "cascade.fig7.png").stat().st_size > 1000


def test_passkey_items_and_span_prediction(tmp_path):
    results, out, rows = tmp_path / "runs", tmp_path / "out", tmp_path / "rows"
    for c in cells("cascade.fig12"):
        acc = min(1.0, 8 * 4096 / int(c.values["task.lengths"][0])) if c.values["method.cascades"] > 1 else 0.2
        write_run(results, c.values, [{"digit_acc": acc}] * 4)
    md = _render("cascade.fig12", results, out, rows)
    from analysis.papers.cascade_passkey import predicted
    assert predicted(4, 4096, 4096 * 64) == pytest.approx(100 * (1024 * 15 + 64) / (4096 * 64))
    assert "## (b) predicted" in md and "## (c) accuracy minus prediction" in md
    assert "| 1 cascades | 20 [" in md and "accuracy steadily increases until the number of cascades exceeds 8" in md
    for c in cells("cascade.fig8"):
        write_run(results, c.values, [{"digit_acc": 0.5}, {"digit_acc": 1.0}])
    md8 = _render("cascade.fig8", results, out, rows)
    assert "| Cascade (8 cascades) | 75 [" in md8 and "1024K" in md8 and "24 percentage points" in md8


def test_booksum_expands_rouge_columns_and_longbench_means(tmp_path):
    results, out, rows = tmp_path / "runs", tmp_path / "out", tmp_path / "rows"
    for c in cells("cascade.table2"):
        if c.values["method"] == "cascade":
            write_run(results, c.values, [{"rouge1": 30.0, "rouge2": 6.0, "rougeL": 12.0, "rougeLsum": 18.0}] * 3)
    md = _render("cascade.table2", results, out, rows)
    assert "| Cascade (Ours) | 30.00" in md and "| 6.00" in md and "| 18.00" in md
    assert "| 12.00" not in md          # Rouge-L is rougeLsum, the reference code's Perl ROUGE-L (summary-level)
    assert "(34.47)" in md and "| Snap KV | — (36.80)" in md   # implemented, no rows yet: empty beside the paper
    assert "no data here" not in md                            # rows: the normal table, no no-data line
    for c in cells("cascade.table9"):
        if c.values["method"] == "cascade":
            write_run(results, c.values, [{"score": 0.25}] * 2, params={"subset": c.values["task.subsets"]})
    md9 = _render("cascade.table9", results, out, rows)
    assert "| Cascade (Ours) | 25.00" in md9 and "(31.80)" in md9   # a paper Mean appears with its block
    for c in cells("cascade.table10", "paper"):
        if c.values["method"] == "cascade":
            write_run(results, c.values, [{"score": 0.5 if int(c.values["method.cascades"]) == 4 else 0.25}] * 2,
                      params={"subset": c.values["task.subsets"]})
    md10 = _render("cascade.table10", results, out, rows, profile="paper")
    assert "| Cascade (Ours) | 50.00 [50.00–50.00] (56.77) |" in md10 and "(35.32)" in md10
    assert "| Streaming LLM | 25.00" in md10 and "| MInference (truncated) | — (46.72)" in md10   # no rows yet


def _bench(d: Path) -> None:
    from analysis.papers import cascade_latency as L

    d.mkdir(parents=True)

    def put(f, rows, settings):
        (d / f.name).write_text(json.dumps({"command": f.command, "commit": "abc1234", "device": "NVIDIA H100",
                                            "rows": rows, "settings": settings}))
    for f, cache in ((L.LAYER16, 16384), (L.LAYER32, 32768)):
        rows = [{"suite": "layer", "method": m, "length": n, "seconds": n / 2 ** 20 * (2 if m != "dense" else 1)}
                for m in ("cascade", "cascade_1") for n in L.LENGTHS]
        rows += [{"suite": "layer", "method": "dense", "length": n, "seconds": (n / 2 ** 18) ** 2} for n in L.LENGTHS[:4]]
        rows += [{"suite": "stride", "method": "cascade", "length": 2 ** 20, "cache": cache, "stride": s, "seconds": 3.0}
                 for s in (1024, 4096)]
        put(f, rows, {"cache": cache, "stride": 4096})
    put(L.E2E, [{"suite": "e2e", "method": "cascade", "length": n, "prefill_s": n / 2 ** 14} for n in L.LENGTHS]
        + [{"suite": "decode", "method": "cascade", "context": 2 ** 20, "ms_per_token": 9.0}], {})
    put(L.E2E_FULL, [{"suite": "e2e", "method": "full", "length": n, "prefill_s": (n / 2 ** 14) ** 2}
                     for n in L.LENGTHS[:5]] + [{"suite": "decode", "method": "full", "context": 32832,
                                                "ms_per_token": 7.5}], {})
    put(L.CACHEADD, [{"suite": "cacheadd", "method": "cascade_4", "graphed": True, "tokens": 16384, "cache": 16384,
                      "seconds": 0.1, "us_per_token": 6.0},
                     {"suite": "cacheadd", "method": "streaming_llm_concat", "tokens": 16384, "cache": 16384,
                      "seconds": 9.0, "us_per_token": 600.0}], {})


def test_latency_items_render(tmp_path):
    bench, out = tmp_path / "bench", tmp_path / "out"
    _bench(bench)
    for key in ("cascade.fig6", "cascade.table8"):
        assert main(["render", key, "--bench", str(bench), "--out", str(out)]) == 0
    fig6 = (out / "tables" / "cascade.fig6.md").read_text()
    assert "1.00 (0.038)" in fig6                                 # 6/600 = 1% of concatenation; paper 0.038%
    assert "A6000" in fig6 and "H100" in fig6
    t8 = (out / "tables" / "cascade.table8.md").read_text()
    assert "(15.34)" in t8 and "(665.33)" in t8                   # paper Tables 8 and 6 beside ours
    assert "ratio cascade / full (target <= 1.3)" in t8 and "1.20x" in t8
    assert "degree-2 fit" in t8 and "(dense: fit)" in t8            # dense past the measured lengths: a fit


def test_attention_maps_render(tmp_path):
    bench, out = tmp_path / "bench", tmp_path / "out"
    bench.mkdir()
    from analysis.papers.cascade_attnmap import FILE
    grid = [[0.5 if c <= r else 0.0 for c in range(4)] for r in range(4)]
    maps = [{"method": m, "layer": 0, "head": 0, "mean_prob": grid} for m in ("streaming", "cascade")]
    (bench / FILE.name).write_text(json.dumps({"command": FILE.command, "commit": "abc1234", "device": "cpu",
                                               "model": "smollm2", "tokens": 64, "rows": [], "maps": maps,
                                               "settings": {"cache": 16, "cascades": 4, "stride": 8, "grid": 4}}))
    assert main(["render", "cascade.fig10", "--bench", str(bench), "--out", str(out)]) == 0
    assert "100.0%" in (out / "tables" / "cascade.fig10.md").read_text()


def test_runs_older_than_bigbird_draw_fill_only_per_query_cells():
    """BigBird's `draw` came with a default (block) other than what earlier runs did (per query): a run
    recorded before the key fills a cell at draw=query, never one at the new default (analysis.runs
    OLDER_RUNS); a run that records the key is read as it says."""
    from analysis.runs import matches

    old = {"method": {"name": "bigbird", "budget": 512, "block": 512}}
    new = {"method": {"name": "bigbird", "budget": 512, "block": 512, "draw": "block"}}
    cell = {"method": "bigbird", "method.budget": 512, "method.block": 512}
    assert matches(old, {**cell, "method.draw": "query"})
    assert not matches(old, cell)                                   # the default cell is draw=block
    assert not matches(old, {**cell, "method.draw": "block"})
    assert matches(new, cell) and not matches(new, {**cell, "method.draw": "query"})
