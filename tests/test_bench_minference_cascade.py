"""bench/minference_cascade.py (Cascading Table 8's "MInference + Cascade" row): a CPU smoke run at tiny shapes
(torch reference backend: it checks the script, it measures nothing), and the row in cascade.table8's
rendering: ours beside the paper's from the JSON, "—" beside the paper's when the JSON is absent."""
from __future__ import annotations

import json

import pytest

from analysis.__main__ import main as analysis_main
from analysis.papers import cascade_latency as CL


@pytest.mark.slow
def test_smoke_run_writes_rows_and_its_command(tmp_path):
    from bench.minference_cascade import main

    out = tmp_path / "mc.json"
    args = ["--device", "cpu", "--lengths", "40", "100", "--cache", "16", "--sink", "4", "--stride", "48",
            "--index", "estimated", "nearest", "--out", str(out)]
    assert main(args) == 0
    data = json.loads(out.read_text())
    assert data["command"].startswith("python -m bench.minference_cascade --device cpu") and "--out" not in data["command"]
    assert data["backend"] == "torch" and data["settings"]["stride"] == 48
    rows = {(r["index_mode"], r["length"]): r for r in data["rows"]}
    assert set(rows) == {("estimated", 40), ("estimated", 100), ("nearest", 40), ("nearest", 100)}
    assert all(r["seconds"] > 0 and 0 < r["chunk_density"] <= 1 for r in rows.values())
    assert rows["estimated", 100]["chunks"] == 3


def _render(tmp_path, with_file: bool) -> str:
    bench, out = tmp_path / "bench", tmp_path / "out"
    bench.mkdir()
    (bench / CL.MINF.name).write_text(json.dumps({      # another file of the item: the render needs one
        "command": CL.MINF.command, "commit": "abc1234", "device": "NVIDIA H100", "settings": {},
        "rows": [{"method": "minference", "index_mode": "estimated", "length": 16384, "seconds": 0.1}]}))
    if with_file:
        rows = [{"suite": "layer", "method": "minference_cascade", "index_mode": m, "length": n,
                 "seconds": n / 2 ** 16 * (1 if m == "estimated" else 0.5), "chunk_density": 0.5}
                for m in ("estimated", "nearest") for n in CL.LENGTHS]
        (bench / CL.MINF_CASCADE.name).write_text(json.dumps({
            "command": CL.MINF_CASCADE.command, "commit": "abc1234", "device": "NVIDIA H100", "rows": rows,
            "settings": {"cache": 16384, "stride": 100000}}))
    assert analysis_main(["render", "cascade.table8", "--bench", str(bench), "--out", str(out)]) == 0
    return (out / "tables" / "cascade.table8.md").read_text()


def test_table8_row_beside_the_paper(tmp_path):
    md = _render(tmp_path, True)
    assert "| MInference + Cascade | 0.250 (0.340) |" in md and "16.00 (24.13) |" in md
    assert "nearest-diagonal index" in md and "50.0%" in md


def test_table8_row_without_its_file(tmp_path):
    md = _render(tmp_path, False)
    assert "| MInference + Cascade | — (0.340) | — (0.680) |" in md
    assert "minference_cascade_layer_h100.json`: **missing**" in md
