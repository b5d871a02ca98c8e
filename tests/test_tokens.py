"""Special tokens of prompts (tasks/_tokens.py) for tokenizers that add BOS, EOS, both or neither,
through every task with its own BOS logic; samsum's stop token through the run loop."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

import tasks
from runners import batch as batch_module
from tasks import longbench as lb
from tasks._infinitebench_prompts import TEMPLATES
from tasks._tokens import bos_ids, encode_prompt, special_affixes
from tasks.base import ModelSpec, Sample, Task
from tasks.infinitebench import format_prompt
from tests.tiny_tokenizers import BOS, EOS, ids_of, with_specials

ROOT = Path(__file__).resolve().parents[1]
KINDS = {"eos": (False, True), "bos_eos": (True, True), "bos": (True, False), "none": (False, False)}


@pytest.fixture(scope="module", params=list(KINDS))
def tok(request, smol_tokenizer):
    t = with_specials(smol_tokenizer, *KINDS[request.param])
    t.kind = request.param
    return t


def expected_affixes(t):
    bos, eos = KINDS[t.kind]
    return (ids_of(t, BOS) if bos else []), (ids_of(t, EOS) if eos else [])


def test_affixes_located_not_guessed_from_lengths(tok):
    pre, suf = expected_affixes(tok)
    assert special_affixes(tok) == (pre, suf)
    assert bos_ids(tok) == lb.bos_ids(tok) == pre
    assert Task(OmegaConf.create({}), tok, ModelSpec("m", 100)).bos() == pre
    hello = tok("Hello world", add_special_tokens=False)["input_ids"]
    assert hello[0] != tok("a", add_special_tokens=False)["input_ids"][0]
    # pred.py / InfiniteBench feed tokenizer(prompt): the prompt is exactly that, never "a" + text
    assert encode_prompt(tok, "Hello world") == lb.encode_prompt(tok, "Hello world") == pre + hello + suf
    assert encode_prompt(tok, "Hello world") == tok("Hello world")["input_ids"]
    # a continuation (Quest tail) loses only the real BOS
    assert encode_prompt(tok, "Hello world", prefix=False) == hello + suf


def test_no_second_bos_after_a_chat_template_that_writes_it(smol_tokenizer):
    t = with_specials(smol_tokenizer, bos=True, eos=True)
    text = BOS + "Hello world"
    assert t(text)["input_ids"][:2] == ids_of(t, BOS, BOS)               # what tokenizer() would do
    assert encode_prompt(t, text) == ids_of(t, BOS) + t("Hello world", add_special_tokens=False)["input_ids"] \
        + ids_of(t, EOS)


ROW = {"input": "Who wrote the letter?", "context": "Alice wrote a letter to Bob. " * 5,
       "answers": ["Alice"], "length": 30, "dataset": "qasper", "language": "en",
       "all_classes": None, "_id": "id0"}


def longbench(tmp_path, t, subsets=("qasper",), **over):
    for s in subsets:
        (tmp_path / f"{s}.jsonl").write_text(json.dumps(dict(ROW, dataset=s)) + "\n")
    cfg = OmegaConf.merge(OmegaConf.load(ROOT / "conf/task/longbench.yaml"),
                          {"subsets": list(subsets), "data_dir": str(tmp_path), "chat_template": "never", **over})
    return tasks.build(cfg, t, ModelSpec("m", 8000, False, []))


def test_longbench_prompt_is_pred_py_tokenization(tmp_path, tok):
    t = longbench(tmp_path, tok)
    s = next(iter(t.samples()))
    assert s.input_ids == tok(t.prompts["qasper"].format(**ROW))["input_ids"]
    q = next(iter(longbench(tmp_path, tok, decode_tail="quest").samples()))
    pre, suf = expected_affixes(tok)
    text = t.prompts["qasper"].format(**ROW)
    cut = text.rfind("Question:")
    assert q.input_ids == tok(text[:cut])["input_ids"] + tok(text[cut:], add_special_tokens=False)["input_ids"] + suf
    assert q.input_ids[:len(pre)] == pre and q.decode_tail == len(tok(text[cut:])["input_ids"]) - len(pre)


def test_infinitebench_prompt_is_the_scripts_tokenization(tmp_path, tok):
    row = {"id": 0, "context": "noise " * 50, "input": "What is the pass key?", "answer": ["12345"], "options": []}
    (tmp_path / "passkey.jsonl").write_text(json.dumps(row) + "\n")
    cfg = OmegaConf.merge(OmegaConf.load(ROOT / "conf/task/infinitebench.yaml"),
                          {"subsets": "passkey", "data_dir": str(tmp_path), "chat_template": "never"})
    t = tasks.build(cfg, tok, ModelSpec("m", 8192, False, []))
    s = next(iter(t.samples()))
    assert s.input_ids == tok(format_prompt("passkey", row, TEMPLATES["yarn_mistral"]["passkey"]))["input_ids"]


def test_passkey_niah_ruler_start_with_the_real_bos_only(tok):
    from tasks.niah import NIAH
    from tasks.passkey import Passkey

    pre, _ = expected_affixes(tok)
    cfg = OmegaConf.load(ROOT / "conf/task/passkey.yaml")
    cfg.lengths, cfg.depths, cfg.repeats = [300], [0.5], 1
    s = next(iter(Passkey(cfg, tok, ModelSpec("m", 7500)).samples()))
    desc = tok("There is an important info", add_special_tokens=False)["input_ids"]
    assert s.input_ids[:len(pre) + len(desc)] == pre + desc and len(s.input_ids) == 300
    ncfg = OmegaConf.load(ROOT / "conf/task/niah.yaml")
    ncfg.lengths, ncfg.depths, ncfg.rounds, ncfg.haystack = [400], [50], 1, "noise"
    n = next(iter(NIAH(ncfg, tok, ModelSpec("m", 7500)).samples()))
    head = tok("Write a high-quality answer", add_special_tokens=False)["input_ids"]
    assert n.input_ids[:len(pre) + len(head)] == pre + head
    rcfg = OmegaConf.load(ROOT / "conf/task/ruler.yaml")
    rcfg.tasks, rcfg.lengths, rcfg.samples_per_task, rcfg.template = ["niah_single_1"], [512], 1, "base"
    r = tasks.build(rcfg, tok, ModelSpec("m", 8192, False))._sample("niah_single_1", 512, 0)
    some = tok("Some special magic", add_special_tokens=False)["input_ids"]
    a = tok("A special magic", add_special_tokens=False)["input_ids"]
    assert r.input_ids[:len(pre) + len(a)] == pre + a and r.input_ids[:len(pre) + len(some)] != pre + some


def test_samsum_stops_at_the_newline_token_as_pred_py(tmp_path, smol_tokenizer):
    t = longbench(tmp_path, smol_tokenizer, subsets=("samsum", "trec"))
    samsum, trec = list(t.samples())
    newline = smol_tokenizer.encode("\n", add_special_tokens=False)[-1]      # pred.py's extra eos id
    assert samsum.stop_ids == [newline] and trec.stop_ids == []
    assert "stop_strings" not in samsum.extra
    assert lb.stop_token_ids(smol_tokenizer, [".\n"]) == [smol_tokenizer.encode(".\n", add_special_tokens=False)[-1]]


def test_run_loop_unions_task_stop_ids_with_the_models(monkeypatch):
    seen = []

    class Engine:
        method = SimpleNamespace(stats=dict, cfg=SimpleNamespace(max_context=lambda info: info.max_position))

        def generate(self, ids, max_new_tokens, stop_ids, **kw):
            seen.append(sorted(stop_ids))
            return SimpleNamespace(tokens=[[5]] * ids.shape[0], stop_reason=["stop"] * ids.shape[0],
                                   timings=SimpleNamespace())

    task = SimpleNamespace(mode="generate", score=lambda s, text: {})
    tok = SimpleNamespace(decode=lambda ids, skip_special_tokens: "x")
    info = SimpleNamespace(max_position=100)
    a = Sample(id="a", input_ids=[1, 2], stop_ids=[13])
    b = Sample(id="b", input_ids=[1, 2])
    assert [[s.id for s in g] for g in batch_module.batches([a, b], 8)] == [["a"], ["b"]]   # not batched together
    list(batch_module.run_batch(Engine(), task, [a], tok, [0, 2], info))
    list(batch_module.run_batch(Engine(), task, [b], tok, [0, 2], info))
    assert seen == [[0, 2, 13], [0, 2]]
