"""Re-derivable tables: the rows a table is rendered from are exported in compact form (committed,
results/rows/), a render reads only those, never replaces a table with one holding fewer results
unless told, and a fresh checkout re-renders every committed table byte for byte without a model."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from analysis_fakes import fake_run, table1_cells

import analysis.papers  # noqa: F401  (registers the implementations)
from analysis import catalogue, compact, nodata
from analysis.__main__ import main

ROOT = Path(__file__).resolve().parents[1]


def _render(tmp: Path, results: Path, *extra: str) -> int:
    return main(["render", "tidal.table1", "--results", str(results), "--rows", str(tmp / "rows"),
                 "--out", str(tmp / "out"), *extra])


@pytest.fixture
def runs(tmp_path):
    cells = table1_cells()
    results = tmp_path / "runs"
    fake_run(results, cells[("Quest", 32)].values, [1] * 30 + [0] * 70)
    fake_run(results, cells[("TD+L7", 128)].values, [1] * 80 + [0] * 20)
    fake_run(results, cells[("StreamingLLM", 512)].values, [0] * 40, summary=False)
    return results


def test_a_table_rerenders_from_its_compact_rows_alone(tmp_path, runs):
    assert _render(tmp_path, runs) == 0
    md, csv = (tmp_path / "out" / "tables" / f"tidal.table1.{e}" for e in ("md", "csv"))
    before = md.read_bytes(), csv.read_bytes()
    files = sorted((tmp_path / "rows").rglob("*.jsonl"))
    assert len(files) == 3
    head = compact.read_head(files[0])
    assert head["n_rows"] in (40, 100) and "wandb" not in head["config"]["runner"]   # machine-local keys dropped
    assert len(compact.read_rows(files[0])) == head["n_rows"]
    shutil.rmtree(runs)                                                 # a fresh clone: no results/runs
    assert _render(tmp_path, runs) == 0
    assert (md.read_bytes(), csv.read_bytes()) == before


def test_export_never_replaces_rows_with_fewer(tmp_path, runs):
    assert _render(tmp_path, runs) == 0
    quest = next(runs.glob("niah/smollm2/quest/*"))
    lines = (quest / "samples.jsonl").read_text().splitlines()
    (quest / "samples.jsonl").write_text("\n".join(lines[:10]) + "\n")   # the same run, 10 rows left
    copy = compact.path_for(tmp_path / "rows", "niah", "smollm2", "quest", quest.name)
    assert compact.read_head(copy)["n_rows"] == 100
    assert main(["export", "tidal.table1", "--results", str(runs), "--rows", str(tmp_path / "rows")]) == 0
    assert compact.read_head(copy)["n_rows"] == 100                    # the committed copy keeps its rows


def test_a_render_with_fewer_results_is_refused_unless_replace(tmp_path, runs, capsys):
    assert _render(tmp_path, runs) == 0
    md = tmp_path / "out" / "tables" / "tidal.table1.md"
    before = md.read_text()
    shutil.rmtree(runs / "niah" / "smollm2" / "quest")
    shutil.rmtree(tmp_path / "rows" / "niah" / "smollm2" / "quest")   # the Quest cell's rows are gone
    assert _render(tmp_path, runs) == 2
    err = capsys.readouterr().err
    assert "fewer results" in err and "3 filled cells -> 2" in err and "--replace" in err
    assert md.read_text() == before
    assert _render(tmp_path, runs, "--replace") == 0
    assert md.read_text() != before


def test_tables_says_which_items_it_skipped_and_why(tmp_path, capsys):
    """Nothing to render from: every item is skipped with its reason, except the data-bound ones, which
    write their no-data tables (a paper-only one, e.g. lychee.table1, from its paper profile)."""
    empty = tmp_path / "empty"
    assert main(["tables", "--results", str(empty), "--rows", str(empty), "--bench", str(empty),
                 "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    keys = catalogue.implemented_keys()
    def bound_in(impl) -> bool:   # data-bound in the profile `tables` renders (lychee.table3: paper only)
        profile = next(iter(impl.sweeps)) if impl.sweeps and "embedded" not in impl.sweeps else "embedded"
        return nodata.applies(impl, [], profile)

    bound = {k for k in keys if bound_in(catalogue.get(k).impl)}
    assert bound and f"skipped {len(keys) - len(bound)} item(s)" in out
    # one line: "skipped N item(s): <why>: k1, k2; <why>: k3 (`python -m analysis render KEY` says more)"
    skipped = out.split("skipped ", 1)[1].split("\n", 1)[0].split(" (`", 1)[0]
    named = {k.strip() for part in skipped.split(": ", 1)[1].split("; ") for k in part.split(": ")[-1].split(",")}
    for key in keys:
        assert (key in named) == (key not in bound), key
    assert "no rows: " in skipped and "no benchmark file: " in skipped
    written = {p.name for p in (tmp_path / "out" / "tables").iterdir()}
    assert written == {f"{k}.{e}" for k in bound for e in ("md", "csv")}
    assert "Profile `paper`" in (tmp_path / "out" / "tables" / "lychee.table1.md").read_text()


def _history_complete() -> str | None:
    """Why the freshness of committed benchmark files cannot be judged here, or None."""
    r = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--is-shallow-repository"], check=False,
                       capture_output=True, text=True)
    if r.returncode != 0:
        return "no git history: the staleness of benchmark files cannot be checked"
    if r.stdout.strip() == "true":
        return "shallow clone: the commits benchmark files record may be missing"
    return None


# Every item, figures included: about a minute here (it had reached its 10-minute timeout while pandas deep-copied
# each frame's runs, see analysis.render.RunMap), so it runs in `make test-long` (CI runs both); `make tables`
# before committing a table is the everyday check.
@pytest.mark.long
def test_every_committed_table_rerenders_byte_for_byte(tmp_path, capsys):
    """`make tables` on a fresh clone: from the committed rows and benchmark JSON only (no results/
    runs, no model), every committed table comes out identical; a committed table without rows
    says it is withdrawn."""
    why = _history_complete()
    if why:
        pytest.skip(why)
    out = tmp_path / "out"
    assert main(["tables", "--results", str(tmp_path / "no-runs"), "--rows", str(ROOT / "results" / "rows"),
                 "--bench", str(ROOT / "results" / "bench"), "--out", str(out)]) == 0
    rendered = {p.name for p in (out / "tables").glob("*")} if (out / "tables").exists() else set()
    committed = {p.name for p in (ROOT / "results" / "tables").glob("*")}
    assert rendered <= committed, f"rendered but not committed: {sorted(rendered - committed)} (run make tables)"
    for name in sorted(committed):
        mine = ROOT / "results" / "tables" / name
        if name in rendered:
            assert (out / "tables" / name).read_bytes() == mine.read_bytes(), \
                f"results/tables/{name} differs from a fresh render: run `make tables` and commit the result"
        else:
            assert name.endswith(".md") and "No committed rows" in mine.read_text(), \
                f"results/tables/{name} has no rows or benchmark JSON to render it from"
