"""Passkey prompts: exact token lengths at every depth of the default grid, key placement, scorer."""
from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tasks import ModelSpec
from tasks.passkey import Passkey

CONF = Path(__file__).resolve().parents[1] / "conf" / "task" / "passkey.yaml"


@pytest.mark.parametrize("lengths", [None, [512, 7000]])
def test_exact_lengths_at_every_depth(smol_tokenizer, lengths):
    cfg = OmegaConf.load(CONF)
    if lengths:
        cfg.lengths = lengths
    task = Passkey(cfg, smol_tokenizer, ModelSpec("smollm2", 7500))
    samples = list(task.samples())
    assert len(samples) == len(cfg.lengths) * len(cfg.depths) * cfg.repeats
    for s in samples:
        assert len(s.input_ids) == s.params["length"], s.id
        text = smol_tokenizer.decode(s.input_ids)
        assert f"The pass key is {s.references[0]}. Remember it." in text
        assert text.rstrip().endswith("What is the pass key? The pass key is")
    assert [s.id for s in task.samples()] == [s.id for s in samples]  # seeded, reproducible


def test_scorer_takes_the_first_integer(smol_tokenizer):
    task = Passkey(OmegaConf.load(CONF), smol_tokenizer, ModelSpec("smollm2", 7500))
    s = next(iter(task.samples()))
    key = s.references[0]
    assert task.score(s, f" {key}. Remember it.")["accuracy"] == 1.0
    assert task.score(s, f" 1{key} or {key}")["accuracy"] == 0.0
    assert task.score(s, "no digits")["accuracy"] == 0.0
