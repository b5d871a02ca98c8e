"""Cascading passkey: verbatim prompt pieces, exact lengths, seeded samples, digit-accuracy scorer."""
from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

import tasks
from common.errors import ConfigError
from tasks import passkey_digits as pk
from tasks.base import ModelSpec, mean_metrics
from tasks.metrics import passkey_digit_accuracy

ROOT = Path(__file__).resolve().parents[1]
SPEC = ModelSpec(name="smol", max_length=8192)

# Verbatim from jeffwillette/cascading_kv_cache cascade/dataset/passkey.py (harnesses.md 2.3)
REF_PREFIX = ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December"
              " 2023\nToday Date: 26 Jul 2024\n\nThere is a 5-digit pass key hidden in a lot of irrelevant text."
              " Find the pass key and memorize it. You will have to repeat the pass key<|eot_id|>"
              "<|start_header_id|>user<|end_header_id|>\n\n")
REF_QUERY = ("\n\nSo now, I will ask the question. What is the five digit pass key?<|eot_id|><|start_header_id|>"
             "system<|end_header_id|>\n\nI surely remember the five digit pass key. The pass key is $:\n")
REF_KEYLINE = ("HERE IS THE PASSKEY! The pass key is 12345. 12345 is the pass key. **the pass key is 12345** "
               "LOOK BEHIND FOR PASSKEY")


def cfg(**kw):
    c = OmegaConf.load(ROOT / "conf/task/passkey_digits.yaml")
    c.lengths, c.samples_per_bin = [1024, 2048], 2
    for k, v in kw.items():
        c[k] = v
    return c


def build(tok, **kw):
    return tasks.build(cfg(**kw), tok, SPEC)


def test_yaml_defaults():
    c = OmegaConf.load(ROOT / "conf/task/passkey_digits.yaml")
    assert c.name == "passkey_digits" and c.limit is None and "seed" in c
    assert list(c.lengths) == [32768 * 2 ** i for i in range(6)]
    assert list(c.bins) == [0.2, 0.4, 0.6, 0.8, 1.0] and c.samples_per_bin == 20
    assert c.max_new_tokens == 50 and c.template == "llama31_raw"


def test_reference_strings_verbatim():
    assert pk.PREFIX == REF_PREFIX and pk.QUERY == REF_QUERY
    assert pk.key_block(12345) == (f"=== NOW IMPORTANT INFORMATION STARTS ===\n{REF_KEYLINE}\nREPEAT THE "
                                   f"INFORMATION\n{REF_KEYLINE}\n=== IMPORTANT INFORMATION STOPS ===")


def test_word_list_from_wonderwords():
    words = pk.word_list()
    assert len(words) > 5000 and all(" " not in w for w in words)
    assert pk.filler_text(50, 1) == pk.filler_text(50, 1) != pk.filler_text(50, 2)
    assert pk.filler_text(100, 1).startswith(pk.filler_text(50, 1))   # prefix-stable stream


def test_samples_lengths_bins_and_reproducible(smol_tokenizer):
    task = build(smol_tokenizer)
    samples = list(task.limited())
    assert len(samples) == 2 * 5 * 2
    prefix = task.encode(REF_PREFIX)
    query = task.encode(REF_QUERY)
    for s in samples:
        L = s.params["length"]
        assert abs(len(s.input_ids) - L) <= 0.01 * L               # exact by construction
        assert s.input_ids[: len(prefix)] == prefix and s.input_ids[-len(query):] == query
        k = s.references[0]
        assert len(k) == 5 and 10000 <= int(k) < 100000
        key = task.encode(pk.key_block(int(k)))
        pos = s.params["insert_pos"]
        assert s.input_ids[pos: pos + len(key)] == key                # the key block sits at insert_pos
        lo, hi = s.params["bin"] - 0.2, s.params["bin"]
        assert max(len(prefix), int(lo * L)) <= pos - len(prefix) < int(hi * L) or hi == 1.0
        assert s.max_new_tokens == 50 and s.temperature == 0.0
        assert s.params["len_bin"] == f"{L}-{s.params['bin']:g}"
    again = list(build(smol_tokenizer).limited())
    assert [s.input_ids for s in again] == [s.input_ids for s in samples]
    other = list(build(smol_tokenizer, seed=7).limited())
    assert [s.references for s in other] != [s.references for s in samples]
    # a length's samples do not depend on the other configured lengths
    only = list(build(smol_tokenizer, lengths=[2048]).limited())
    assert [s.input_ids for s in only] == [s.input_ids for s in samples if s.params["length"] == 2048]


