"""PG-19 perplexity in the two protocols the target papers use (harnesses.md 2.1, methods.md 1.2/6.4).

`protocol: decode` (Quest `evaluation/pg19/ppl_eval.py`, TidalDecode `experiments/ppl/ppl.py`, from
streaming-llm `eval_long_ppl.py`): the first `books` book(s) (null = 1, as the scripts hard-code), the first
`num_eval_tokens` (TidalDecode 32000, Quest 30000) predictions, every token fed one at a time through
the decode path. PPL = exp(mean NLL).

`protocol: stride` (Cascading KV Cache `cascade/main/jobs/pg19.py`): every book with more than
`min_book_tokens` tokens (the paper keeps books longer than the cache window), each streamed in chunks
of `stride` tokens (cascade_stride 1024) through the prefill path against the method's cache.
PPL = exp(total NLL / total predicted tokens) over all books (token-weighted), per-book PPL too.
`books` (null = all) caps the number of qualifying books.

Books are tokenized with the tokenizer's default call (BOS added where the tokenizer adds one), as the
reference scripts do. `max_tokens` caps every book's evaluated ids (the embedded model has 8K context);
the `min_book_tokens` filter looks at the whole book, as the reference stats file does.
Data: `emozilla/pg19-test` (split test, field `text`) or `data_dir`: a directory of `*.txt` books
(sorted by file name) or a `.jsonl` file with `text` (optionally `book_id`, `short_book_title`,
`pg19_split`; `only_split` keeps rows of one split), read from `FILE.xz` when stored so
(tasks/datafiles.py): the repository ships the 4 test books in data/pg19_books/pg19_books.jsonl.
"""
from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from common.errors import ConfigError
from common.options import option
from tasks import datafiles, hub_data
from tasks.base import Sample, Task, register
from tasks.config import TaskConfig

PROTOCOLS = ("decode", "stride")


def load_books(cfg) -> Iterator[dict[str, Any]]:
    """Yield {book_id, title, text} lazily, in dataset order (the decode protocol takes the first)."""
    data_dir = cfg.get("data_dir")
    only_split = cfg.get("only_split")
    if data_dir:
        path = datafiles.resolve(data_dir)
        if path.is_dir():
            files = sorted(path.glob("*.txt"))
            if not files:
                raise ConfigError(f"task.data_dir {path} has no *.txt books (or pass a .jsonl file)")
            for f in files:
                yield {"book_id": f.stem, "title": f.stem, "text": f.read_text(encoding="utf-8")}
            return
        if datafiles.is_file(path) and datafiles.plain_name(path).endswith(".jsonl"):
            with datafiles.open_text(path) as fh:
                for i, line in enumerate(fh):
                    row = json.loads(line)
                    if only_split and row.get("pg19_split") != only_split:
                        continue
                    yield {"book_id": str(row.get("book_id", i)),
                           "title": row.get("short_book_title", str(row.get("book_id", i))),
                           "text": row["text"]}
            return
        raise ConfigError(f"task.data_dir {path} is neither a directory of *.txt nor a .jsonl file")
    ds = hub_data.load(cfg.get("hub_id", "emozilla/pg19-test"), split=cfg.get("split", "test"),
                       fix="set task.data_dir to a .jsonl of books (fields text, book_id) or a folder of *.txt")
    for i, row in enumerate(ds):
        title = row.get("short_book_title") or f"book{i}"
        yield {"book_id": str(i), "title": title, "text": row["text"]}


@dataclass(frozen=True)
class PG19Config(TaskConfig):
    """PG-19 perplexity (tasks/pg19.py). Two protocols:
      decode: Quest/TidalDecode/Tactic - first book, first num_eval_tokens predictions, token by token
      stride: Cascading KV Cache - every book longer than min_book_tokens, chunks of `stride` tokens"""

    seed: int = option(0, "unused (deterministic data); kept for the common task keys")
    protocol: str = option("decode", "decode | stride", choices=PROTOCOLS)
    num_eval_tokens: int = option(32000, "decode protocol: TidalDecode 32000, Quest 30000", min=1)
    books: int | None = option(None, "null = protocol default (decode: 1 book, stride: all qualifying books)",
                               min=1)
    stride: int | None = option(1024, "stride protocol: chunk length (Cascading cascade_stride)", min=1)
    min_book_tokens: int = option(32768, "stride protocol: keep books with more tokens (the paper: > cache "
                                  "window)", min=0)
    max_tokens: int | None = option(None, "cap on evaluated ids per book (embedded profile: the model's 8K "
                                    "context)", min=1)
    curve_window: int | None = option(None, "if set: metrics.nll_curve = mean NLL per window of this many "
                                      "predictions", min=1)
    hub_id: str = option("emozilla/pg19-test", "")
    split: str = option("test", "")
    data_dir: str | None = option(None, "directory of *.txt books or a .jsonl with `text`")
    only_split: str | None = option(None, "jsonl only: keep rows whose pg19_split equals this (e.g. test)")

    @classmethod
    def smoke(cls) -> dict:
        return {"num_eval_tokens": 200}


