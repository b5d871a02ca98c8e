"""LycheeDecode analysis items: sweeps name what the paper ran (and the embedded stand-ins), labels
put each run in the paper's cell, and the tables render from run rows beside the paper's numbers."""
from __future__ import annotations

import json

import analysis.papers  # noqa: F401
from analysis import catalogue
from analysis.__main__ import main
from analysis.runs import expand
from analysis_fakes import nested


def _fake(results, values, correct):
    d = results / values["task"] / values["model"] / values["method"] / f"h{abs(hash(str(values))) % 10**8}"
    d.mkdir(parents=True)
    with open(d / "samples.jsonl", "w") as f:
        f.writelines(json.dumps({"id": f"p{i}-0", "params": {"problem_id": f"p{i}"}, "metrics": {"correct": float(c)},
                                 "device": "cpu", "dtype": "torch.float32", "timestamp": 1e9 + i}) + "\n"
                     for i, c in enumerate(correct))
    (d / "summary.json").write_text(json.dumps({"config": nested(values), "n_samples": len(correct),
                                                "environment": {"git_commit": "abc1234"}}))


def test_table2_sweeps_follow_the_decided_protocol():
    impl = catalogue.get("lychee.table2").impl
    paper = expand(impl.sweeps["paper"], [], impl.label)
    assert len(paper) == 2 * 4 * 5                       # 2 models x 4 sets x 5 rows
    for c in paper:
        assert c.values["task.temperature"] == 0 and c.values["task.k"] == 1
        assert c.values.get("task.num_problems") == (None if c.values["task"] == "aime" else 128)
        if c.values["method"] == "lychee":
            assert c.values["method.mode"] == "ratio" and c.values["method.ratio"] == 0.5
    labels = {(c.block, c.row, c.col) for c in paper}
    assert {(r["block"], r["row"], r["col"]) for r in impl.paper if r["col"] != "Avg."} <= labels
    emb = expand(impl.sweeps["embedded"], [], impl.label)
    assert {c.values["task"] for c in emb} == {"math500"} and {c.row for c in emb} == {
        "Full Attention", "TidalDecode", "TidalDecode w/ Cache Correction", "LycheeDecode",
        "LycheeDecode w/ Cache Correction"}
    assert catalogue.table_key(2, "lychee") == "lychee.table2"


def test_table2_renders_beside_the_paper(tmp_path):
    impl = catalogue.get("lychee.table2").impl
    results = tmp_path / "runs"
    for i, c in enumerate(expand(impl.sweeps["embedded"], [], impl.label)):
        _fake(results, c.values, [1] * (10 + i) + [0] * (33 - i))
    out = tmp_path / "out"
    assert main(["render", "lychee.table2", "--results", str(results), "--rows", str(tmp_path / "rows"),
                 "--out", str(out)]) == 0
    md = (out / "tables" / "lychee.table2.md").read_text()
    assert "| Full Attention | 23 [13–38] | 43 |" in md
    assert "MATH-500 level 1" in md and "TidalDecode rows run a fixed K" in md
    assert "### DeepSeek-R1-Distill-Llama-8B" in md and "(69)" in md     # the paper's rows stay beside
    assert (out / "figures" / "lychee.table2.png").stat().st_size > 1000


def test_latency_items_render_from_their_bench_json(tmp_path):
    bench, out = tmp_path / "bench", tmp_path / "out"
    bench.mkdir()
    tpot = []
    for c in (16384, 131072):
        for v, ms in (("full", 20.0 * c / 16384), ("tidal", 15.0), ("lychee", 12.0), ("lychee_block", 10.0)):
            tpot.append({"context": c, "variant": v, "method": v.split("_")[0], "batch": 1, "tpot_ms": ms,
                         "floor_ms": 5.0, "over_floor": ms / 5.0})
    cmd = catalogue.get("lychee.fig3").impl.bench.files[0].command
    (bench / "lychee_tpot_llama3_h100.json").write_text(json.dumps(
        {"bench": "lychee_tpot", "command": cmd, "commit": "abc1234", "device": "NVIDIA H100 80GB HBM3", "rows": tpot}))
    kern = [{"op": "hybrid", "context": 131072, "batch": 8, "sparse_heads": n, "ms": 1.0 / n, "sdpa_ms": 2.0,
             "speedup_vs_sdpa": 2.0 * n, "floor_ms": 1.0 / n / over, "over_floor": over} for n, over in ((4, 1.25),
                                                                                                     (8, 2.0))]
    (bench / "lychee_kernels_h100.json").write_text(json.dumps(
        {"bench": "lychee_kernels", "command": catalogue.get("lychee.fig4").impl.bench.files[0].command,
         "commit": "abc1234",
         "device": "NVIDIA H100 80GB HBM3", "rows": kern}))
    for key in ("lychee.fig3", "lychee.fig4"):
        assert main(["render", key, "--bench", str(bench), "--out", str(out)]) == 0
        assert (out / "figures" / f"{key}.png").stat().st_size > 1000
    fig3 = (out / "tables" / "lychee.fig3.md").read_text()
    assert "16.00x (2.70x)" in fig3 and "1.50x (1.73x)" in fig3      # lychee_block at 128K vs the paper's claims
    fig4 = (out / "tables" / "lychee.fig4.md").read_text()
    assert "| 8/8 sparse | 16.00x (7.00x) |" in fig4 and "over the HBM floor" in fig4
    # issue 10's 1.3x kernel bar, read off the cells: the 4/8 cell meets it, the 8/8 cell misses it
    assert "The 1.3x bar: met in 1 of 2 cells (floors 200 us, 1.25x); missed in:" in fig4
    assert "- 128K, batch 8, 8/8 sparse: floor 62.5 us, ours 125.0 us (2.00x, +62.5 us)" in fig4


