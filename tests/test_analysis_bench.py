"""Latency items rendered from benchmark JSON, and the provenance of every benchmark number: one
recorded command per file (the one the catalogue declares), the commit it ran at, hand-merged rows
left out, stale files flagged, and estimated cells marked by what they bound."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pandas as pd
import pytest

import analysis.papers  # noqa: F401  (registers the implementations)
from analysis import provenance
from analysis.__main__ import main
from analysis.catalogue import BenchFile

ROOT = Path(__file__).resolve().parents[1]
LATENCY = ("tidal.fig6", "tidal.table5-6", "tidal.fig7", "tidal.fig8")
TPOT = "python -m bench.tpot --model {m} --weights random --contexts {c}"


def _tpot_file(d: Path, name: str, model: str, contexts, own=None, **head) -> None:
    """A TPOT JSON with rows at `contexts`, recording the command that measured `own` of them."""
    rows = []
    for s in contexts:
        rows.append({"context": s, "method": "full", "budget": None, "batch": 1, "tpot_ms": 8.0 + s / 10240})
        for k in (32, 4096):
            rows += [{"context": s, "method": "quest", "budget": k, "batch": 1, "tpot_ms": 8.5,
                      "semantics": {"dense_layers": 2, "page_size": 16}},
                     {"context": s, "method": "tidal", "budget": k, "batch": 1, "tpot_ms": 6.5,
                      "semantics": {"dense_layers": 2, "reselect_layer": 13}}]
    command = TPOT.format(m=model, c=" ".join(map(str, own or contexts)))
    (d / name).write_text(json.dumps({"bench": "tpot", "model": model, "device": "NVIDIA H100 80GB HBM3",
                                      "command": f"{command} --out $OUT/{name}", "rows": rows, **head}))


def fake_bench(d: Path) -> Path:
    """Benchmark JSON in the writers' formats: llama2_7b 10K/32K with its 100K rows merged in by
    hand (the second command recorded in merged_from), no separate 100K file, llama3 clean, and a
    kernels file that records no command."""
    d.mkdir(parents=True, exist_ok=True)
    merged = [{"command": TPOT.format(m="llama2_7b", c="102400") + " --out x.json"}]
    _tpot_file(d, "tpot_llama2_7b_h100.json", "llama2_7b", (10240, 32768, 102400), own=(10240, 32768),
               merged_from=merged)
    _tpot_file(d, "tpot_llama3_h100.json", "llama3", (10240, 32768, 102400))
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


def test_latency_items_render_from_bench_json(tmp_path):
    bench, out = fake_bench(tmp_path / "bench"), tmp_path / "out"
    for key in LATENCY:
        assert main(["render", key, "--bench", str(bench), "--out", str(out)]) == 0
        md = (out / "tables" / f"{key}.md").read_text()
        assert "H100" in md and "A100" in md and "not comparable across GPUs" in md and "Provenance" in md
        assert (out / "figures" / f"{key}.png").stat().st_size > 1000
        df = pd.read_csv(out / "tables" / f"{key}.csv")
        assert {"ours", "paper", "bound", "file", "provenance", "device_ours", "device_paper"} <= set(df.columns)
    fig6 = (out / "tables" / "tidal.fig6.md").read_text()
    assert "| Full (ms) | 9.00 (19.22) |" in fig6                        # ours (paper), llama2_7b @ 10K
    assert "1.38x (1.13x)" in fig6                                       # TD speedup 9/6.5 vs 19.22/16.94
    assert "llama2_7b: 10K, 32K; llama3: 10K, 32K, 100K" in fig6        # the notes follow the data
    assert "reselect_layer=13" in fig6                                   # what the rows say they ran
    t56 = (out / "tables" / "tidal.table5-6.md").read_text()
    assert "| 10K | 9.00 (19.22) | 6.50 (16.94) | — (17.18) |" in t56      # Table 5, K=64 not measured
    assert "| 100K | — (45.70) |" in t56                                  # the hand-merged 100K rows: left out
    assert "its 5 rows from them are left out here" in t56
    assert "`tpot_llama2_7b_100k_h100.json`: **missing**" in t56
    assert (f"re-run: `{TPOT.format(m='llama2_7b', c='102400')} --out results/bench/tpot_llama2_7b_100k_h100.json`"
            in t56)
    fig7 = (out / "tables" / "tidal.fig7.md").read_text()
    assert "(5.56x)" in fig7 and "(2.17x)" in fig7
    assert "| Quest (ms) | ≥" in fig7 and "| speedup Full/Quest | ≤" in fig7   # Quest at 10K: scaled from 128K
    assert "| speedup Quest/TidalDecode | ≥" in fig7
    assert "2 x full (dense layers 0-1) + (L-2)" in fig7                  # the composition is stated
    assert "no command recorded" in fig7 and "python -m bench.kernel_ops --sweep" in fig7
    fig8 = (out / "tables" / "tidal.fig8.md").read_text()
    assert "(3.36x)" in fig8 and "| Quest page scores | ≥" in fig8
    df = pd.read_csv(out / "tables" / "tidal.fig7.csv")
    assert set(df["bound"].dropna()) == {"lower", "upper"}


def test_every_committed_benchmark_file_has_one_declared_command():
    from analysis.bench_run import all_files

    committed = {p.name for p in (ROOT / "results" / "bench").glob("*.json")}
    assert committed <= set(all_files()), f"undeclared: {sorted(committed - set(all_files()))}"
    for f in all_files().values():
        assert f.command.startswith("python -m bench.") and "--out" not in f.command


def test_provenance_checks_each_file(tmp_path):
    f = BenchFile("t.json", TPOT.format(m="llama3", c="10240"), ("analysis",))
    d = tmp_path / "b"
    d.mkdir()
    (d / "t.json").write_text(json.dumps({"command": "python3 -m runners.bench_tpot --contexts 10240 --weights random "
                                                     "--model llama3 --out /x/t.json", "commit": "HEAD", "rows": []}))
    assert provenance.load(f, d).problems == []      # old module name, python3, option order, --out: same command
    (d / "t.json").write_text(json.dumps({"command": TPOT.format(m="llama3", c="32768"), "commit": "HEAD",
                                          "dirty": True, "rows": []}))
    problems = provenance.load(f, d).problems
    assert problems[0].startswith("other command recorded") and problems[1].startswith("uncommitted changes")
    assert provenance.load(BenchFile("none.json", "x", ()), d).short() == "missing"


def test_stale_files_are_flagged(tmp_path):
    if subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], check=False, capture_output=True).returncode:
        pytest.skip("no git history here")
    first = subprocess.run(["git", "-C", str(ROOT), "rev-list", "--max-parents=0", "HEAD"], check=True,
                           capture_output=True, text=True).stdout.split()[0]
    assert provenance.staleness("HEAD", ("analysis",)) is None
    assert provenance.staleness(first, ("analysis",)).startswith("stale: the code it measures (analysis)")
    assert provenance.staleness("0123456", ("analysis",)).startswith("freshness unknown")


def test_latency_missing_json_is_one_clear_line(tmp_path, capsys):
    assert main(["render", "tidal.table5-6", "--bench", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "none of its benchmark files" in err and "analysis bench tidal.table5-6" in err
    assert main(["make", "tidal.fig8", "--bench", str(tmp_path)]) == 2
    assert "analysis bench tidal.fig8" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_run_and_bench_print_the_gpu_commands(tmp_path, capsys):
    assert main(["run", "tidal.fig7", "--bench", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"python -m bench.kernel_ops --sweep --out {tmp_path}/kernels_llama3_h100.json" in out
    assert "$ python" not in out and "run.py" not in out              # no Hydra multirun launched
    assert main(["bench", "tidal.fig6", "--bench", str(tmp_path), "--dry-run"]) == 0
    cmds = [line for line in capsys.readouterr().out.splitlines() if line.startswith("$ ")]
    assert len(cmds) == 3 and all("python -m bench.tpot" in c for c in cmds)
    assert main(["bench", "results/bench/tpot_llama3_h100.json", "--bench", str(tmp_path), "--dry-run"]) == 0
    assert capsys.readouterr().out.count("$ ") == 1
    assert main(["status", "tidal.fig6", "--bench", str(fake_bench(tmp_path / "b"))]) == 0
    assert "hand-merged" in capsys.readouterr().out


def test_bench_scripts_record_their_command_and_commit():
    import torch

    from bench.engine import Clock, copy_bandwidth
    from bench.engine import provenance as bench_provenance

    p = bench_provenance("bench.engine", ["--lengths", "256", "--out", "x.json", "--steps", "4"])
    assert p["command"] == "python -m bench.engine --lengths 256 --steps 4"          # where it went is not part
    assert p["commit"] and p["dirty"] in (True, False)
    assert copy_bandwidth(torch.device("cpu"), Clock(torch.device("cpu")), nbytes=1 << 22, repeat=2) > 1e8
