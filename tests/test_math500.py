"""MATH-500 (lychee.table2's embedded stand-in): the R1 protocol of tasks/aime.py, levels filter."""
from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

import tasks
from tasks.base import ModelSpec

ROOT = Path(__file__).resolve().parents[1]


def test_math500_levels(repo_data, smol_tokenizer):
    c = OmegaConf.load(ROOT / "conf/task/math500.yaml")
    assert c.levels is None and c.max_new_tokens == 32768
    c.max_new_tokens, c.data_dir = 512, str(repo_data / "math500")
    spec = ModelSpec(name="smol", max_length=8192)
    assert len(tasks.build(c, smol_tokenizer, spec).problems()) == 500
    c.levels = [1]
    t = tasks.build(c, smol_tokenizer, spec)
    probs = t.problems()
    assert len(probs) == 43 and all(p["level"] == 1 for p in probs)
    assert probs[0]["answer"] and t.describe()["levels"] == [1] and t.describe()["problems"] == 43
    c.num_problems = 5
    assert len(tasks.build(c, smol_tokenizer, spec).problems()) == 5