def test_longbench_items_cover_the_paper_cells():
    """Tables 1, 3, 5-6: every paper cell but the averages (computed at render) and Table 3's HotpotQA
    column (no HotpotQA training data here, said on the table) is a cell some run of the sweep fills."""
    for key, skipped in (("lychee.table1", {"Avg."}), ("lychee.table3", {"HotpotQA"}),
                         ("lychee.table5-6", {"Avg."})):
        impl = catalogue.get(key).impl
        cells = expand(impl.sweeps["paper"], [], impl.label)
        labels = {(c.block, c.row, c.col) for c in cells}
        paper = {(r["block"], r["row"], r["col"]) for r in impl.paper}
        assert paper and {p for p in paper if p[2] not in skipped} <= labels, key
        assert len(labels) == len(cells), key                      # no two runs land in one cell
    t1 = expand(catalogue.get("lychee.table1").impl.sweeps["paper"], [], catalogue.get("lychee.table1").impl.label)
    star = [c for c in t1 if c.row.startswith("DuoAttention*")]
    assert star and all(float(c.values["method.head_scale"]) == 2 for c in star)


def test_table3_embedded_rows_read_the_trained_files_and_a_same_size_random_control():
    """lychee.table3 embedded: one cell per (row, passkey length); the random rows draw exactly as many
    retrieval heads as the committed HardKuma file (the issue's "same size" check, seeds 0-2), and so does
    Table 4's control row; every SmolLM2 head file was trained on the GPU with layer 0 forced, and the
    HardKuma / HardConcrete Lagrangian met the density target (within 0.002 of 0.09375)."""
    from analysis.papers import lychee as L, lychee_table3 as T
    from methods.parts import headfile

    impl = catalogue.get("lychee.table3").impl
    cells = expand(impl.sweeps["embedded"], [], impl.label)
    labels = {(c.block, c.row, c.col) for c in cells}
    assert len(labels) == len(cells) == 2 * (1 + len(T.T3_RECIPES) + len(T.SMOL_SEEDS))
    kuma = headfile.resolve("auto", model="smollm2", recipe="passkey-hardkuma", num_layers=30, num_kv_heads=3,
                            force_layer0=True, method="LycheeDecode")
    randoms = [str(c.values.get("method.heads", "")) for c in cells]
    randoms = [h for h in randoms if h.startswith("random:")] + [L.SMOL_RANDOM_HEADS.split("=", 1)[1]]
    assert len(randoms) == 2 * len(T.SMOL_SEEDS) + 1
    drawn = set()
    for spec in randoms:
        hs = headfile.resolve(spec, model="smollm2", recipe="-", num_layers=30, num_kv_heads=3,
                              force_layer0=True, method="LycheeDecode")
        assert hs.count == kuma.count == L.smol_heads()
        drawn.add(hs.roles)
    assert len(drawn) == len(T.SMOL_SEEDS) and kuma.roles not in drawn
    for recipe in T.T3_RECIPES:
        data = json.loads(headfile.head_path("smollm2", recipe).read_text())
        assert data["recipe"] == recipe and all(data["heads"][0]) and data["training"]["device"] == "cuda"
        if recipe != "passkey-direct":
            assert abs(data["training"]["final_density"] - data["training"]["target_density"]) < 0.002
