"""PG-19 perplexity task: both protocols' sample construction and token-weighted aggregation."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

import tasks
from common.errors import ConfigError
from tasks import datafiles
from tasks.base import ModelSpec
from tasks.pg19 import summarize_ppl

ROOT = Path(__file__).resolve().parents[1]
SPEC = ModelSpec(name="smol", max_length=8192)


def cfg(**kw):
    c = OmegaConf.load(ROOT / "conf/task/pg19.yaml")
    for k, v in kw.items():
        c[k] = v
    return c


def test_yaml_common_keys():
    c = cfg()
    assert c.name == "pg19" and c.limit is None and "seed" in c
    assert c.protocol == "decode" and c.num_eval_tokens == 32000 and c.stride == 1024
    assert tasks.get("pg19").mode == "nll"


def _books(repo_data) -> list[dict]:
    with datafiles.open_text(repo_data / "pg19_books" / "pg19_books.jsonl") as fh:
        return [json.loads(line) for line in fh]


def test_decode_protocol_first_book(tmp_path, repo_data, smol_tokenizer):
    books = tmp_path / "books"                                # a folder of *.txt books, sorted by name
    books.mkdir()
    for row in _books(repo_data):
        (books / f"{row['book_id']}.txt").write_text(row["text"], encoding="utf-8")
    task = tasks.build(cfg(data_dir=str(books), num_eval_tokens=1000), smol_tokenizer, SPEC)
    samples = list(task.limited())
    assert len(samples) == 1                                  # first book only (Quest/TidalDecode)
    s = samples[0]
    first = min(books.glob("*.txt"))
    assert s.id == f"book-{first.stem}"
    assert len(s.input_ids) == 1001                           # 1000 predictions
    full = smol_tokenizer(first.read_text(encoding="utf-8"))["input_ids"]
    assert s.input_ids == full[:1001] and s.params["book_tokens"] == len(full)
    assert s.nll_mode == "decode" and s.params["protocol"] == "decode" and s.params["eval_tokens"] == 1000
    assert task.describe()["protocol"] == "decode"


def test_decode_jsonl_split_and_max_tokens(repo_data, smol_tokenizer):
    path = repo_data / "pg19_books" / "pg19_books.jsonl"
    task = tasks.build(cfg(data_dir=str(path), only_split="test", num_eval_tokens=32000, max_tokens=512),
                       smol_tokenizer, SPEC)
    (s,) = list(task.limited())
    first_test = next(r for r in _books(repo_data) if r["pg19_split"] == "test")
    assert s.params["book_id"] == first_test["book_id"]
    assert len(s.input_ids) == 512                            # max_tokens caps below num_eval_tokens + 1


def test_stride_protocol_filters_books(tmp_path, repo_data, smol_tokenizer):
    text = _books(repo_data)[0]["text"]                       # 10146, the first test book
    # three "books" of very different lengths: only those above min_book_tokens are evaluated
    (tmp_path / "a.txt").write_text(text[:2000], encoding="utf-8")
    (tmp_path / "b.txt").write_text(text[:40000], encoding="utf-8")
    (tmp_path / "c.txt").write_text(text[:80000], encoding="utf-8")
    task = tasks.build(cfg(data_dir=str(tmp_path), protocol="stride", stride=256, min_book_tokens=5000,
                           max_tokens=3000), smol_tokenizer, SPEC)
    samples = list(task.limited())
    assert [s.params["book_id"] for s in samples] == ["b", "c"]
    for s in samples:
        assert s.nll_mode == "stride" and s.stride == 256 and s.params["stride"] == 256
        assert len(s.input_ids) == 3000 and s.params["book_tokens"] > 5000


def test_score_nll_and_token_weighted_summary(smol_tokenizer):
    task = tasks.build(cfg(), smol_tokenizer, SPEC)
    m = task.score_nll(None, torch.tensor([1.0, 2.0, 3.0]))
    assert m["tokens"] == 3 and m["nll_sum"] == pytest.approx(6.0) and m["ppl"] == pytest.approx(math.e ** 2)
    # book A: 100 tokens at mean NLL 1; book B: 300 tokens at mean NLL 3 -> exp((100 + 900) / 400)
    rows = [{"params": {"book_id": "A"}, "metrics": {"nll_sum": 100.0, "tokens": 100, "ppl": math.e}},
            {"params": {"book_id": "B"}, "metrics": {"nll_sum": 900.0, "tokens": 300, "ppl": math.e ** 3}}]
    out = summarize_ppl(rows)
    assert out["ppl"] == pytest.approx(math.exp(2.5))        # not the book mean exp(2) or mean of PPLs
    assert out["tokens"] == 400 and out["by_book"]["B"] == pytest.approx(math.e ** 3)
    assert out["book_mean_ppl"] == pytest.approx((math.e + math.e ** 3) / 2)
    assert task.summarize(rows)["ppl"] == out["ppl"]


def test_validate_errors():
    with pytest.raises(ConfigError):
        tasks.get("pg19").validate(cfg(protocol="sliding"), SPEC)
    with pytest.raises(ConfigError):
        tasks.get("pg19").validate(cfg(protocol="stride", stride=None), SPEC)
    with pytest.raises(ConfigError):
        tasks.get("pg19").validate(cfg(num_eval_tokens=0), SPEC)
