"""Ltri-LLM catalogue items: every cell of every sweep (both profiles) is a valid method/task config
(one-line refusals would otherwise only show on the GPU), and each renderer writes its table and
figure from synthetic rows (per-sample recall, depths, index vectors; benchmark JSON for Table 4)."""
from __future__ import annotations

import functools
import json

import pytest
from analysis_fakes import nested
from omegaconf import OmegaConf

import analysis.papers  # noqa: F401
from analysis import catalogue
from analysis.__main__ import main
from analysis.runs import expand
from methods import REGISTRY, ModelInfo
from runners.models import config_from_arch

KEYS = ["ltri.fig1-2", "ltri.table1", "ltri.fig8", "ltri.table2", "ltri.table3", "ltri.fig9", "ltri.table8",
        "ltri.fig10-14"]


@functools.cache
def _info(model: str) -> ModelInfo:
    return ModelInfo.from_hf_config(config_from_arch(OmegaConf.load(f"conf/model/{model}.yaml").arch))


@pytest.mark.parametrize("profile", ["embedded", "paper"])
@pytest.mark.parametrize("key", KEYS)
def test_every_cell_is_a_valid_method_config(key, profile):
    impl = catalogue.get(key).impl
    cells = expand(impl.sweeps[profile], [], impl.label)
    assert cells
    for c in cells:
        v = c.values
        if v["method"] == "minference":
            continue                                  # not implemented: the cell says so
        method = {k.split(".", 1)[1]: x for k, x in v.items() if k.startswith("method.")}
        REGISTRY.get(v["method"]).Config.parse({"name": v["method"], **method}, _info(v["model"]))


def _write_run(root, values, rows):
    d = root / values["task"] / values["model"] / values["method"] / f"h{abs(hash(str(values))) % 10 ** 8}"
    if d.exists():              # the same run serves several items (fig1-2's runs are table1's record runs)
        return
    d.mkdir(parents=True)
    with open(d / "samples.jsonl", "w") as f:
        for i, r in enumerate(rows):
            f.write(json.dumps({"id": f"s{i}", "device": "cpu", "dtype": "torch.float32", "timestamp": 1e9 + i,
                                **r}) + "\n")
    (d / "summary.json").write_text(json.dumps({"config": nested(values), "n_samples": len(rows),
                                                "environment": {"git_commit": "abc1234"}}))


