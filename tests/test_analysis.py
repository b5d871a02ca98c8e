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
