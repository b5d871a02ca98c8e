"""The analysis catalogue: the full map of PAPERS.md, Make targets generated from it, cell matching
against stored runs, and rendering (ours beside the paper's, "not implemented" rows) on synthetic
result rows written into a temporary results directory."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest

from analysis import catalogue
from analysis.__main__ import main
from analysis.launch import pack
from analysis.makefile import generate
from analysis.runs import Store, expand

ROOT = Path(__file__).resolve().parents[1]
PAPERS_MD = ROOT.parent / "shared" / "PAPERS.md"


def papers_md_keys() -> list[str]:
    keys = []
    for line in PAPERS_MD.read_text().splitlines():
        m = re.match(r"\|\s*((?:tidal|tactic|lychee|ltri|cascade)\.[^|]+)\|", line)
        if m:
            keys += [k.strip() for k in m.group(1).split(",")]
    return keys


def test_catalogue_lists_every_papers_md_key(capsys):
    if not PAPERS_MD.exists():
        pytest.skip("../shared/PAPERS.md is not present")
    keys = papers_md_keys()
    assert len(keys) > 50
    assert set(keys) == set(catalogue.items())
    assert main(["list"]) == 0
    listed = capsys.readouterr().out
    for k in keys:
        assert k in listed


def test_targets_mk_is_generated_and_current():
    text = (ROOT / "analysis" / "targets.mk").read_text()
    assert text == generate(), "run: python -m analysis makefile > analysis/targets.mk"
    for it in catalogue.items().values():
        assert f"\n{it.target()}: install\n" in text
    assert "include analysis/targets.mk" in (ROOT / "Makefile").read_text()


def test_table_numbers_resolve_per_paper():
    assert catalogue.table_key(1, "lychee") == "lychee.table1"
    assert catalogue.table_key(9, "tidal") == "tidal.table7-12"
    assert catalogue.table_key(6, "lychee") == "lychee.table5-6"
    with pytest.raises(KeyError):
        catalogue.table_key(99, "tidal")


def test_not_implemented_items_say_so(capsys):
    assert main(["render", "tidal.fig5"]) == 2
    assert "not implemented in analysis/ yet" in capsys.readouterr().err
    assert main(["run", "cascade.table2"]) == 2
    assert main(["table", "2"]) == 2                      # LycheeDecode table 2 by default
    assert "lychee.table2, not implemented" in capsys.readouterr().err
    assert main(["render", "nope.table1"]) == 2


def test_pack_merges_cells_into_sweeps():
    impl = catalogue.get("tidal.table1").impl
    cells = [c for c in expand(impl.sweeps["embedded"], [], impl.label) if c.values["method"] == "quest"]
    assert len(cells) == 5
    assert pack(cells) == [[o if not o.startswith("method.budget") else "method.budget=32,64,128,256,512"
                            for o in cells[0].overrides]]
    assert pack(cells[1:3])[0][-1] == "method.budget=64,128"


# --- synthetic results ------------------------------------------------------------------------------

def nested(values: dict) -> dict:
    cfg: dict = {}
    for k, v in values.items():
        parts = [k, "name"] if "." not in k else k.split(".")
        node = cfg
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = v
    cfg["runner"] = {"seed": 42, "results_dir": "elsewhere", "wandb": {"mode": "offline"}}
    return cfg


def fake_run(results: Path, values: dict, hits: list[int], summary: bool = True) -> Path:
    d = results / values["task"] / values["model"] / values["method"] / f"h{abs(hash(str(values))) % 10**8}"
    d.mkdir(parents=True)
    with open(d / "samples.jsonl", "w") as f:
        f.writelines(json.dumps({"id": f"s{i}", "metrics": {"accuracy": float(hit)}}) + "\n" for i, hit in enumerate(hits))
    if summary:
        (d / "summary.json").write_text(json.dumps({"config": nested(values), "n_samples": len(hits)}))
    else:
        import yaml

        (d / "config.yaml").write_text(yaml.safe_dump(nested(values)))
    return d


@pytest.fixture
def table1_results(tmp_path):
    impl = catalogue.get("tidal.table1").impl
    cells = {(c.row, c.col): c for c in expand(impl.sweeps["embedded"], [], impl.label)}
    results = tmp_path / "runs"
    fake_run(results, cells[("Quest", 32)].values, [1, 0])
    fake_run(results, cells[("TD+L7", 32)].values, [1, 1])
    fake_run(results, cells[("TD+L7", 64)].values, [1], summary=False)         # partial: 1 of 2 rows
    fake_run(results, cells[("Full (reference)", "all")].values, [1, 1])
    # a run of another config (different length) must not fill any cell
    other = dict(cells[("Quest", 64)].values, **{"task.lengths": [2048]})
    fake_run(results, other, [0, 0])
    return results


def test_status_matches_runs_by_value(table1_results):
    item = catalogue.get("tidal.table1")
    store = Store(table1_results)
    cells = {(c.row, c.col): store.fill(c) for c in expand(item.impl.sweeps["embedded"], [], item.impl.label)}
    assert cells[("Quest", 32)].status == "done"
    assert cells[("TD+L7", 64)].status == "partial" and cells[("TD+L7", 64)].expected == 2
    assert cells[("Quest", 64)].status == "missing"
    assert cells[("H2O", 32)].status == "not implemented"


def test_render_puts_ours_beside_the_paper(table1_results, tmp_path, capsys):
    out = tmp_path / "out"
    args = ["render", "tidal.table1", "--results", str(table1_results), "--out", str(out)]
    assert main(args) == 0
    md = (out / "tables" / "tidal.table1.md").read_text()
    assert "| H2O — not implemented | — (0) |" in md and "TOVA — not implemented" in md
    assert "| Quest | 50 (65) | — (99) |" in md                                   # ours (paper)
    assert "| TD+L7 | 100 (73) | 100* (92) |" in md                               # partial: marked *
    assert "Full attention (ours, same samples): 100% (n=2)" in md
    df = pd.read_csv(out / "tables" / "tidal.table1.csv")
    assert set(df["status"]) >= {"done", "partial", "missing", "not implemented"}
    assert (out / "figures" / "tidal.table1.png").stat().st_size > 1000
    # rendering again reads the same rows and writes the same table
    assert main(args) == 0
    assert (out / "tables" / "tidal.table1.md").read_text() == md


def test_run_launches_only_what_is_missing(table1_results, capsys):
    assert main(["run", "tidal.table1", "--results", str(table1_results), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "method 'h2o' is not implemented" in out
    cmds = [line for line in out.splitlines() if line.startswith("$ python")]
    quest = next(c for c in cmds if "method=quest" in c)
    assert "method.budget=64,128,256,512 " in quest                    # K=32 is done: not re-run
    tidal = next(c for c in cmds if "method=tidal" in c)
    assert "method.budget=64,128,256,512 " in tidal                    # the partial one is resumed
    assert not any("method=full" in c for c in cmds)
    assert all(f"runner.results_dir={table1_results}" in c for c in cmds)


def test_sensitivity_renderers_on_synthetic_rows(tmp_path):
    impl = catalogue.get("tidal.table7-12").impl
    cells = [c for c in expand(impl.sweeps["embedded"], [], impl.label) if c.col in (128, 256)]
    assert {c.row for c in cells} >= {"TD+L2", "TD+L29", "Quest"}
    assert any("method.reselect_layer=null" in c.overrides for c in cells)  # TD+L2: one selection layer
    results = tmp_path / "runs"
    for c in cells[:12]:
        fake_run(results, c.values, [1, 0])
    for key in ("tidal.table7-12", "tidal.fig9"):
        assert main(["render", key, "--results", str(results), "--out", str(tmp_path / "out")]) == 0
        md = (tmp_path / "out" / "tables" / f"{key}.md").read_text()
        assert "### smollm2" in md or "smollm2" in md
        assert "(100)" in md                                       # paper numbers of the paper models
        assert (tmp_path / "out" / "figures" / f"{key}.png").exists()
    t2 = catalogue.get("tidal.table2").impl
    paper_blocks = {r["block"] for r in t2.paper}
    assert "llama3 @ 100000" in paper_blocks
    assert {t2.label(c.values)[0] for c in expand(t2.sweeps["paper"], [], t2.label)} == paper_blocks


def test_nothing_done_launches_the_sweeps_as_written(tmp_path, capsys):
    assert main(["run", "tidal.table7-12", "--results", str(tmp_path), "--dry-run"]) == 0
    cmds = [line for line in capsys.readouterr().out.splitlines() if line.startswith("$ python")]
    assert len(cmds) == 2                           # tidal layers x budgets, quest budgets: one array each
    assert "method.reselect_layer=null,3,4," in cmds[0] and "method.budget=32,64,128,256,512" in cmds[0]


# --- latency items: rendered from benchmark JSON ---------------------------------------------------

def fake_bench(d: Path) -> Path:
    """Small tpot/kernels JSON in the writers' formats (bench/tpot.py, bench_kernels.py)."""
    d.mkdir(parents=True, exist_ok=True)
    for model, contexts in (("llama2_7b", (10240, 32768)), ("llama3", (10240, 32768, 102400))):
        rows = []
        for s in contexts:
            full = 8.0 + s / 10240
            rows.append({"context": s, "method": "full", "budget": None, "batch": 1, "tpot_ms": full, "floor_ms": 5.0})
            for k in (32, 4096):
                rows += [{"context": s, "method": "quest", "budget": k, "batch": 1, "tpot_ms": 8.5, "floor_ms": 5.0},
                         {"context": s, "method": "tidal", "budget": k, "batch": 1, "tpot_ms": 6.5, "floor_ms": 5.0}]
        (d / f"tpot_{model}_h100.json").write_text(json.dumps(
            {"bench": "tpot", "model": model, "device": "NVIDIA H100 80GB HBM3", "rows": rows}))
    rows = []
    for s in (10240, 131072):
        full = 0.02 * s / 10240
        rows.append({"op": "full", "B": 1, "S": s, "ms_ours": full, "ms_sdpa": full * 1.05, "ms_selection": full * 1.05,
                     "ms_selection_topk": full * 2})
        rows += [{"op": op, "B": 1, "S": s, "budget": 512, "sets": sets, "ms": 0.005}
                 for op in ("tokens", "pages16") for sets in ("Hq", "Hkv")]
    rows.append({"op": "quest", "B": 1, "S": 131072, "ms_scores": 0.01, "ms_scores_topk": 0.1, "ms_update1": 0.004})
    (d / "kernels_llama3_h100.json").write_text(json.dumps({"meta": {"device": "NVIDIA H100 80GB HBM3"}, "rows": rows}))
    return d


