"""LycheeDecode Figs. 1 and 10-13: the overlap of adjacent layers' top-k keys per head (against a brute
force on random indices), and the items render their summary from a synthetic benchmark file."""
from __future__ import annotations

import json

import torch

import analysis.papers  # noqa: F401
from analysis import catalogue
from analysis.__main__ import main
from analysis.papers.lychee_overlap import summary
from bench.lychee_overlap import overlap


def test_overlap_equals_set_intersection():
    g = torch.Generator().manual_seed(0)
    top = torch.stack([torch.stack([torch.randperm(12, generator=g)[:5] for _ in range(4)]) for _ in range(6)])
    got = overlap(top)
    for layer in range(5):
        for h in range(4):
            want = len(set(top[layer, h].tolist()) & set(top[layer + 1, h].tolist())) / 5
            assert abs(float(got[layer, h]) - want) < 1e-6


def test_summary_counts_zero_and_full_heads():
    s = summary([[0.0, 1.0, 0.4], [0.2, 0.2, 1.0]])
    assert s["heads at 0%"] == 100 / 6 and s["heads at 100%"] == 200 / 6
    assert abs(s["spread within a layer pair"] - 90.0) < 1e-9 and abs(s["mean overlap"] - 280 / 6) < 1e-9


def test_fig1_and_fig9_13_render(tmp_path):
    f = catalogue.get("lychee.fig1").impl.bench.files[0]
    cases = [{"figure": fig, "prompt": "p", "answer": "a", "tokens": 9, "model_answer": "<|im_end|>",
              "query_token": " a", "overlap": [[0.0, 1.0], [0.6, 0.4]]} for fig in ("fig1", "fig10", "fig11")]
    bench = tmp_path / "bench"
    bench.mkdir()
    (bench / f.name).write_text(json.dumps({"command": f.command, "commit": "abc1234", "device": "cpu",
                                            "model": "smollm2", "dtype": "torch.float32", "k": 5, "cases": cases}))
    for key, figs in (("lychee.fig1", ["fig1"]), ("lychee.fig9-13", ["fig10", "fig11"])):
        assert main(["render", key, "--bench", str(bench), "--out", str(tmp_path / "out")]) == 0
        md = (tmp_path / "out" / "tables" / f"{key}.md").read_text()
        rows = [line for line in md.splitlines() if line.startswith("| fig")]
        assert [r.split(" |")[0][2:] for r in rows] == figs
        assert rows[0] == f"| {figs[0]} | 50.0% | 25.0% | 25.0% | 60.0% |"
