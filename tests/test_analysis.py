"""The analysis catalogue: the full map of PAPERS.md, Make targets generated from it, modules that
register with the catalogue (no import circle), cell matching against stored runs, and rendering
(ours with n and a 95% interval beside the paper's, "not implemented" rows) on synthetic result rows
written into a temporary results directory. Compact rows and byte-for-byte re-rendering:
tests/test_analysis_rows.py; latency items and benchmark provenance: tests/test_analysis_bench.py."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pandas as pd
import pytest
import yaml
from analysis_fakes import fake_run, table1_cells

import analysis.papers  # noqa: F401  (registers the implementations)
from analysis import catalogue
from analysis.__main__ import main
from analysis.defaults import method_default
from analysis.launch import pack
from analysis.makefile import generate
from analysis.runs import Store, expand, method_exists
from analysis.stats import interval, wilson

ROOT = Path(__file__).resolve().parents[1]
PAPERS_MD = ROOT.parent / "shared" / "PAPERS.md"
NO_METHOD = "no_such_method_ever"        # a name no method will take (checked below, not assumed)


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
    assert set(keys) == {k for k in catalogue.items() if not k.startswith("harness.")}  # harness.*: no paper's
    assert main(["list"]) == 0
    listed = capsys.readouterr().out
    for k in keys:
        assert k in listed


def _analysis_imports(path: Path) -> set[str]:
    """analysis.* modules a file imports, at any depth (function-level imports included)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("analysis"):
            mods = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            out |= {m for m in mods if (ROOT / (m.replace(".", "/") + ".py")).exists()}
            for a in node.names:
                assert not a.name.startswith("_"), f"{path.name} imports the private {node.module}.{a.name}"
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("analysis.")}
    return out


def test_analysis_modules_form_no_import_circle():
    files = list((ROOT / "analysis").rglob("*.py"))
    mod = {f: ".".join(f.relative_to(ROOT).with_suffix("").parts) for f in files}
    graph = {mod[f]: _analysis_imports(f) - {mod[f]} for f in files if f.name != "__init__.py"}
    assert not any(m.startswith("analysis.papers") for m in graph["analysis.catalogue"]), \
        "the catalogue must not import the paper modules: they register with it"
    state: dict[str, int] = {}

    def visit(m, path):
        if state.get(m) == 1:
            raise AssertionError("import circle: " + " -> ".join(path + [m]))
        if state.get(m) == 2:
            return
        state[m] = 1
        for d in graph.get(m, ()):
            visit(d, path + [m])
        state[m] = 2

    for m in graph:
        visit(m, [])
    assert {"tidal.table1", "tidal.fig6"} <= set(catalogue.implemented_keys())   # registered on import


def test_method_default_reads_the_method_config():
    conf = yaml.safe_load((ROOT / "conf" / "method" / "tidal.yaml").read_text())
    assert method_default("tidal", "reselect_layer") == conf["reselect_layer"]
    from analysis.papers.tidal import row_label

    assert row_label({"method": "tidal"}) == f"TD+L{conf['reselect_layer']}"
    assert row_label({"method": "tidal", "method.reselect_layer": None}) == f"TD+L{conf['dense_layers']}"
    with pytest.raises(KeyError):
        method_default("tidal", "no_such_key")


def test_targets_mk_is_generated_and_current():
    text = (ROOT / "analysis" / "targets.mk").read_text()
    assert text == generate(), "run: python -m analysis makefile > analysis/targets.mk"
    for it in catalogue.items().values():
        assert f"\n{it.target()}: install\n" in text
    assert "\nresults/bench/tpot_llama3_h100.json: | install\n" in text      # one rule per benchmark file
    assert "include analysis/targets.mk" in (ROOT / "Makefile").read_text()


def test_table_numbers_resolve_per_paper():
    assert catalogue.table_key(1, "lychee") == "lychee.table1"
    assert catalogue.table_key(9, "tidal") == "tidal.table7-12"
    assert catalogue.table_key(6, "lychee") == "lychee.table5-6"
    with pytest.raises(KeyError):
        catalogue.table_key(99, "tidal")


