"""Cascading KV Cache passkey, 32K..1M tokens, scored by digit accuracy (harnesses.md 2.3).

Reference: jeffwillette/cascading_kv_cache `cascade/dataset/passkey.py` + `cascade/main/jobs/passkey.py`.
Prompt = PREFIX + filler[:p] + key block + filler[p:] + QUERY, assembled from separately tokenized
pieces so every prompt has exactly `length` tokens. The filler is random dictionary words joined by
spaces, tokenized once and sliced; the reference draws 1M words from `/usr/share/dict/words`, we draw
from wonderwords' bundled noun/adjective/verb lists (a PyPI package, so no system word list is needed).
Per (length, bin) `samples_per_bin` samples (reference 20) with key k ~ U[10000, 100000) and insert index
~ U[max(prefix_len, lo*L), hi*L) into the filler (the reference indexes the filler, not the prompt,
so the absolute position is prefix_len later, and bin 1.0 can clamp to just before the query; kept).
Greedy, 50 new tokens. Score: `metrics.passkey_digit_accuracy`, aggregated per "{length}-{bin}".

`template: llama31_raw` uses the reference's hard-coded Llama-3.1 strings verbatim (correct only for a
Llama-3 tokenizer; elsewhere the markup is plain text: on SmolLM2-135M HF `generate` itself then scores
0.0/0.1/0.0 at 1K/2K/4K, against 0.4/0.5/0.0 with `chat`, notes/passkey_digits_check.md). `template:
auto` (the default) takes `llama31_raw` when the tokenizer has the Llama-3.1 header tokens as special
tokens and `chat` otherwise, i.e. the model's own chat markup, which is what the reference's strings are
for its Llama-3.1; the resolved template is recorded in every row (`describe`). `template: chat` renders the same system
instruction and question through the tokenizer's chat template and appends the reference's answer
prefix after the generation prompt (the reference puts it under a `system` header; we use the template's
assistant turn). `reference_bos: true` tokenizes each piece with the tokenizer's default special tokens,
as the reference did (on Llama-3 that puts a BOS at the start of every piece, prefix included twice).
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np

from common.errors import ConfigError
from common.options import option
from tasks.base import Sample, Task, register
from tasks.config import TaskConfig
from tasks.metrics import passkey_digit_accuracy

SYSTEM = ("There is a 5-digit pass key hidden in a lot of irrelevant text. Find the pass key and memorize "
          "it. You will have to repeat the pass key")
PREFIX = ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: "
          "December 2023\nToday Date: 26 Jul 2024\n\n" + SYSTEM
          + "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n")
QUESTION = "\n\nSo now, I will ask the question. What is the five digit pass key?"
ANSWER_PREFIX = "I surely remember the five digit pass key. The pass key is $:\n"
QUERY = QUESTION + "<|eot_id|><|start_header_id|>system<|end_header_id|>\n\n" + ANSWER_PREFIX
TEMPLATES = ("auto", "llama31_raw", "chat")
LLAMA31_TOKENS = ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
WORD_LISTS = ("nounlist.txt", "adjectivelist.txt", "verblist.txt")   # wonderwords assets, no profanity


def key_block(k: int) -> str:
    keyline = (f"HERE IS THE PASSKEY! The pass key is {k}. {k} is the pass key. **the pass key is {k}** "
               "LOOK BEHIND FOR PASSKEY")
    return (f"=== NOW IMPORTANT INFORMATION STARTS ===\n{keyline}\nREPEAT THE INFORMATION\n{keyline}\n"
            "=== IMPORTANT INFORMATION STOPS ===")


def word_list() -> list[str]:
    """English words from wonderwords' bundled lists (multi-word entries dropped), deduplicated and
    sorted so the draw depends only on the seed (and the wonderwords version, recorded in rows)."""
    assets = resources.files("wonderwords") / "assets"
    words: set[str] = set()
    for name in WORD_LISTS:
        words.update(w.strip() for w in (assets / name).read_text(encoding="utf-8").splitlines())
    return sorted(w for w in words if w and not any(c.isspace() for c in w))   # single words, as dict/words


def filler_text(n_words: int, seed: int) -> str:
    rng = random.Random(seed)
    words = word_list()
    return " ".join(rng.choice(words) for _ in range(n_words))


def bin_edges(bins: list[float]) -> list[tuple[float, float]]:
    """Bin i spans (previous upper edge, bins[i]]: {0.2, ..., 1.0} -> the reference's (loc-0.2, loc)."""
    edges, lo = [], 0.0
    for hi in bins:
        edges.append((lo, float(hi)))
        lo = float(hi)
    return edges


