"""PG-19 side by side with full attention: the method and a dense reference engine run the same tokens
(Tactic sec. 4.2.2, Figs. 9-10; also what the method's diagnostics read for Figs. 1, 3, 5, 7, 8).

`protocol: kl` (Fig. 9): the first `prefix` tokens of a text are prefilled (the paper: 32K), then the
`steps` following tokens of the text (64) are fed one at a time to both engines; each step's next-token
distributions give KL(full || method) = cross-entropy(full, method) - entropy(full), the paper's
definition. Metrics: the mean over the steps (`kl`), the last step's (`kl_last`) and the largest.
`protocol: match` (Fig. 10): the same prefill, then greedy decoding (maximum probability) by each
engine on its own; `match_len` = tokens generated before the first one that differs from full
attention's, at most `steps` (128 in the paper); no stop tokens.

Texts: PG-19 books (tasks/pg19.py's sources: hub `emozilla/pg19-test` or `data_dir`) with more than
`min_book_tokens` tokens (null = prefix + steps; the paper: "all texts with more than 32k tokens"),
each tokenized whole with the tokenizer's default call. `windows` > 1 cuts more disjoint windows from
a long book (each after the first starts with the tokenizer's BOS), for more samples on a small model;
`books` (null = all) caps the number of books. A sample's ids are the window: prefix + steps tokens
(kl) or the prefix alone (match).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from common.errors import ConfigError
from common.options import option
from tasks.base import Sample, Task, mean_metrics, register
from tasks.config import TaskConfig
from tasks.pg19 import load_books

PROTOCOLS = ("kl", "match")


@dataclass(frozen=True)
class PG19CompareConfig(TaskConfig):
    """PG-19 side by side with full attention (tasks/pg19_compare.py; Tactic Figs. 9-10):
      kl:    prefill `prefix` tokens, feed the next `steps` text tokens to both engines, KL(full || method)
      match: same prefill, greedy decoding by each engine, tokens before the first difference"""

    seed: int = option(0, "unused (deterministic data); kept for the common task keys")
    protocol: str = option("kl", "kl | match", choices=PROTOCOLS)
    prefix: int = option(32768, "prefilled tokens (paper: inputs truncated to 32K)", min=1)
    steps: int = option(64, "kl: decode steps (paper 64); match: the longest match counted (paper 128)", min=1)
    windows: int = option(1, "disjoint windows per book (1 = the paper: the start of each text)", min=1)
    books: int | None = option(None, "cap on books (null = every book longer than min_book_tokens)", min=1)
    min_book_tokens: int | None = option(None, "keep books with more tokens (null = prefix + steps)", min=1)
    hub_id: str = option("emozilla/pg19-test", "")
    split: str = option("test", "")
    data_dir: str | None = option(None, "directory of *.txt books or a .jsonl with `text`")
    only_split: str | None = option(None, "jsonl only: keep rows whose pg19_split equals this (e.g. test)")

    @classmethod
    def smoke(cls) -> dict:
        return {"prefix": 64, "steps": 4}


@register
class PG19Compare(Task):
    name = "pg19_compare"
    Config = PG19CompareConfig
    metric = "kl"
    metric_range = (float("inf"), 0.0)

    def perfect(self, sample: Sample) -> dict:
        steps = int(sample.params["steps"])
        return {"kl": [0.0] * steps} if sample.params["protocol"] == "kl" else {"match_len": steps}
    mode = "compare"

    @classmethod
    def validate(cls, cfg, model) -> None:
        super().validate(cfg, model)
        need = int(cfg.prefix) + int(cfg.steps)
        if need > model.positions:
            raise ConfigError(f"task.prefix + task.steps = {need} exceeds the model's {model.positions} positions")

    def samples(self):
        c = self.cfg
        prefix, steps = int(c.prefix), int(c.steps)
        protocol = c.get("protocol", "kl")
        need = prefix + steps if protocol == "kl" else prefix     # match: the continuation is generated
        floor = int(c.get("min_book_tokens") or prefix + steps)
        windows = int(c.get("windows") or 1)
        books = c.get("books")
        taken = 0
        bos = self.bos()
        for book in load_books(c):
            if books is not None and taken >= int(books):
                return
            ids = self.tokenizer(book["text"])["input_ids"]
            if len(ids) <= floor or len(ids) < need:
                continue
            taken += 1
            for w in range(windows):
                if w == 0:
                    window, offset = ids[:need], 0
                else:
                    offset = w * need
                    window = bos + ids[offset:offset + need - len(bos)]
                if len(window) < need:
                    break
                yield Sample(id=f"book-{book['book_id']}-w{w}", input_ids=list(window),
                             params={"book_id": book["book_id"], "title": book["title"], "book_tokens": len(ids),
                                     "window": w, "offset": offset, "prefix": prefix, "steps": steps,
                                     "protocol": protocol},
                             max_new_tokens=steps if protocol == "match" else 0)

    def score_compare(self, sample: Sample, result: dict) -> dict[str, float]:
        """Metrics of one sample from tasks/compare.py's result for it."""
        if "kl" in result:
            kl = result["kl"]
            return {"kl": sum(kl) / len(kl), "kl_last": kl[-1], "kl_max": max(kl), "steps": len(kl)}
        return {"match_len": result["match_len"], "match_all": float(result["match_len"] == sample.params["steps"])}

    def summarize(self, rows: list[dict]) -> dict[str, Any]:
        return mean_metrics(rows, [])

    def describe(self) -> dict[str, Any]:
        c = self.cfg
        return {"task": self.name, "protocol": c.get("protocol", "kl"), "prefix": int(c.prefix),
                "steps": int(c.steps), "windows": int(c.get("windows") or 1),
                "data": c.get("data_dir") or c.get("hub_id", "emozilla/pg19-test"),
                "reference": "full attention on the same tokens (a second engine on the same model)",
                "kl": "KL(full || method) of next-token distributions, teacher forced, mean over steps",
                "match": "greedy tokens before the first difference from full attention"}
