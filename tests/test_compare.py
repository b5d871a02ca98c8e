"""Compare mode (tasks/compare.py, tasks/pg19_compare.py; Tactic Figs. 9-10): the method beside a
dense reference engine on the same tokens. Full against full must give KL 0 and a match of every
step; a method that equals full attention (Tactic at P = 100%) too; a truncating method must not."""
from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf
from test_methods_common import one_thread, tiny_model  # noqa: F401

from methods import ModelInfo, build
from runners.batch import method_metrics, reference_for, run_batch
from runners.engine import Engine
from tasks.base import Sample
from tasks.compare import compare, kl_full_vs_method


def _engine(model, **cfg):
    return Engine(model, build(OmegaConf.create(cfg), ModelInfo.from_hf_config(model.config)))


def test_kl_is_cross_entropy_minus_entropy():
    lf, lm = torch.randn(3, 11), torch.randn(3, 11)
    p, q = torch.softmax(lf, -1), torch.softmax(lm, -1)
    expected = (p * (p.log() - q.log())).sum(-1)
    assert torch.allclose(kl_full_vs_method(lf, lm), expected, atol=1e-6)
    assert kl_full_vs_method(lf, lf).abs().max() < 1e-6


@pytest.mark.parametrize("cfg", [{"name": "full"}, {"name": "tactic", "target": 1.0, "cluster_size": 4}])
def test_methods_equal_to_full_have_zero_kl_and_match_every_step(cfg):
    model = tiny_model(4)
    engine = _engine(model, **cfg)
    ids = torch.randint(0, 128, (2, 48), generator=torch.Generator().manual_seed(1))
    kl = compare(engine, reference_for(engine), ids, "kl", prefix=40, steps=8)
    assert len(kl) == 2 and all(len(r["kl"]) == 8 for r in kl)
    assert max(max(r["kl"]) for r in kl) < 1e-5
    match = compare(engine, reference_for(engine), ids[:, :40], "match", prefix=40, steps=8)
    assert [r["match_len"] for r in match] == [8, 8]
    assert reference_for(engine) is reference_for(engine)          # built once per engine


def test_a_truncating_method_diverges():
    model = tiny_model(4)
    engine = _engine(model, name="streaming_llm", budget=8)
    ids = torch.randint(0, 128, (1, 48), generator=torch.Generator().manual_seed(2))
    kl = compare(engine, reference_for(engine), ids, "kl", prefix=40, steps=8)[0]["kl"]
    assert min(kl) > 0 and max(kl) > 1e-4


class _Task:
    mode = "compare"

    def score_compare(self, sample, result):
        return {"kl": sum(result["kl"]) / len(result["kl"])} if "kl" in result else {"match_len": result["match_len"]}


def test_run_batch_dispatches_compare_and_keeps_the_method_metrics():
    """The shared batch runner hands compare-mode tasks to tasks/compare.py; the method's
    `sample_metrics` (Tactic: attended tokens, mass diagnostics) become `method_*` row metrics."""
    model = tiny_model(4)
    engine = _engine(model, name="tactic", target=0.8, cluster_size=4, exact_head=4, fit_window=2, diagnostics=True)
    info = ModelInfo.from_hf_config(model.config)
    ids = torch.randint(0, 128, (48,), generator=torch.Generator().manual_seed(3)).tolist()
    batch = [Sample(id="s0", input_ids=ids, params={"protocol": "kl", "prefix": 40, "steps": 8}, max_new_tokens=0)]
    rows = list(run_batch(engine, _Task(), batch, None, [], info))
    assert len(rows) == 1 and rows[0]["id"] == "s0" and len(rows[0]["compare"]["kl"]) == 8
    m = rows[0]["metrics"]
    assert m["kl"] > 0 and 0 < m["method_attended"] < 48
    assert 0 < m["method_mass_obtained"] <= 1 and m["method_mass_target"] == 0.8
    assert method_metrics(engine.method) == {k: v for k, v in m.items() if k.startswith("method_")}


def test_pg19_compare_windows(smol_tokenizer, repo_data):
    import tasks
    from tasks.base import ModelSpec

    path = repo_data / "pg19_books" / "pg19_books.jsonl"       # stored as .jsonl.xz
    cfg = OmegaConf.load("conf/task/pg19_compare.yaml")
    cfg = OmegaConf.merge(cfg, {"data_dir": str(path), "prefix": 256, "steps": 16, "windows": 2, "books": 2})
    spec = ModelSpec(name="smollm2", max_length=8192)
    tasks.get("pg19_compare").validate(cfg, spec)
    task = tasks.build(cfg, smol_tokenizer, spec)
    samples = list(task.samples())
    assert len(samples) == 4 and all(len(s.input_ids) == 272 for s in samples)
    bos = task.bos()                      # what the tokenizer's default call puts first ([] for SmolLM2)
    assert samples[1].params["offset"] == 272 and samples[1].input_ids[:len(bos)] == bos
    assert samples[0].input_ids[:len(bos)] == bos and samples[0].params["window"] == 0
    match = OmegaConf.merge(cfg, {"protocol": "match", "books": 1, "windows": 1})
    (s,) = tasks.build(match, smol_tokenizer, spec).samples()
    assert len(s.input_ids) == 256 and s.max_new_tokens == 16
    with pytest.raises(Exception, match="task.protocol"):
        tasks.get("pg19_compare").validate(OmegaConf.merge(cfg, {"protocol": "both"}), spec)
