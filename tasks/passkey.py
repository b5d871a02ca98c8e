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

from common.errors import ConfigError
from tasks import metrics
from tasks.base import Sample, Task, register

DESCRIPTION = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
               "I will quiz you about the important information there.")
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = "What is the pass key? The pass key is"


@register
class Passkey(Task):
    name = "passkey"

    @classmethod
    def validate(cls, cfg, model):
        super().validate(cfg, model)
        for length in cfg.lengths:
            if model.too_long(int(length) + int(cfg.max_new_tokens)):
                raise ConfigError(f"task.lengths: {length} + {cfg.max_new_tokens} new tokens exceeds "
                                  f"{model.name}'s maximum of {model.max_length} tokens")
        for d in cfg.depths:
            if not 0.0 <= float(d) <= 1.0:
                raise ConfigError(f"task.depths must be fractions in [0, 1], got {d}")

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
