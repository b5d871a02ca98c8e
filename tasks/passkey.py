"""Passkey retrieval, Landmark-attention / Quest style (epfml/landmark-attention run_test.py,
mit-han-lab/Quest evaluation/passkey/passkey.py).

The prompt is: task description, filler, the pass-key line, more filler, the question, joined by
newlines; the filler is the "grass is green" text repeated. Lengths are exact, in tokens of the
model's tokenizer (the original counted characters, ~4 per token): the pieces are tokenized once
and the filler token stream is cut to fit. Depth is the fraction of filler before the key (Quest
sweeps 100 // iterations * (i + 1) percent). Score: the first integer in the output equals the key.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from common.errors import ConfigError
from common.options import option
from tasks import metrics
from tasks.base import Sample, Task, register
from tasks.config import TaskConfig

DESCRIPTION = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
               "I will quiz you about the important information there.")
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = "What is the pass key? The pass key is"


@dataclass(frozen=True)
class PasskeyConfig(TaskConfig):
    """Landmark-attention / Quest passkey: "grass is green" filler, integer key in [1, 50000], exact match
    of the first integer in the output. Lengths are in tokens of the model's tokenizer."""

    seed: int = option(42, "")
    lengths: tuple[int, ...] = option((2048, 4096), "prompt tokens, exact")
    depths: tuple[float, ...] = option((0.2, 0.4, 0.6, 0.8, 1.0), "Quest: depth = 100 // iterations * (i + 1) percent",
                                 min=0.0, max=1.0)
    repeats: int = option(1, "samples per (length, depth), each with its own key", min=1)
    max_new_tokens: int = option(10, "", min=1)
    decode_tail: int = option(100, "Quest decodes the last 400 characters (~100 tokens) one by one", min=0)

    @classmethod
    def smoke(cls) -> dict:
        return {"lengths": [256], "depths": [0.5, 1.0]}


@register
class Passkey(Task):
    name = "passkey"
    Config = PasskeyConfig
    metric = "accuracy"

    @classmethod
    def validate(cls, cfg, model):
        super().validate(cfg, model)
        for length in cfg.lengths:
            if model.too_long(int(length) + int(cfg.max_new_tokens)):
                raise ConfigError(f"task.lengths: {length} + {cfg.max_new_tokens} new tokens exceeds "
                                  f"{model.name}'s maximum of {model.max_length} tokens")

    def __init__(self, cfg, tokenizer, model):
        super().__init__(cfg, tokenizer, model)
        self._head = self.bos() + self.encode(DESCRIPTION + "\n")
        self._question = self.encode("\n" + QUESTION)
        longest = max(int(n) for n in cfg.lengths)
        # Tokenize many repeats at once so the stream has the merges real text would have (joined
        # repeats can take fewer tokens than one repeat times n: grow until it covers `longest`).
        reps = longest // max(len(self.encode(FILLER + " ")), 1) + 2
        self._filler = self.encode(" ".join([FILLER] * reps))
        while len(self._filler) < longest:
            reps *= 2
            self._filler = self.encode(" ".join([FILLER] * reps))

    def samples(self):
        rng = random.Random(int(self.cfg.seed))
        for length in self.cfg.lengths:
            for depth in self.cfg.depths:
                for r in range(int(self.cfg.repeats)):
                    key = rng.randint(1, 50000)
                    yield self._sample(int(length), float(depth), r, key)

    def _sample(self, length: int, depth: float, repeat: int, key: int) -> Sample:
        needle = self.encode("\n" + NEEDLE.format(key=key) + "\n")
        n_filler = length - len(self._head) - len(needle) - len(self._question)
        if n_filler <= 0:
            raise ConfigError(f"task.lengths: {length} tokens is too short for the passkey prompt")
        before = round(depth * n_filler)
        ids = (self._head + self._filler[:before] + needle + self._filler[: n_filler - before]
               + self._question)
        assert len(ids) == length
        return Sample(
            id=f"len{length}-depth{depth:g}-r{repeat}",
            input_ids=ids,
            references=[str(key)],
            params={"length": length, "depth": depth, "repeat": repeat},
            max_new_tokens=int(self.cfg.max_new_tokens),
            decode_tail=int(self.cfg.decode_tail),
        )

    def score(self, sample, prediction):
        return {"accuracy": metrics.passkey_exact(prediction, int(sample.references[0]))}

    def group_by(self):
        return ["length", "depth"]

    def describe(self):
        return {"task": self.name, "protocol": "landmark/quest", "scorer": "first integer == key",
                "decode_tail": int(self.cfg.decode_tail)}
