"""LongBench task: bundled official config, prompt construction, truncation, chat rules, Quest tail."""
from __future__ import annotations

import hashlib
import json

import pytest
from omegaconf import OmegaConf

import tasks
from common.errors import ConfigError
from tasks import longbench as lb
from tasks.base import ModelSpec

ROW = {"input": "Who wrote the letter?", "context": "Alice wrote a letter to Bob. " * 5,
       "answers": ["Alice"], "length": 30, "dataset": "qasper", "language": "en",
       "all_classes": None, "_id": "id0"}


def make(tmp_path, tok, rows=None, chat=True, max_length=8000, **over):
    rows = rows or {"qasper": [ROW]}
    for subset, rs in rows.items():
        (tmp_path / f"{subset}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rs))
    cfg = OmegaConf.merge(OmegaConf.load("conf/task/longbench.yaml"),
                          {"subsets": list(rows), "data_dir": str(tmp_path), **over})
    return tasks.build(cfg, tok, ModelSpec("smol", max_length, chat, []))


# sha256 of THUDM/LongBench @ 2e00731f LongBench/config/<name> (MIT), the files tasks/longbench_config/ copies
UPSTREAM_SHA256 = {"dataset2prompt.json": "56d22ad4f382169c2b8a11ff4c982a4a1bea096c8152b0f0b85b64686b157c30",
                   "dataset2maxlen.json": "72966b3c0933e214591637fb085798c5e687ebff4ddaab5d99bbc31120532022"}


def test_bundled_config_equals_the_official_files():
    for name, digest in UPSTREAM_SHA256.items():
        assert hashlib.sha256((lb.CONFIG_DIR / name).read_bytes()).hexdigest() == digest


def test_official_config_content():
    prompts, maxlen = lb.official_config()
    assert len(prompts) == len(maxlen) == 21 and set(prompts) == set(lb.ALL)
    assert "asconcisely" in prompts["narrativeqa"]
    assert maxlen["qmsum"] == 512 and maxlen["hotpotqa"] == 32
    assert lb.PRESETS["cascade6"] == ["narrativeqa", "hotpotqa", "qasper", "multi_news", "2wikimqa",
                                      "gov_report"]
    assert len(lb.PRESETS["tidal8"]) == 8 and len(lb.PRESETS["en16"]) == 16


def test_prompt_byte_identical_raw(tmp_path, smol_tokenizer):
    t = make(tmp_path, smol_tokenizer, chat_template="never")
    text, _, chat = t.prompt_text("qasper", ROW)
    expected = (
        "You are given a scientific article and a question. Answer the question as concisely as you "
        "can, using a single phrase or sentence if possible. If the question cannot be answered based "
        "on the information in the article, write \"unanswerable\". If the question is a yes/no "
        "question, answer \"yes\", \"no\", or \"unanswerable\". Do not provide any explanation.\n\n"
        "Article: " + ROW["context"] + "\n\n Answer the question based on the above article as "
        "concisely as you can, using a single phrase or sentence if possible. If the question cannot "
        "be answered based on the information in the article, write \"unanswerable\". If the "
        "question is a yes/no question, answer \"yes\", \"no\", or \"unanswerable\". Do not provide "
        "any explanation.\n\nQuestion: Who wrote the letter?\n\nAnswer:")
    assert text == expected and not chat
    s = next(iter(t.samples()))
    assert s.input_ids == smol_tokenizer(expected)["input_ids"]
    assert smol_tokenizer.decode(s.input_ids) == expected
    assert s.max_new_tokens == 128 and s.decode_tail == 0 and s.references == ["Alice"]
    assert s.id == "qasper/id0" and s.params["subset"] == "qasper" and not s.params["truncated"]


def test_chat_rules(tmp_path, smol_tokenizer):
    rows = {"qasper": [ROW], "triviaqa": [dict(ROW, dataset="triviaqa")]}
    t = make(tmp_path, smol_tokenizer, rows=rows)                       # auto, instruct model
    s_qa, s_tq = list(t.samples())
    wrapped = smol_tokenizer.apply_chat_template(
        [{"role": "user", "content": t.prompts["qasper"].format(**ROW)}], tokenize=False,
        add_generation_prompt=True)
    assert smol_tokenizer.decode(s_qa.input_ids) == wrapped and s_qa.params["chat_template"]
    assert not s_tq.params["chat_template"]                             # no-chat subset
    assert smol_tokenizer.decode(s_tq.input_ids) == t.prompts["triviaqa"].format(**ROW)
    base = make(tmp_path, smol_tokenizer, rows=rows, chat=False)        # auto, base model
    assert not next(iter(base.samples())).params["chat_template"]
    forced = make(tmp_path, smol_tokenizer, rows=rows, chat=False, chat_template="always")
    assert [s.params["chat_template"] for s in forced.samples()] == [True, False]


def test_middle_truncation_keeps_both_halves(tmp_path, smol_tokenizer):
    long_row = dict(ROW, context=" ".join(f"w{i}" for i in range(3000)))
    t = make(tmp_path, smol_tokenizer, rows={"qasper": [long_row]}, chat_template="never",
             max_length=1000)
    full = t.prompts["qasper"].format(**long_row)
    ids = smol_tokenizer(full)["input_ids"]
    text, n_full, _ = t.prompt_text("qasper", long_row)
    head = smol_tokenizer.decode(ids[:500], skip_special_tokens=True)
    tail = smol_tokenizer.decode(ids[-500:], skip_special_tokens=True)
    assert n_full == len(ids) > 1000 and text == head + tail
    assert text.startswith("You are given a scientific article") and text.endswith("\n\nAnswer:")
    assert "w0 w1 w2" in text and "w2999" in text and " w1500 " not in text
    s = next(iter(t.samples()))
    assert s.params["truncated"] and abs(len(s.input_ids) - 1000) <= 4
    # per-subset override (TidalDecode's narrativeqa 28000)
    t2 = make(tmp_path, smol_tokenizer, rows={"qasper": [long_row]}, chat_template="never",
              max_length=1000, max_length_overrides={"qasper": 600})
    assert abs(len(next(iter(t2.samples())).input_ids) - 600) <= 4


def test_quest_decode_tail(tmp_path, smol_tokenizer):
    rows = {"qasper": [ROW], "qmsum": [dict(ROW, dataset="qmsum")]}
    t = make(tmp_path, smol_tokenizer, rows=rows, chat_template="never", decode_tail="quest")
    s_qa, s_qm = list(t.samples())
    tail = smol_tokenizer.decode(s_qa.input_ids[-s_qa.decode_tail:])
    assert tail == "Question: Who wrote the letter?\n\nAnswer:"      # last "Question:" < 100 chars
    text = t.prompts["qmsum"].format(**ROW)
    tail_qm = smol_tokenizer.decode(s_qm.input_ids[-s_qm.decode_tail:])
    assert tail_qm == text[-100:]                                       # no split key: 100 chars
    head = smol_tokenizer(text[:-100])["input_ids"]
    assert s_qm.input_ids[: len(head)] == head                          # head and tail tokenized apart
    fixed = make(tmp_path, smol_tokenizer, rows=rows, chat_template="never", decode_tail=7)
    assert next(iter(fixed.samples())).decode_tail == 7


def test_scoring_and_summary(tmp_path, smol_tokenizer):
    rows = {"qasper": [ROW, dict(ROW, _id="id1")], "triviaqa": [dict(ROW, dataset="triviaqa")]}
    t = make(tmp_path, smol_tokenizer, rows=rows)
    s1, s2, s3 = list(t.samples())
    assert t.score(s1, "Alice") == {"score": 1.0}
    assert t.score(s3, "\nBob\nAlice") == {"score": 0.0}                # first-line rule
    out = t.summarize([{"params": s.params, "metrics": {"score": v}}
                       for s, v in zip((s1, s2, s3), (1.0, 0.0, 1 / 3))])
    assert out["by_subset"]["qasper"] == {"n": 2, "score": 50.0}
    assert out["by_subset"]["triviaqa"]["score"] == 33.33 and out["average"] == round((50.0 + 33.33) / 2, 2)
    assert out["by_category"] == {"single_doc_qa": 50.0, "few_shot": 33.33}
    assert t.describe()["chat_template"] == "auto"
    assert [s.id for s in make(tmp_path, smol_tokenizer, rows=rows, limit_per_subset=1).samples()] \
        == ["qasper/id0", "triviaqa/id0"]
    # task.limit takes the subsets in turn, and the average names what it averages
    assert [s.id for s in make(tmp_path, smol_tokenizer, rows=rows, limit=2).limited()] == ["qasper/id0", "triviaqa/id0"]
    assert out["average_of"] == "qasper (n=2), triviaqa (n=1): 2 of 2 subtasks"


def test_longbench_e_buckets(tmp_path, smol_tokenizer):
    (tmp_path / "qasper_e.jsonl").write_text(json.dumps(ROW) + "\n")
    cfg = OmegaConf.merge(OmegaConf.load("conf/task/longbench.yaml"),
                          {"subsets": "qasper", "data_dir": str(tmp_path), "longbench_e": True})
    t = tasks.build(cfg, smol_tokenizer, ModelSpec("smol", 8000, True, []))
    rows = [{"params": {"subset": "qasper", "length": n}, "metrics": {"score": v}}
            for n, v in ((100, 1.0), (5000, 0.0), (9000, 0.5))]
    assert t.summarize(rows)["by_subset"]["qasper"]["buckets"] == {"0-4k": 100.0, "4-8k": 0.0,
                                                                   "8k+": 50.0}


@pytest.mark.parametrize("over, msg", [
    ({"subsets": "nope"}, "unknown LongBench subset"),
    ({"chat_template": "sometimes"}, "chat_template"),
    ({"decode_tail": "tidal"}, "decode_tail"),
    ({"code_sim_backend": "x"}, "code_sim_backend"),
    ({"subsets": "hotpotqa"}, "lacks hotpotqa.jsonl"),
    ({"subsets": "musique", "longbench_e": True}, "LongBench-E has no subset"),
])
def test_validation_errors(tmp_path, smol_tokenizer, over, msg):
    with pytest.raises(ConfigError, match=msg):
        make(tmp_path, smol_tokenizer, **over)