def test_chat_template_variant(smol_tokenizer):
    task = build(smol_tokenizer, template="chat", lengths=[1024], samples_per_bin=1)
    s = next(iter(task.limited()))
    text = smol_tokenizer.decode(s.input_ids)
    head = smol_tokenizer.apply_chat_template(
        [{"role": "system", "content": pk.SYSTEM}, {"role": "user", "content": "X"}],
        tokenize=False, add_generation_prompt=True).split("X")[0]
    assert text.startswith(head)
    assert text.endswith(pk.QUESTION + "<|im_end|>\n<|im_start|>assistant\n" + pk.ANSWER_PREFIX)
    assert len(s.input_ids) == 1024
    assert task.describe()["template"] == "chat"


def test_validate(smol_tokenizer):
    cls = tasks.get("passkey_digits")
    with pytest.raises(ConfigError, match="exceed"):
        cls.validate(OmegaConf.load(ROOT / "conf/task/passkey_digits.yaml"), SPEC)   # 32K..1M > 8K
    with pytest.raises(ConfigError):
        cls.validate(cfg(template="llama2"), SPEC)
    with pytest.raises(ConfigError):
        cls.validate(cfg(template="chat"), ModelSpec(name="base", max_length=8192, chat_template=False))
    with pytest.raises(ConfigError):
        cls.validate(cfg(bins=[0.5, 0.4]), SPEC)


def test_digit_accuracy_known_answers():
    assert passkey_digit_accuracy("The pass key is 12345.", "12345") == 1.0
    assert passkey_digit_accuracy("$:\n12345 is it, 99999", "12345") == 1.0   # first 5 digits only
    assert passkey_digit_accuracy("1 2", "12345") == pytest.approx(0.4)      # "12AAA": padded with A
    assert passkey_digit_accuracy("", "12345") == 0.0
    assert passkey_digit_accuracy("no digits", "12345") == 0.0
    assert passkey_digit_accuracy("02345", "12345") == pytest.approx(0.8)    # positionwise
    assert passkey_digit_accuracy("2345", "12345") == 0.0                    # shifted: no credit
    assert passkey_digit_accuracy("1-2-3-4-5", "12345") == 1.0
    # get_numbers keeps what str.isdigit() accepts: "²" and full-width digits take positions
    assert passkey_digit_accuracy("²12345", "12345") == 0.0                 # "²1234" vs "12345"
    assert passkey_digit_accuracy("1²345", "12345") == pytest.approx(0.8)   # "²" holds the 2nd position
    assert passkey_digit_accuracy("１２３４５", "12345") == 0.0               # full-width != ASCII
    assert passkey_digit_accuracy("12３45", "12345") == pytest.approx(0.8)


def test_score_and_aggregate_per_length_bin(smol_tokenizer):
    task = build(smol_tokenizer, lengths=[1024], samples_per_bin=2)
    samples = list(task.limited())
    rows = []
    for i, s in enumerate(samples):
        pred = s.references[0] if i % 2 == 0 else s.references[0][:3]      # 100% and 60%
        rows.append({"params": s.params, "metrics": task.score(s, pred)})
    out = mean_metrics(rows, task.group_by())
    assert out["digit_acc"] == pytest.approx(0.8)
    assert set(out["by_len_bin"]) == {f"1024-{b:g}" for b in [0.2, 0.4, 0.6, 0.8, 1.0]}
    assert all(v["digit_acc"] == pytest.approx(0.8) for v in out["by_len_bin"].values())