@dataclass(frozen=True)
class PasskeyDigitsConfig(TaskConfig):
    """Cascading KV Cache passkey (tasks/passkey_digits.py): random-word filler, 5-digit key,
    5 depth bins x samples_per_bin per length, greedy 50 tokens, digit accuracy per "{length}-{bin}"."""

    seed: int = option(42, "")
    lengths: tuple[int, ...] = option((32768, 65536, 131072, 262144, 524288, 1048576), "the paper's \"1M\" set")
    bins: tuple[float, ...] = option((0.2, 0.4, 0.6, 0.8, 1.0), "bin upper edges; bin i spans (bins[i-1], bins[i]] "
                               "of the length", min=0.0, max=1.0)
    samples_per_bin: int = option(20, "", min=1)
    max_new_tokens: int = option(50, "", min=1)
    template: str = option("auto", "auto: llama31_raw on a Llama-3 vocab, else chat | llama31_raw (reference "
                           "strings verbatim; plain text elsewhere) | chat (tokenizer template)", choices=TEMPLATES)
    reference_bos: bool = option(False, "true: tokenize each piece with default special tokens, as the reference")

    @classmethod
    def smoke(cls) -> dict:
        return {"lengths": [512], "samples_per_bin": 1}


@register
class PasskeyDigits(Task):
    name = "passkey_digits"
    Config = PasskeyDigitsConfig
    metric = "digit_acc"

    @classmethod
    def validate(cls, cfg, model) -> None:
        super().validate(cfg, model)
        template = cfg.get("template", "auto")
        if template == "chat" and not model.chat_template:
            raise ConfigError(f"task.template=chat but model {model.name} has no chat template")
        lengths = [int(x) for x in cfg.lengths]
        too_long = [x for x in lengths if model.too_long(x)]
        if too_long:
            raise ConfigError(f"task.lengths {too_long} exceed model {model.name} max_length "
                              f"{model.max_length}")
        new = int(cfg.get("max_new_tokens", 50))
        no_room = [x for x in lengths if model.too_long(x + new, model.positions)]
        if no_room:
            raise ConfigError(f"task.lengths {no_room} + {new} new tokens exceed the {model.positions} "
                              f"positions of model {model.name}")
        bins = [float(b) for b in cfg.bins]
        if not bins or any(b <= a for a, b in zip([0.0] + bins, bins)) or bins[-1] > 1.0:
            raise ConfigError(f"task.bins must increase within (0, 1], got {bins}")

    # template -------------------------------------------------------------------------------------
    def template(self) -> str:
        """The configured template, `auto` resolved against the tokenizer: llama31_raw only where the
        reference's markup is the model's own (its header tokens are special tokens of the vocabulary)."""
        template = self.cfg.get("template", "auto")
        if template != "auto":
            return template
        special = set(self.tokenizer.all_special_tokens) | {
            t.content for t in getattr(self.tokenizer, "added_tokens_decoder", {}).values() if t.special}
        if all(t in special for t in LLAMA31_TOKENS):
            return "llama31_raw"
        if not (self.model.chat_template and getattr(self.tokenizer, "chat_template", None)):
            raise ConfigError(f"task.template=auto: model {self.model.name} has neither the Llama-3.1 markup "
                              "tokens nor a chat template; set task.template=llama31_raw explicitly")
        return "chat"

    # tokenization ---------------------------------------------------------------------------------
    def _tok(self, text: str) -> list[int]:
        if self.cfg.get("reference_bos", False):
            return self.tokenizer(text)["input_ids"]
        return self.encode(text)

    def prompt_pieces(self) -> tuple[str, str]:
        """(prefix text, query text) for the configured template."""
        if self.template() == "llama31_raw":
            return PREFIX, QUERY
        marker = "\x00PASSKEY_CONTEXT\x00"
        rendered = self.tokenizer.apply_chat_template(
            [{"role": "system", "content": SYSTEM}, {"role": "user", "content": marker}],
            tokenize=False, add_generation_prompt=True)
        if rendered.count(marker) != 1:
            raise ConfigError("the chat template does not keep the user message verbatim")
        head, tail = rendered.split(marker)
        return head, QUESTION + tail + ANSWER_PREFIX

    def filler_ids(self, n_tokens: int) -> list[int]:
        """At least n_tokens filler ids: words are drawn from one seeded stream, so a longer filler
        starts with the same words (samples of one length do not depend on the other lengths)."""
        n_words = max(64, n_tokens)
        while True:
            ids = self._tok(filler_text(n_words, int(self.cfg.seed)))
            if len(ids) >= n_tokens:
                return ids
            n_words *= 2

    # samples ----------------------------------------------------------------------------------------
    def samples(self):
        prefix_text, query_text = self.prompt_pieces()
        prefix, query = self._tok(prefix_text), self._tok(query_text)
        lengths = [int(x) for x in self.cfg.lengths]
        filler = self.filler_ids(max(lengths) - len(prefix) - len(query))
        for length in lengths:
            n_fill = length - len(prefix) - len(query)
            if n_fill <= 0:
                raise ConfigError(f"passkey length {length} is shorter than the prompt template")
            rng = np.random.default_rng([int(self.cfg.seed), length])
            fill = filler[:n_fill]
            for lo, hi in bin_edges([float(b) for b in self.cfg.bins]):
                for i in range(int(self.cfg.samples_per_bin)):
                    k = int(rng.integers(10000, 100000))
                    key = self._tok(key_block(k))
                    local = fill[: len(fill) - len(key)]
                    start, end = max(len(prefix), int(lo * length)), int(hi * length)
                    if end <= start:
                        raise ConfigError(f"bin ({lo}, {hi}] of length {length} is inside the prefix")
                    insert = int(rng.integers(start, end))
                    ids = prefix + local[:insert] + key + local[insert:] + query
                    pos = len(prefix) + min(insert, len(local))
                    yield Sample(
                        id=f"{length}-{hi:g}-{i}",
                        input_ids=ids,
                        references=[str(k)],
                        params={"length": length, "bin": hi, "len_bin": f"{length}-{hi:g}",
                                "insert_pos": pos, "depth": pos / len(ids), "tokens": len(ids)},
                        max_new_tokens=int(self.cfg.get("max_new_tokens", 50)),
                        extra={"passkey": str(k)},
                    )

    def score(self, sample: Sample, prediction: str) -> dict[str, float]:
        return {"digit_acc": passkey_digit_accuracy(prediction, sample.references[0])}

    def group_by(self) -> list[str]:
        return ["len_bin", "length", "bin"]

    def describe(self) -> dict[str, Any]:
        from importlib.metadata import version

        return {"task": self.name, "template": self.template(),
                "reference_bos": bool(self.cfg.get("reference_bos", False)),
                "filler": f"wonderwords {version('wonderwords')} {'+'.join(WORD_LISTS)} random words",
                "scorer": "digit accuracy (first 5 digits, pad 'A'), Cascading jobs/passkey.py",
                "decoding": "greedy"}