@register
class PG19(Task):
    name = "pg19"
    Config = PG19Config
    metric = "ppl"
    metric_range = (float("inf"), 1.0)
    mode = "nll"

    @classmethod
    def validate(cls, cfg, model) -> None:
        super().validate(cfg, model)
        protocol = cfg.get("protocol", "decode")   # protocol, ranges: the typed options (PG19Config)
        if protocol == "stride" and cfg.get("stride") is None:
            raise ConfigError("task.stride must be set for protocol=stride (Cascading uses 1024)")

    # samples ------------------------------------------------------------------------------------
    def _cap(self) -> int | None:
        """Number of input ids kept per book (None = whole book)."""
        caps = []
        if self.cfg.get("protocol", "decode") == "decode" and self.cfg.get("num_eval_tokens") is not None:
            caps.append(int(self.cfg.num_eval_tokens) + 1)     # N predictions need N+1 ids
        if self.cfg.get("max_tokens") is not None:
            caps.append(int(self.cfg.max_tokens))
        return min(caps) if caps else None

    def samples(self):
        protocol = self.cfg.get("protocol", "decode")
        cap = self._cap()
        books = self.cfg.get("books")
        if books is None and protocol == "decode":
            books = 1                          # Quest/TidalDecode evaluate the first book only
        min_tokens = int(self.cfg.get("min_book_tokens") or 0)
        taken = 0
        for book in load_books(self.cfg):
            if protocol == "decode" and books is not None and taken >= int(books):
                return
            ids = self.tokenizer(book["text"])["input_ids"]           # default call: BOS as the scripts
            if protocol == "stride" and len(ids) <= min_tokens:
                continue
            if protocol == "stride" and books is not None and taken >= int(books):
                return
            taken += 1
            eval_ids = ids[:cap] if cap else ids
            if len(eval_ids) < 2:
                continue
            yield Sample(
                id=f"book-{book['book_id']}",
                input_ids=list(eval_ids),
                params={"book_id": book["book_id"], "title": book["title"], "book_tokens": len(ids),
                        "eval_tokens": len(eval_ids) - 1, "protocol": protocol,
                        "stride": int(self.cfg.stride) if protocol == "stride" else None},
                max_new_tokens=0,
                nll_mode=protocol,
                stride=int(self.cfg.stride) if protocol == "stride" else None,
            )

    # scoring ------------------------------------------------------------------------------------
    def score_nll(self, sample: Sample, nll) -> dict[str, float]:
        total = float(nll.double().sum()) if hasattr(nll, "double") else float(sum(nll))
        n = int(nll.numel()) if hasattr(nll, "numel") else len(nll)
        out = {"nll_sum": total, "tokens": n, "ppl": math.exp(total / n) if n else float("nan")}
        w = self.cfg.get("curve_window")
        if w:   # mean NLL of each window of w predictions along the book (Cascading Fig. 7's curves)
            vals = [float(x) for x in nll]
            out["nll_curve"] = [round(sum(vals[i:i + int(w)]) / len(vals[i:i + int(w)]), 4)
                                for i in range(0, len(vals), int(w))]
        return out

    def summarize(self, rows: list[dict]) -> dict[str, Any]:
        return summarize_ppl(rows)

    def describe(self) -> dict[str, Any]:
        protocol = self.cfg.get("protocol", "decode")
        out = {"task": self.name, "protocol": protocol, "max_tokens": self.cfg.get("max_tokens"),
               "tokenization": "tokenizer default call (special tokens as the tokenizer adds them)",
               "data": self.cfg.get("data_dir") or self.cfg.get("hub_id", "emozilla/pg19-test"),
               "aggregation": "token_weighted: exp(sum NLL / sum tokens) over books"}
        if protocol == "decode":
            out.update(num_eval_tokens=self.cfg.get("num_eval_tokens"), books=self.cfg.get("books"),
                       reference="Quest ppl_eval.py / TidalDecode ppl.py (token-by-token decode)")
        else:
            out.update(stride=self.cfg.get("stride"), min_book_tokens=self.cfg.get("min_book_tokens"),
                       reference="Cascading KV Cache jobs/pg19.py (strided prefill)")
        return out


def summarize_ppl(rows: list[dict]) -> dict[str, Any]:
    """Token-weighted PPL over books (Cascading's nll-total / count-total; for one book it equals
    the decode protocol's exp(mean NLL)), the unweighted mean of per-book PPLs, and per-book PPL."""
    if not rows:
        return {"n": 0}
    nll_total = sum(float(r["metrics"]["nll_sum"]) for r in rows)
    count_total = sum(int(r["metrics"]["tokens"]) for r in rows)
    per_book = {str(r["params"].get("book_id", i)): float(r["metrics"]["ppl"]) for i, r in enumerate(rows)}
    return {
        "n": len(rows),
        "ppl": math.exp(nll_total / count_total) if count_total else float("nan"),
        "nll_mean": nll_total / count_total if count_total else float("nan"),
        "tokens": count_total,
        "book_mean_ppl": sum(per_book.values()) / len(per_book),
        "by_book": per_book,
    }
