"""BookSum summarization scored with ROUGE (harnesses.md 2.2, methods.md 6.4).

`variant: chapter` (default): chapter-level `kmfoda/booksum` (split test), input `chapter`, reference
`summary_text`; rows with an empty chapter or summary are dropped; a chapter with summaries from several
sources gives one row per summary, each scored on its own (`reference_mode: per_row`, recorded). There is
no official LLM prompt for it: it reuses the Cascading prompt below (`system` / `user` in the config).

`variant: cascade`: what Cascading KV Cache ran (`cascade/main/jobs/booksum.py`,
`cascade/dataset/booksum.py`): book-level BookSum from `togethercomputer/Long-Data-Collections`
`fine-tune/booksum.jsonl.zst` (fields text, prompt, completion; the job summarizes `prompt` against
`completion`, a trailing "</s>" removed), a 5 % test split (the reference used sklearn without a seed;
we draw it from `task.seed`), chat prompt system "You are a helpful chat bot that summarizes books.",
user "Summarize the following text in about 300 words:\\n{text}", greedy 512 tokens, and the generated
summary re-tokenized and cut to 256 tokens (`tokenizer(text, truncation=True, max_length=256)`, BOS
included as there) before scoring.

Scorer: Google `rouge-score` (ROUGE-1/2/L/Lsum F x100, `use_stemmer`), the de-facto Python setting.
The Cascading reference code (not its paper, which names no scorer) scored with Perl ROUGE-1.5.5 through
`pyrouge` (stemmed), which is not available offline (a Perl install plus a download). pyrouge writes one
sentence per line, so Perl's ROUGE-L is summary-level: `rougeLsum` here (newline-split sentences), not
`rougeL` (one LCS over the whole text); both are in the rows, cascade.table2's Rouge-L column reads rougeLsum.
Prompts longer than the model's `max_length - max_new_tokens` are cut inside the document (`truncation:
left` keeps the end as the reference vanilla baseline did, `right` keeps the start, `none` passes them
through for methods that stream beyond the context); the chat markup is never cut.
Data: hub by default, or `data_dir` (a .jsonl file, or a directory holding one or `<split>.jsonl`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from common.errors import ConfigError
from common.options import option
from tasks import hub_data
from tasks.base import Sample, Task, register
from tasks.config import TaskConfig
from tasks.metrics import ROUGE_TYPES, rouge_scores

VARIANTS = {
    "chapter": {"hub_id": "kmfoda/booksum", "data_files": None, "split": "test",
                "text": "chapter", "reference": "summary_text"},
    "cascade": {"hub_id": "togethercomputer/Long-Data-Collections",
                "data_files": "fine-tune/booksum.jsonl.zst", "split": "train",
                "text": "prompt", "reference": "completion"},
}
SYSTEM = "You are a helpful chat bot that summarizes books."
USER = "Summarize the following text in about 300 words:\n{text}"
TRUNCATION = ("left", "right", "none")


def _read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def load_rows(cfg, spec: dict) -> list[dict]:
    data_dir = cfg.get("data_dir")
    if data_dir:
        path = Path(str(data_dir)).expanduser()
        if path.is_file():
            return _read_jsonl(path)
        split_file = path / f"{cfg.get('split') or spec['split']}.jsonl"
        files = [split_file] if split_file.is_file() else sorted(path.glob("*.jsonl"))
        if len(files) != 1:
            raise ConfigError(f"task.data_dir {path}: expected one .jsonl (or {split_file.name}), "
                              f"found {len(files)}")
        return _read_jsonl(files[0])
    kwargs = {"data_files": spec["data_files"]} if spec["data_files"] else {}
    ds = hub_data.load(cfg.get("hub_id") or spec["hub_id"], split=cfg.get("split") or spec["split"],
                       fix="set task.data_dir to a folder with one .jsonl of the split", **kwargs)
    return [dict(r) for r in ds]


@dataclass(frozen=True)
class BookSumConfig(TaskConfig):
    """BookSum summarization, ROUGE via rouge-score (tasks/booksum.py).
      chapter: kmfoda/booksum test, chapter -> summary_text (default)
      cascade: Cascading KV Cache's book-level set (Long-Data-Collections fine-tune/booksum.jsonl.zst),
               5% seeded test split, predictions cut to 256 tokens before scoring"""

    seed: int = option(0, "cascade: seeds the 5% test split (the reference's split was unseeded)")
    variant: str = option("chapter", "chapter | cascade", choices=tuple(VARIANTS))
    max_new_tokens: int = option(512, "Cascading --max_tokens default", min=1)
    truncation: str = option("left", "left (keep the end, as the reference vanilla) | right | none (stream it "
                             "all)", choices=TRUNCATION)
    use_stemmer: bool = option(True, "rouge-score setting")
    reference_mode: str = option("per_row", "each summary row is one sample scored alone", choices=("per_row",))
    system: str | None = option(None, "null = \"You are a helpful chat bot that summarizes books.\"")
    user: str | None = option(None, "null = \"Summarize the following text in about 300 words:\\n{text}\"")
    test_fraction: float = option(0.05, "cascade only", min=0.0, max=1.0)
    score_max_tokens: int = option(256, "cascade only: predictions re-tokenized and cut before scoring", min=1)
    hub_id: str | None = option(None, "null = the variant's dataset")
    split: str | None = option(None, "null = the variant's split (chapter: test, cascade: train before the 5% "
                               "split)")
    data_dir: str | None = option(None, "a .jsonl file, or a directory with <split>.jsonl or a single .jsonl")

    @classmethod
    def smoke(cls) -> dict:
        return {"max_new_tokens": 64}


@register
class BookSum(Task):
    name = "booksum"
    Config = BookSumConfig
    metric = "rougeL"
    metric_range = (0.0, 100.0)           # rouge-score F x100

    @classmethod
    def validate(cls, cfg, model) -> None:
        super().validate(cfg, model)
        if not model.chat_template:
            raise ConfigError(f"booksum prompts through the chat template; model {model.name} has none")
        if int(cfg.max_new_tokens) >= model.max_length:
            raise ConfigError(f"task.max_new_tokens {cfg.max_new_tokens} >= model max_length")

    @property
    def variant(self) -> str:
        return self.cfg.get("variant", "chapter")

    def _examples(self) -> list[tuple[str, str, str]]:
        """(id, text, reference) in dataset order, after the variant's filtering and test split."""
        spec = VARIANTS[self.variant]
        rows = load_rows(self.cfg, spec)
        out = []
        for i, r in enumerate(rows):
            if spec["text"] not in r or spec["reference"] not in r:
                raise ConfigError(f"booksum {self.variant} rows need fields {spec['text']!r} and "
                                  f"{spec['reference']!r}; got {sorted(r)}")
            text, ref = r[spec["text"]] or "", r[spec["reference"]] or ""
            if self.variant == "cascade":
                text = text.removesuffix("</s>")                  # as jobs/booksum.py
            if not text.strip() or not ref.strip():
                continue                                          # kmfoda has empty rows
            rid = r.get("bid") if self.variant == "chapter" else None
            sid = f"{rid}-{r.get('source', '')}-{i}" if rid is not None else str(i)
            out.append((sid, text, ref))
        if self.variant == "cascade":
            frac = float(self.cfg.get("test_fraction", 0.05))
            n_test = max(1, round(len(out) * frac))
            idx = np.random.default_rng(int(self.cfg.seed)).permutation(len(out))[:n_test]
            out = [out[j] for j in sorted(idx)]
        return out

    def _prompt(self, doc_ids: list[int]) -> list[int]:
        marker = "\x00BOOKSUM_TEXT\x00"
        rendered = self.tokenizer.apply_chat_template(
            [{"role": "system", "content": self.cfg.get("system") or SYSTEM},
             {"role": "user", "content": (self.cfg.get("user") or USER).format(text=marker)}],
            tokenize=False, add_generation_prompt=True)
        head, tail = rendered.split(marker)
        return self.encode(head) + doc_ids + self.encode(tail)

    def samples(self):
        budget = self.model.max_length - int(self.cfg.max_new_tokens)
        trunc = self.cfg.get("truncation", "left")
        for sid, text, ref in self._examples():
            doc = self.encode(text)
            ids = self._prompt(doc)
            cut = 0
            if len(ids) > budget and trunc != "none":
                cut = len(ids) - budget
                if cut >= len(doc):
                    raise ConfigError(f"booksum prompt template alone exceeds {budget} tokens")
                doc = doc[cut:] if trunc == "left" else doc[: len(doc) - cut]
                ids = self._prompt(doc)
            yield Sample(
                id=sid, input_ids=ids, references=[ref],
                params={"variant": self.variant, "doc_tokens": len(doc) + cut, "truncated_tokens": cut,
                        "prompt_tokens": len(ids)},
                max_new_tokens=int(self.cfg.max_new_tokens),
            )

    def postprocess(self, prediction: str) -> str:
        """Cascading: strip a trailing "</s>", re-tokenize and cut to `score_max_tokens` tokens."""
        if self.variant != "cascade":
            return prediction
        prediction = prediction.removesuffix("</s>")
        ids = self.tokenizer(prediction.strip(), truncation=True,
                             max_length=int(self.cfg.get("score_max_tokens", 256)))["input_ids"]
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def score(self, sample: Sample, prediction: str) -> dict[str, float]:
        return rouge_scores(self.postprocess(prediction), sample.references[0], ROUGE_TYPES,
                     use_stemmer=bool(self.cfg.get("use_stemmer", True)),
                     precision_recall=self.variant == "cascade")

    def describe(self) -> dict[str, Any]:
        spec = VARIANTS[self.variant]
        out = {"task": self.name, "variant": self.variant,
               "data": self.cfg.get("data_dir") or self.cfg.get("hub_id") or spec["hub_id"],
               "scorer": f"rouge-score F x100 (use_stemmer={bool(self.cfg.get('use_stemmer', True))}); "
                         "the Cascading reference code used Perl ROUGE-1.5.5 via pyrouge, whose ROUGE-L = rougeLsum",
               "system": self.cfg.get("system") or SYSTEM, "user": self.cfg.get("user") or USER,
               "truncation": self.cfg.get("truncation", "left"), "reference_mode": "per_row",
               "decoding": "greedy"}
        if self.variant == "cascade":
            out.update(test_fraction=float(self.cfg.get("test_fraction", 0.05)),
                       score_max_tokens=int(self.cfg.get("score_max_tokens", 256)))
        return out