def _render(key, tmp_path, results):
    assert main(["render", key, "--results", str(results), "--rows", str(tmp_path / "rows"),
                 "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "figures" / f"{key}.png").exists()
    return (tmp_path / "out" / "tables" / f"{key}.md").read_text()


def test_niah_renderers_on_synthetic_rows(tmp_path):
    results = tmp_path / "runs"
    for key in ("ltri.fig1-2", "ltri.table1", "ltri.fig8"):
        impl = catalogue.get(key).impl
        for c in expand(impl.sweeps["embedded"], [], impl.label):
            inject = c.values.get("method.evidence") == "inject"
            rows = [{"params": {"depth": d}, "metrics": {"accuracy": float(inject or d < 50)},
                     "attended": {"needle_recall": {"0": [0.5, 1.0], "1": [1.0 if d < 50 else 0.0] * 2}}}
                    for d in (10, 30, 50, 70, 90) for _ in range(6)]
            _write_run(results, c.values, rows)
    md = _render("ltri.fig1-2", tmp_path, results)
    assert "successful (n=48)" in md and "failed (n=72)" in md and "| 1 | 1.00 | 0.00 |" in md
    md = _render("ltri.table1", tmp_path, results)
    assert "| 2048 | 18 | 18 | 30 |" in md and "| all | 72 | 72 | 120 |" in md and "| 5 (En) | 894 | 773 |" in md
    md = _render("ltri.fig8", tmp_path, results)
    assert "StreamingLLM, InfLLM's window" in md and "40 [" in md


def test_ruler_and_infinitebench_renderers(tmp_path):
    results = tmp_path / "runs"
    for key in ("ltri.table3", "ltri.table2"):
        impl = catalogue.get(key).impl
        for c in expand(impl.sweeps["embedded"], [], impl.label):
            if c.values["method"] != "minference":
                _write_run(results, c.values, [{"params": {}, "metrics": {"score": 0.5}}] * 4)
    md = _render("ltri.table3", tmp_path, results)
    assert "| Ltri-LLM |" in md and "50" in md and "(66.7)" in md
    assert "Δ(" in _render("ltri.fig9", tmp_path, results)
    assert "(85.7)" in _render("ltri.table8", tmp_path, results)     # paper's Ltri-LLM cells beside ours
    md = _render("ltri.table2", tmp_path, results)
    assert "no data: En.Sum" in md and "(64.0)" in md


def test_table4_from_benchmark_json(tmp_path):
    """Each file scaled by its own layers; a λ row is 4 layers at λ=20 (the 1-layer file without
    first_layers=0 measures layer 0, a λ=20 layer) + 28 at λ (its own file, first_layers=0)."""
    impl = catalogue.get("ltri.table4").impl
    bench = tmp_path / "bench"
    bench.mkdir()
    per = {"full": 131072 * 2 * 2, "infllm": 8192 // 2, "ltri": 64, "ltri3": 32, "ltri10": 16, "streaming_llm": 0}
    files = [((("full", {"name": "full"}), ("infllm", {"name": "infllm"})), 2), ((("ltri", {"name": "ltri"}),), 1),
             ((("ltri3", {"name": "ltri", "first_layers": 0}),), 1),
             ((("ltri10", {"name": "ltri", "lam": 10, "first_layers": 0}),), 1),
             ((("streaming_llm", {"name": "streaming_llm", "sink": 128, "window": 4096}),), 2)]
    assert len(files) == len(impl.bench.files)
    for f, (specs, layers) in zip(impl.bench.files, files):
        rows = [{"method": spec["name"], "spec": spec, "context": ctx, "decode_ms_median": 1.5,
                 "device_bytes_allocated": 10 ** 6 + per[key] * ctx}
                for key, spec in specs for ctx in (4224, 102400, 204800)]
        (bench / f.name).write_text(json.dumps({"command": f.command, "commit": "abc1234", "layers": layers,
                                                "device": "NVIDIA H100", "rows": rows}))
    assert main(["render", "ltri.table4", "--bench", str(bench), "--out", str(tmp_path / "out")]) == 0
    md = (tmp_path / "out" / "tables" / "ltri.table4.md").read_text()
    gib = (102400 - 4224) / 2 ** 30
    want = 131072 * 4 * gib
    assert f"{want:.2f}" in md and f"{want * 16:.2f} (23.34)" in md   # latency tables: 4 significant digits
    x32 = md.split("### x 32 layers")[1].split("###")[0]
    assert f"{(4 * 64 + 28 * 32) * gib:.3f} (0.027)" in x32 and f"{(4 * 64 + 28 * 16) * gib:.3f} (0.012)" in x32
    assert "layers 0-3" not in x32 and "layers 0-3 (λ=20) | " + f"{64 * gib:.3f}" in md
    assert "| StreamingLLM (128 sinks + 4096 window) | 0.000" in x32


def test_ablation_fig14_keeps_each_cap_apart(tmp_path):
    """Fig. 14's table is keyed by (M, lambda): the capped runs (M=5, with the base run as lambda 3) and the
    embedded profile's uncapped lambda sweep (M=32) are separate series, not averaged into one lambda row."""
    results = tmp_path / "runs"
    impl = catalogue.get("ltri.fig10-14").impl
    cells = expand(impl.sweeps["embedded"], [], impl.label)
    assert sum(c.values.get("method.max_vectors") == 32 for c in cells) == 8      # lambda 3..10 uncapped
    for c in cells:
        m, lam = c.values["method.max_vectors"], c.values.get("method.lam", 3)
        vpb = {"4": min(m, 32 - 2 * lam), "5": min(m, 30 - 2 * lam)}
        _write_run(results, c.values, [{"params": {}, "metrics": {"accuracy": 1.0},
                                        "attended": {"vectors_per_block": vpb}}] * 3)
    md = _render("ltri.fig10-14", tmp_path, results)
    assert "| 5 | 3 | 5.00 |" in md and "| 5 | 10 | 5.00 |" in md
    assert "| 32 | 3 | 25.00 |" in md and "| 32 | 10 | 11.00 |" in md
    assert "lambda=10, M=32" in md and "lambda=10, M=5" in md
