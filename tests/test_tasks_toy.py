"""A new task is its generator, its scorer and its options: this toy key-value lookup (the synthetic
task of issue 37, whose hand-copied `validate` and colliding name no test caught) is declared here and
goes through the shared suite (tests/test_tasks_conformance.py) unchanged. Nothing here is registered,
so the real registry and conf/task/ stay as they are."""
from __future__ import annotations

import random
import uuid
from dataclasses import dataclass

import pytest
from test_tasks_conformance import (
    check_bad_options,
    check_names,
    check_same_seed,
    check_samples,
    check_scorer,
    check_yaml,
)

import tasks
from common.options import option
from tasks.base import Sample, Task
from tasks.config import TaskConfig


@dataclass(frozen=True)
class KVLookupConfig(TaskConfig):
    """Toy key-value lookup: `pairs` random UUID pairs as JSON, the value of one key asked for, exact
    match of the value in the output."""

    seed: int = option(7, "")
    pairs: int = option(200, "key-value pairs in the prompt", min=2)
    samples: int = option(10, "prompts, each with its own pairs and target", min=1)
    position: str = option("random", "where the asked key sits: random | first | last",
                           choices=("random", "first", "last"))
    max_new_tokens: int = option(40, "", min=1)

    @classmethod
    def smoke(cls) -> dict:
        return {"pairs": 8, "samples": 3}


class KVLookup(Task):
    name = "kv_lookup"
    Config = KVLookupConfig
    metric = "exact"

    def samples(self):
        for i in range(int(self.cfg.samples)):
            rng = random.Random(int(self.cfg.seed) * 1000 + i)
            kv = [(str(uuid.UUID(int=rng.getrandbits(128))), str(uuid.UUID(int=rng.getrandbits(128))))
                  for _ in range(int(self.cfg.pairs))]
            at = {"first": 0, "last": len(kv) - 1}.get(self.cfg.position, rng.randrange(len(kv)))
            text = "{" + ", ".join(f'"{k}": "{v}"' for k, v in kv) + "}\nThe value of key " + kv[at][0] + " is"
            yield Sample(id=f"kv/{i}", input_ids=self.bos() + self.encode(text), references=[kv[at][1]],
                         params={"pairs": len(kv), "index": at}, max_new_tokens=int(self.cfg.max_new_tokens))

    def score(self, sample, prediction):
        return {"exact": float(sample.references[0] in prediction)}


@pytest.fixture(scope="module")
def tok(smol_tokenizer):
    return smol_tokenizer


@pytest.mark.parametrize("check", [check_samples, check_scorer, check_bad_options, check_same_seed])
def test_toy_task_passes_the_shared_suite(check, tok, tmp_path):
    check(KVLookup, tok, tmp_path)


def test_toy_task_yaml_and_name(tmp_path):
    check_yaml(KVLookup, tmp_path)
    check_names([*(tasks.get(n) for n in tasks.REGISTRY.names()), KVLookup])


def test_the_suite_catches_a_colliding_name_and_a_wrong_scorer(tok, tmp_path):
    """The suite can fail: the issue's collision (a task named like InfiniteBench's kv_retrieval
    subset), and a scorer that calls every output right."""
    clash = type("Clash", (KVLookup,), {"name": "kv_retrieval"})
    with pytest.raises(AssertionError, match="kv_retrieval"):
        check_names([*(tasks.get(n) for n in tasks.REGISTRY.names()), clash])
    lenient = type("Lenient", (KVLookup,), {"score": lambda self, s, p: {"exact": 1.0}})
    with pytest.raises(AssertionError, match="wrong output"):
        check_scorer(lenient, tok, tmp_path)