LATENCY = ("tidal.fig6", "tidal.table5-6", "tidal.fig7", "tidal.fig8")


def test_latency_items_render_from_bench_json(tmp_path, capsys):
    bench, out = fake_bench(tmp_path / "bench"), tmp_path / "out"
    for key in LATENCY:
        assert main(["render", key, "--bench", str(bench), "--out", str(out)]) == 0
        md = (out / "tables" / f"{key}.md").read_text()
        assert "H100" in md and "A100" in md and "not comparable across GPUs" in md
        assert (out / "figures" / f"{key}.png").stat().st_size > 1000
        df = pd.read_csv(out / "tables" / f"{key}.csv")
        assert {"ours", "paper", "device_ours", "device_paper"} <= set(df.columns)
    fig6 = (out / "tables" / "tidal.fig6.md").read_text()
    assert "| Full (ms) | 9.00 (19.22) |" in fig6                        # ours (paper), llama2_7b @ 10K
    assert "1.38x (1.13x)" in fig6                                       # TD speedup 9/6.5 vs 19.22/16.94
    t56 = (out / "tables" / "tidal.table5-6.md").read_text()
    assert "| 10K | 9.00 (19.22) | 6.50 (16.94) | — (17.18) |" in t56      # Table 5, K=64 not measured
    assert "| 100K | — (45.70) |" in t56                                  # llama2_7b has no 100K run
    fig7 = (out / "tables" / "tidal.fig7.md").read_text()
    assert "(5.56x)" in fig7 and "(2.17x)" in fig7 and "~" in fig7        # 10K Quest: scaled estimate
    assert "2 x full (dense layers 0-1) + (L-2)" in fig7                  # the composition is stated
    assert "(3.36x)" in (out / "tables" / "tidal.fig8.md").read_text()


def test_latency_missing_json_is_one_clear_line(tmp_path, capsys):
    assert main(["render", "tidal.table5-6", "--bench", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "tpot_llama2_7b_h100.json" in err and "gpu_session.sh tpot" in err
    assert main(["make", "tidal.fig8", "--bench", str(tmp_path)]) == 2
    assert "bench.kernel_ops" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_latency_run_prints_the_gpu_command(tmp_path, capsys):
    assert main(["run", "tidal.fig7", "--bench", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "python3 -m bench.kernel_ops --sweep --out results/bench/kernels_llama3_h100.json" in out
    assert "$ python" not in out and "run.py" not in out              # no Hydra multirun launched
    assert main(["status", "tidal.fig6", "--bench", str(fake_bench(tmp_path / "b"))]) == 0
    assert "done" in capsys.readouterr().out
