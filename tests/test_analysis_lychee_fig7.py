"""lychee.fig7 renders the training curves of bench/train_curves.py: synthetic curves in, the grey-head
share, head counts and densities out, and the PDF panels pick the most and least retrieval-like heads
outside layer 0. The Kumaraswamy density integrates to 1 and matches offline.gates' CDF."""
from __future__ import annotations

import json

import pytest
import torch

import analysis.papers  # noqa: F401
from analysis import catalogue
from analysis.__main__ import main
from analysis.papers.lychee_fig7 import _pdf_heads, kuma_pdf
from offline.gates import kuma_cdf


@pytest.mark.parametrize("a,b", [(1.0, 1.0), (0.5, 3.0), (4.0, 0.7)])
def test_kuma_pdf_is_the_derivative_of_the_gates_cdf(a, b):
    n = 20000
    xs = [(i + 0.5) / n for i in range(n)]
    assert abs(sum(kuma_pdf(x, a, b) for x in xs) / n - 1) < 2e-2
    for x in (0.2, 0.5, 0.8):
        h = 1e-5
        num = (kuma_cdf(torch.tensor(x + h, dtype=torch.float64), torch.tensor(a), torch.tensor(b))
               - kuma_cdf(torch.tensor(x - h, dtype=torch.float64), torch.tensor(a), torch.tensor(b))) / (2 * h)
        assert abs(float(num) - kuma_pdf(x, a, b)) < 1e-4


def test_pdf_heads_skip_layer_0():
    final = [[0.01, 0.99], [0.6, 0.05], [0.97, 0.3]]
    assert _pdf_heads(final) == [(0, 1), (1, 1)]


def _curves(recipe: str, final: list[list[float]]) -> dict:
    start = [[1.0] * 2 for _ in final]
    return {"command": "", "commit": "abc1234", "device": "cpu", "model": "smollm2", "recipe": recipe,
            "training": {"steps": 3, "lr": 0.03, "device": "cpu", "final_density": 0.25, "target_density": 0.25},
            "steps": [0, 1, 2], "retrieval_prob": [start, start, final],
            "gate_states": {"0": {"a": start, "b": start}, "2": {"a": [[3.0, 0.5]] * 3, "b": [[0.5, 3.0]] * 3}}}


def test_fig7_renders_both_gates(tmp_path):
    bench = tmp_path / "bench"
    bench.mkdir()
    finals = {"passkey-duo": [[1.0, 1.0], [0.5, 0.45], [0.9, 0.1]], "passkey-hardkuma": [[1.0, 1.0], [0.99, 0.0],
                                                                                       [0.02, 0.01]]}
    for f in catalogue.get("lychee.fig7").impl.bench.files:
        recipe = "passkey-duo" if "duo" in f.name else "passkey-hardkuma"
        (bench / f.name).write_text(json.dumps({**_curves(recipe, finals[recipe]), "command": f.command}))
    assert main(["render", "lychee.fig7", "--bench", str(bench), "--out", str(tmp_path / "out")]) == 0
    md = (tmp_path / "out" / "tables" / "lychee.fig7.md").read_text()
    assert "| DuoAttention (direct gates) | 33.3% | 3.00 |" in md        # 0.5 and 0.45 grey of 6; 3 above 0.5
    assert "| LycheeDecode (HardKuma) | 0.0% | 3.00 |" in md
    assert (tmp_path / "out" / "figures" / "lychee.fig7.png").exists()


def test_train_curves_refuses_to_be_told_where_files_go():
    from bench.train_curves import main as run

    with pytest.raises(SystemExit, match="chooses where"):
        run(["steps=1", "out=heads.json"])