def test_not_implemented_items_say_so(capsys, monkeypatch):
    # every item is implemented now: take three implementations away for the test
    for key in ("tidal.fig1", "tidal.fig3", "tidal.table3"):
        monkeypatch.setattr(catalogue.get(key), "impl", None)
    assert main(["render", "tidal.fig3"]) == 2
    assert "not implemented in analysis/ yet" in capsys.readouterr().err
    assert main(["run", "tidal.fig1"]) == 2
    assert main(["table", "3", "--paper", "tidal"]) == 2
    assert "tidal.table3, not implemented" in capsys.readouterr().err
    assert main(["render", "nope.table1"]) == 2


def test_wilson_interval_known_values():
    assert wilson(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson(10, 10) == pytest.approx((0.7225, 1.0), abs=1e-4)
    lo, hi, how = interval([1.0] * 50 + [0.0] * 50)
    assert how == "wilson" and (lo, hi) == pytest.approx((0.4038, 0.5962), abs=1e-4)
    assert interval([0.2, 0.4])[2] == "normal" and interval([]) is None
    # fractional scores in [0, 1] (per-digit accuracy): the normal interval stays inside [0, 1]
    lo, hi, _ = interval([0.0] * 18 + [0.2, 0.1])
    assert lo == 0.0 and 0.0 < hi < 0.1
    assert interval([2.0, 3.0])[0] < 2.0   # other scales are not clipped


def test_pack_merges_cells_into_sweeps():
    impl = catalogue.get("tidal.table1").impl
    cells = [c for c in expand(impl.sweeps["embedded"], [], impl.label) if c.values["method"] == "quest"]
    assert len(cells) == 5
    assert pack(cells) == [[o if not o.startswith("method.budget") else "method.budget=32,64,128,256,512"
                            for o in cells[0].overrides]]
    assert pack(cells[1:3])[0][-1] == "method.budget=64,128"


# --- synthetic results ------------------------------------------------------------------------------

@pytest.fixture
def table1_results(tmp_path):
    cells = table1_cells()
    results = tmp_path / "runs"
    fake_run(results, cells[("Quest", 32)].values, [1] * 50 + [0] * 50)
    fake_run(results, cells[("TD+L7", 32)].values, [1] * 100)
    fake_run(results, cells[("TD+L7", 64)].values, [1, 1], summary=False)     # partial: 2 of 100 rows
    fake_run(results, cells[("Full (reference)", "all")].values, [1] * 100)
    # a run of another config (different length) must not fill any cell
    other = dict(cells[("Quest", 64)].values, **{"task.lengths": [2048]})
    fake_run(results, other, [0] * 100)
    return results


def test_status_matches_runs_by_value(table1_results):
    store = Store(table1_results)
    cells = {k: store.fill(c) for k, c in table1_cells().items()}
    assert cells[("Quest", 32)].status == "done" and cells[("Quest", 32)].expected == 100
    assert cells[("TD+L7", 64)].status == "partial" and cells[("TD+L7", 64)].expected == 100
    assert cells[("Quest", 64)].status == "missing"
    assert not method_exists(NO_METHOD)
    ghost = expand([["task=niah", "model=smollm2", f"method={NO_METHOD}"]], [], lambda v: ("", "x", 1))
    assert store.fill(ghost[0]).status == "not implemented"


def test_render_puts_ours_with_interval_beside_the_paper(table1_results, tmp_path, monkeypatch, capsys):
    impl = catalogue.get("tidal.table1").impl
    ghost = [o.replace("method=quest", f"method={NO_METHOD}") for o in impl.sweeps["embedded"][3]]
    monkeypatch.setitem(impl.sweeps, "embedded", impl.sweeps["embedded"] + [ghost])
    out, rows = tmp_path / "out", tmp_path / "rows"
    args = ["render", "tidal.table1", "--results", str(table1_results), "--rows", str(rows), "--out", str(out)]
    assert main(args) == 0
    md = (out / "tables" / "tidal.table1.md").read_text()
    assert f"| {NO_METHOD} — not implemented | — | — | — | — | — | 0 |" in md
    assert "| Quest | 50 [40–60] (65) | — (99) |" in md                  # ours [95% Wilson] (paper)
    assert "| TD+L7 | 100 [96–100] (73) | 100* [34–100] n=2 (92) |" in md    # partial: *, its own n
    assert "95% Wilson score interval" in md and "abc1234" in md       # the commit of the runs
    assert "Full attention (ours, same samples): 100% [96–100] (n=100)" in md
    df = pd.read_csv(out / "tables" / "tidal.table1.csv")
    assert set(df["status"]) >= {"done", "partial", "missing", "not implemented"}
    assert {"ci_lo", "ci_hi", "ci", "n", "run", "commit"} <= set(df.columns)
    assert (out / "figures" / "tidal.table1.png").stat().st_size > 1000
    assert main(args) == 0                                               # the same rows, the same table
    assert (out / "tables" / "tidal.table1.md").read_text() == md
    assert "unchanged" in capsys.readouterr().out


def test_run_launches_only_what_is_missing(table1_results, tmp_path, capsys):
    assert main(["run", "tidal.table1", "--results", str(table1_results), "--rows", str(tmp_path / "rows"),
                 "--dry-run"]) == 0
    out = capsys.readouterr().out
    cmds = [line for line in out.splitlines() if line.startswith("$ python")]
    quest = next(c for c in cmds if "method=quest" in c)
    assert "method.budget=64,128,256,512 " in quest                    # K=32 is done: not re-run
    tidal = next(c for c in cmds if "method=tidal" in c and "reselect_layer=7 " in c)
    assert "method.budget=64,128,256,512 " in tidal                    # the partial one is resumed
    assert not any("method=full" in c for c in cmds)
    assert all(f"runner.results_dir={table1_results}" in c for c in cmds)
    assert not (tmp_path / "rows").exists()                            # a dry run writes nothing


def test_dry_run_and_missing_rows_write_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    (out / "tables").mkdir(parents=True)
    kept = out / "tables" / "tidal.table1.md"
    kept.write_text("committed\n")
    base = ["--results", str(tmp_path / "none"), "--rows", str(tmp_path / "rows"), "--out", str(out)]
    assert main(["make", "tidal.table1", "--dry-run", *base]) == 0
    assert main(["render", "tidal.table1", "--dry-run", *base]) == 0
    assert main(["render", "tidal.table1", *base]) == 2                 # no rows: says so, writes nothing
    assert "no rows for any cell" in capsys.readouterr().err
    assert kept.read_text() == "committed\n" and sorted(p.name for p in out.rglob("*")) == ["tables", "tidal.table1.md"]
    assert not (tmp_path / "rows").exists()


@pytest.mark.long   # 25 s of renders: outside `make test`, in `make test-long` and CI
def test_sensitivity_renderers_on_synthetic_rows(tmp_path):
    impl = catalogue.get("tidal.table7-12").impl
    cells = [c for c in expand(impl.sweeps["embedded"], [], impl.label) if c.col in (128, 256)]
    assert {c.row for c in cells} >= {"TD+L2", "TD+L29", "Quest"}
    assert any("method.reselect_layer=null" in c.overrides for c in cells)  # TD+L2: one selection layer
    results = tmp_path / "runs"
    for c in cells[:12]:
        fake_run(results, c.values, [1, 0] * 25)
    for key in ("tidal.table7-12", "tidal.fig9"):
        assert main(["render", key, "--results", str(results), "--rows", str(tmp_path / "rows"),
                     "--out", str(tmp_path / "out")]) == 0
        md = (tmp_path / "out" / "tables" / f"{key}.md").read_text()
        assert "smollm2" in md and "50 [37–63]" in md
        assert "(100)" in md                                       # paper numbers of the paper models
        assert (tmp_path / "out" / "figures" / f"{key}.png").exists()
    t2 = catalogue.get("tidal.table2").impl
    paper_blocks = {r["block"] for r in t2.paper}
    assert "llama3 @ 100000" in paper_blocks
    assert {t2.label(c.values)[0] for c in expand(t2.sweeps["paper"], [], t2.label)} == paper_blocks


def test_embedded_profiles_sample_as_many_per_cell_as_the_paper():
    """n per cell of the embedded sweeps: 10 depths x rounds = the paper's count (Table 1: 100,
    Tables 2 and 7-12: 50), so a cell's 95% Wilson interval is at most +-10 / +-14 points."""
    for key, n in (("tidal.table1", 100), ("tidal.table2", 50), ("tidal.table7-12", 50), ("tidal.fig9", 50)):
        impl = catalogue.get(key).impl
        for c in expand(impl.sweeps["embedded"], [], impl.label):
            assert len(c.values["task.depths"]) * c.values["task.rounds"] == n, (key, c.overrides)


def test_nothing_done_launches_the_sweeps_as_written(tmp_path, capsys):
    assert main(["run", "tidal.table7-12", "--results", str(tmp_path), "--rows", str(tmp_path / "rows"),
                 "--dry-run"]) == 0
    cmds = [line for line in capsys.readouterr().out.splitlines() if line.startswith("$ python")]
    assert len(cmds) == 2                           # tidal layers x budgets, quest budgets: one array each
    assert "method.reselect_layer=null,3,4," in cmds[0] and "method.budget=32,64,128,256,512" in cmds[0]


def test_a_cell_leaving_an_option_at_its_default_is_not_filled_by_a_run_that_changed_it(tmp_path):
    """cascade.table3: 'w/ token selection' leaves method.selection alone, 'w/o' sets it false. A run of
    the second (its stored config says selection: false) must not fill the first."""
    impl = catalogue.get("cascade.table3").impl
    cells = {c.row: c for c in expand(impl.sweeps["embedded"], [], impl.label)}
    with_sel, without = cells["Ours w/ token selection"], cells["Ours w/o token selection"]
    assert "method.selection" not in with_sel.values
    fake_run(tmp_path, dict(without.values, **{"method.selection": False}), [1])
    store = Store(tmp_path)
    assert store.fill(without).status == "done"
    assert store.fill(with_sel).status == "missing"
    fake_run(tmp_path, dict(with_sel.values, **{"method.selection": True}), [1])   # the YAML default
    assert Store(tmp_path).fill(with_sel).status == "done"


def test_an_interpolated_default_does_not_refuse_a_run(tmp_path):
    """LycheeDecode's head_model defaults to `${oc.select:model.name,null}`; a run stores the resolved
    model name. That is not a changed option: the run must fill the cell that leaves it alone (and a run
    that changed a plain option still must not)."""
    impl = catalogue.get("lychee.table4").impl
    cell = next(c for c in expand(impl.sweeps["embedded"], [], impl.label)
                if c.block == "LycheeDecode" and "method.heads" not in c.values)
    fake_run(tmp_path, dict(cell.values, **{"method.head_model": "smollm2", "method.sink": 128}), [1])
    assert Store(tmp_path).fill(cell).status == "done"
    other = tmp_path / "other"
    fake_run(other, dict(cell.values, **{"method.head_model": "smollm2", "method.sink": 64}), [1])
    assert Store(other).fill(cell).status == "missing"


def test_tables_prints_what_changed_and_names_what_it_skipped(monkeypatch, capsys):
    """`make tables`: the files a render wrote, then one summary naming the items not rendered."""
    import argparse
    from types import SimpleNamespace

    import analysis.__main__ as cli
    from analysis.catalogue import MissingResults

    impls = {"p.t1": SimpleNamespace(bench=None, sweeps={"embedded": []}, data=[]),
             "p.t2": SimpleNamespace(bench=None, sweeps={"embedded": []}, data=[]),
             "p.t3": SimpleNamespace(bench=None, sweeps={"embedded": []}, data=["longbench"]),
             "p.t4": SimpleNamespace(bench=None, sweeps={"paper": []}, data=[]),
             "p.t5": SimpleNamespace(bench=object(), sweeps={}, data=[])}

    def render(args):
        if args.key == "p.t2":
            raise MissingResults("p.t2 [embedded]: no rows for any cell (none under results/rows/); nothing written")
        if args.key == "p.t5":
            raise MissingResults("p.t5: none of its benchmark files is under results/bench/; write them")
        if args.key == "p.t3":
            print("p.t3 [embedded]: no data here: LongBench is not on this machine")
        print("3 done")
        print("wrote results/tables/p.t1.md" if args.key == "p.t1" else f"unchanged results/tables/{args.key}.md")

    monkeypatch.setattr(cli.catalogue, "implemented_keys", lambda: list(impls))
    monkeypatch.setattr(cli.catalogue, "get", lambda key: SimpleNamespace(impl=impls[key]))
    monkeypatch.setattr(cli, "cmd_render", render)
    assert cli.cmd_tables(argparse.Namespace(profile="embedded")) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "wrote results/tables/p.t1.md",
        "rendered 2 item(s): 1 file(s) written, the rest unchanged; 1 as no-data tables (their data is not here): p.t3",
        ("skipped 3 item(s): no rows: p.t2; no 'embedded' profile: p.t4; no benchmark file: p.t5 "
         "(`python -m analysis render KEY` says more)")]
