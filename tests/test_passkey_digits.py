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
    assert c.max_new_tokens == 50 and c.template == "auto"


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
    task = build(smol_tokenizer, template="llama31_raw")
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
    again = list(build(smol_tokenizer, template="llama31_raw").limited())
    assert [s.input_ids for s in again] == [s.input_ids for s in samples]
    other = list(build(smol_tokenizer, template="llama31_raw", seed=7).limited())
    assert [s.references for s in other] != [s.references for s in samples]
    # a length's samples do not depend on the other configured lengths
    only = list(build(smol_tokenizer, template="llama31_raw", lengths=[2048]).limited())
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


def llama3_like(tok):
    """The SmolLM2 tokenizer with the Llama-3.1 markup tokens added as special tokens."""
    import copy

    tok = copy.deepcopy(tok)
    tok.add_special_tokens({"additional_special_tokens": list(pk.LLAMA31_TOKENS)})
    return tok


def test_auto_template_is_the_models_own_markup(smol_tokenizer):
    # On SmolLM2 the reference's Llama-3.1 strings are plain text, and HF generate itself scores ~0 on
    # them (notes/passkey_digits_check.md): the default must render the model's chat template instead.
    task = build(smol_tokenizer, lengths=[1024], samples_per_bin=1)
    assert task.template() == "chat" and task.describe()["template"] == "chat"
    text = smol_tokenizer.decode(next(iter(task.limited())).input_ids)
    assert text.startswith("<|im_start|>system\n" + pk.SYSTEM) and "<|start_header_id|>" not in text
    assert text.endswith("<|im_start|>assistant\n" + pk.ANSWER_PREFIX)
    # a Llama-3 vocabulary keeps the reference's strings verbatim, each marker one special token
    llama = llama3_like(smol_tokenizer)
    task = build(llama, lengths=[1024], samples_per_bin=1)
    assert task.template() == "llama31_raw" and task.describe()["template"] == "llama31_raw"
    ids = next(iter(task.limited())).input_ids
    assert ids[0] == llama.convert_tokens_to_ids("<|begin_of_text|>") and llama.decode(ids).startswith(REF_PREFIX)
    # explicit settings are kept; auto without either markup is one ConfigError
    assert build(smol_tokenizer, template="llama31_raw").template() == "llama31_raw"
    assert build(llama, template="chat").template() == "chat"
    no_chat = tasks.build(cfg(), smol_tokenizer, ModelSpec(name="base", max_length=8192, chat_template=False))
    with pytest.raises(ConfigError, match="template=auto"):
        next(iter(no_chat.limited()))


@pytest.mark.slow
def test_embedded_model_finds_a_1k_key_as_hf_generate_does(smol_model):
    """The default protocol on the embedded model: our engine's greedy tokens equal HF `generate`'s on
    a 1K sample, and both read the key (digit accuracy 1). Under the raw Llama-3.1 strings both output
    "The pass key is $:" on this sample (accuracy 0): that was the 0 of issue 9."""
    import torch

    from methods import ModelInfo, build as build_method
    from runners.engine import Engine

    model, tok = smol_model
    task = build(tok, lengths=[1024], samples_per_bin=1)
    s = next(iter(task.limited()))                      # 1024-0.2-0, key 64110
    ids = torch.tensor([s.input_ids])
    stop = sorted({tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")})
    ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=s.max_new_tokens,
                         do_sample=False, eos_token_id=stop, pad_token_id=stop[0])[0, ids.shape[1]:].tolist()
    eng = Engine(model, build_method(OmegaConf.create({"name": "full"}), ModelInfo.from_hf_config(model.config)))
    got = eng.generate(ids, max_new_tokens=s.max_new_tokens, stop_ids=stop).tokens[0]
    assert got == [t for t in ref if t not in stop]
    assert task.score(s, tok.decode(got, skip_special_tokens=True))["digit_acc"] == 1.0


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
