"""harness.tpot and harness.pareto (issue 34) rendered from synthetic files: every method's cost table
from a bench.every_method JSON (failed and skipped cells kept as rows), and the accuracy-vs-speed view
from fake run rows plus that JSON, with the Pareto front."""
from __future__ import annotations

import json

import pandas as pd

import analysis.papers  # noqa: F401  (registers the implementations)
from analysis import catalogue
from analysis.__main__ import main
from analysis.papers import harness, harness_pareto
from analysis.runs import expand
from methods import REGISTRY
from tests.analysis_fakes import fake_run


def fake_every_method(d, ms: dict, cells=((32768, 1), (131072, 1)), file=None, shard="1/1") -> None:
    """An every_method JSON: full at 10 ms, each method at ms[name] (None: out of memory), one skip."""
    rows = []
    for c, b in cells:
        for i, (m, t) in enumerate({"full": 10.0, **ms}.items()):
            r = {"method": m, "context": c, "batch": b, "heads": "random:0:24 (no llama3 head file)" if m == "lychee"
                 else "", "semantics": {}}
            if c == 131072 and i == len(ms):
                r.update(status="skipped", error="not run: projected prefill 90 s, 12 s of BENCH_TIME_BUDGET left")
            elif t is None:
                r.update(status="error", error="out of memory: CUDA out of memory. Tried to allocate 16 GiB")
            else:
                r.update(status="ok", decode_ms=t, floor_ms=5.0, over_floor=t / 5.0, prefill_s=2.0 + i,
                         prefill_vs_full=(2.0 + i) / 2.0, first_decode_s=0.5, peak_gib=20.5, graphs=m != "infllm",
                         speedup_vs_full=10.0 / t, floor_note="dense decode" if m == "full" else "")
            rows.append(r)
    file = file or harness.FILE
    (d / file.name).write_text(json.dumps({
        "bench": "every_method", "command": file.command, "commit": "abc1234", "dirty": False, "shard": shard,
        "device": "NVIDIA H100 80GB HBM3", "dtype": "torch.bfloat16", "weights": "random", "budget": 4096,
        "budget_knob": "budget K = tokens per head", "warmup": 3, "steps": 12, "time_budget_s": 300,
        "elapsed_s": 299.0, "bandwidth_bytes_s": 2.9e12, "bandwidth_source": "measured copy", "rows": rows}))


def test_tpot_renders_every_row_failures_included(tmp_path):
    bench = tmp_path / "bench"
    bench.mkdir()
    fake_every_method(bench, {"quest": 8.0, "bigbird": None, "infllm": 40.0})
    out = tmp_path / "out"
    assert main(["render", "harness.tpot", "--bench", str(bench), "--out", str(out)]) == 0
    md = (out / "tables" / "harness.tpot.md").read_text()
    assert "### 32K B=1" in md and "### 128K B=1" in md
    assert "| quest | 8.00 | 5.00 | 1.60x | 1.25x | 3.00 | 1.50x | 0.50 | 20.5 | yes |" in md
    assert "| bigbird | **error** |" in md and "out of memory" in md
    assert "| infllm | **skipped** |" in md and "BENCH_TIME_BUDGET" in md   # the 128K cell ran out of time
    assert "| infllm | 40.00 | 5.00 | 8.00x | 0.25x |" in md and "| no |" in md   # eager: no graph
    assert "NVIDIA H100" in md and "2.90 TB/s" in md and "abc1234" in md
    csv = pd.read_csv(out / "tables" / "harness.tpot.csv")
    assert len(csv) == 8 and set(csv["status"]) == {"ok", "error", "skipped"}
    assert (out / "figures" / "harness.tpot.png").exists()


def test_tpot_reads_a_cell_run_in_two_parts_each_with_its_own_full(tmp_path):
    bench = tmp_path / "bench"
    bench.mkdir()
    first, second = (f for f in harness.FILES if "128k" in f.name)
    assert "--shard 1/2" in first.command and "--shard 2/2" in second.command
    fake_every_method(bench, {"quest": 8.0, "h2o": 7.0}, cells=((131072, 1),), file=first, shard="1/2")
    fake_every_method(bench, {"tova": 5.0, "tidal": 6.0}, cells=((131072, 1),), file=second, shard="2/2")
    out = tmp_path / "out"
    assert main(["render", "harness.tpot", "--bench", str(bench), "--out", str(out)]) == 0
    md = (out / "tables" / "harness.tpot.md").read_text()
    assert md.count("### 128K B=1") == 1
    assert "| full | 10.00 |" in md and "| full (reference of part 2/2) | 10.00 |" in md
    assert "| quest | 8.00 |" in md and "| tova | 5.00 | 5.00 | 1.00x | 2.00x |" in md


def test_pareto_front_keeps_the_undominated():
    pts = [("a", 1.0, 90.0), ("b", 2.0, 50.0), ("c", 1.5, 40.0), ("d", 3.0, 10.0), ("e", 2.0, 50.0)]
    assert harness_pareto.front(pts) == ["a", "b", "d", "e"]          # c is beaten by b on both axes


def test_pareto_sweeps_every_registered_method_at_one_ratio():
    impl = catalogue.get("harness.pareto").impl
    cells = expand(impl.sweeps["embedded"], [], impl.label)
    assert sorted(c.row for c in cells) == REGISTRY.names()
    quest = next(c for c in cells if c.row == "quest")
    assert quest.values["method.budget"] == 512 and quest.values["task.lengths"] == [4096]


def test_pareto_renders_points_intervals_and_the_front(tmp_path, monkeypatch):
    bench = tmp_path / "bench"
    bench.mkdir()
    fake_every_method(bench, {"quest": 8.0, "tova": 5.0, "bigbird": None}, cells=((32768, 1),))
    monkeypatch.setattr(harness_pareto, "BENCH_DIR", bench)
    impl = catalogue.get("harness.pareto").impl
    cells = {c.row: c for c in expand(impl.sweeps["embedded"], [], impl.label)}
    results = tmp_path / "runs"
    fake_run(results, cells["full"].values, [1] * 100)
    fake_run(results, cells["quest"].values, [1, 0] * 50)
    fake_run(results, cells["tova"].values, [1] + [0] * 99)
    # partial, and no speed (OOM); a run records every option, `draw` too (analysis.runs OLDER_RUNS)
    fake_run(results, {**cells["bigbird"].values, "method.draw": "block"}, [1] * 10)
    out = tmp_path / "out"
    assert main(["render", "harness.pareto", "--profile", "embedded", "--results", str(results),
                 "--rows", str(tmp_path / "rows"), "--out", str(out)]) == 0
    md = (out / "tables" / "harness.pareto.md").read_text()
    assert "| full | 100 [96–100] | 100 | 1.00x | 10.00 | yes |" in md
    assert "| quest | 50 [40–60] | 100 | 1.25x | 8.00 | yes |" in md
    assert "| tova | 1 [0–5] | 100 | 2.00x | 5.00 | yes |" in md
    assert "| bigbird | 100 [72–100]* | 10 |" in md and "speed: out of memory" in md
    assert "| snapkv | — | 0 | — |" in md and "accuracy: no rows" in md
    assert "SmolLM2-135M-Instruct" in md and "Llama-3-8B shape" in md and "NVIDIA H100" in md
    csv = pd.read_csv(out / "tables" / "harness.pareto.csv")
    assert set(csv["method"]) == set(REGISTRY.names()) and csv["pareto"].sum() == 3
    assert (out / "figures" / "harness.pareto.png").exists()
