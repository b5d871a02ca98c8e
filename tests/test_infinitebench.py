"""InfiniteBench task: official / InfLLM prompts, truncation, labels, generated retrieval samples."""
from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

import tasks
from common.errors import ConfigError
from tasks import infinitebench as ib
from tasks._infinitebench_prompts import MAX_NEW_TOKENS, TEMPLATES
from tasks.base import ModelSpec

CHOICE = {"id": 3, "context": "Once upon a time Tom met Ann.", "input": "Who did Tom meet?",
          "answer": ["Ann"], "options": ["Bob", "Ann", "Eve", "Sam"]}
MATH = {"id": 0, "context": "[3, 9, 1]", "answer": 9, "options": [],
        "input": "Find the largest number in the list below. You should answer with only one number, "
                 "no other words. The largest number of the list is: "}


def make(tok, chat=False, max_length=8192, **over):
    cfg = OmegaConf.merge(OmegaConf.load("conf/task/infinitebench.yaml"), over)
    return tasks.build(cfg, tok, ModelSpec("smol", max_length, chat, []))


def write(tmp_path, name, rows):
    (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_templates_and_lengths():
    assert set(TEMPLATES["gpt4"]) == set(TEMPLATES["yarn_mistral"]) == set(TEMPLATES["infllm"]) \
        == set(ib.TASKS)
    assert MAX_NEW_TOKENS["official"]["passkey"] == 6 and MAX_NEW_TOKENS["official"]["math_find"] == 3
    assert MAX_NEW_TOKENS["infllm"]["longbook_sum_eng"] == 1536
    assert ib.PRESETS["cascade3"] == ["longbook_choice_eng", "longbook_qa_eng", "longbook_sum_eng"]
    assert len(ib.PRESETS["ltri10"]) == 10


def test_prompt_byte_identical(tmp_path, smol_tokenizer):
    write(tmp_path, "longbook_choice_eng", [CHOICE])
    t = make(smol_tokenizer, subsets="En.MC", data_dir=str(tmp_path), chat_template="never")
    s = next(iter(t.samples()))
    expected = ("Read the book and answer the question.\n\nOnce upon a time Tom met Ann.\n\n"
                "Question: Who did Tom meet?\nA. Bob\nB. Ann\nC. Eve\nD. Sam\n\n"
                "The letter of the correct answer is")                   # yarn_mistral (raw)
    assert smol_tokenizer.decode(s.input_ids) == expected
    assert s.extra["label"] == ["Ann", "B"] and s.max_new_tokens == 40 and s.id == "longbook_choice_eng/3"
    chat = make(smol_tokenizer, chat=True, subsets="En.MC", data_dir=str(tmp_path))
    gpt4 = ("Read the book and answer the question.\n\nOnce upon a time Tom met Ann.\n\nQuestion: "
            "Who did Tom meet?\n\nOnly one of the following options is correct, tell me the answer "
            "using one single letter (A, B, C, or D). Don't say anything else.\nA. Bob\nB. Ann\n"
            "C. Eve\nD. Sam")
    wrapped = smol_tokenizer.apply_chat_template([{"role": "user", "content": gpt4}],
                                                 tokenize=False, add_generation_prompt=True)
    assert smol_tokenizer.decode(next(iter(chat.samples())).input_ids) == wrapped
    assert chat.score(s, "B") == {"score": 1.0} and chat.score(s, "A") == {"score": 0.0}


def test_math_find_and_kv_prompts():
    assert ib.format_prompt("math_find", MATH, TEMPLATES["gpt4"]["math_find"]) == (
        "What is the largest number in the following list?\n\n[3, 9, 1]\n\n" + MATH["input"])
    assert ib.get_label("math_find", dict(MATH, answer=["9"])) == 9
    kv = {"context": "JSON data:\n{\"k-1\": \"v-1\"}", "answer": "v-1",
          "input": "Key: \"k-1\"\nThe value associated with the specified key is: "}
    assert ib.format_prompt("kv_retrieval", kv, TEMPLATES["infllm"]["kv_retrieval"]).startswith(
        "Extract the value corresponding to the specified key \"k-1\" in the JSON object below.")
    run = {"context": "def func_1(x): ...", "input": "What is func_1(-3)?", "answer": 2}
    assert "return value of func_1(-3)." in ib.format_prompt("code_run", run, TEMPLATES["gpt4"]["code_run"])


def test_official_middle_truncation(tmp_path, smol_tokenizer):
    row = {"id": 0, "context": " ".join(f"w{i}" for i in range(3000)), "input": "What is the pass key?",
           "answer": "12345", "options": []}
    write(tmp_path, "passkey", [row])
    t = make(smol_tokenizer, subsets="passkey", data_dir=str(tmp_path), max_length=1001)
    s = next(iter(t.samples()))
    prompt = ib.format_prompt("passkey", row, TEMPLATES["yarn_mistral"]["passkey"])
    ids = smol_tokenizer(prompt)["input_ids"]
    kept = ids[:500] + ids[-500:]                   # eval_yarn_mistral: split = M//2 each side (odd M)
    assert smol_tokenizer.decode(s.input_ids) == smol_tokenizer.decode(kept, skip_special_tokens=True)
    assert s.params["truncated"] and s.params["prompt_tokens_full"] == len(ids)
    assert smol_tokenizer.decode(s.input_ids).endswith("What is the pass key?\n\nThe pass key is")


def test_infllm_suffix_truncation_and_scorer(tmp_path, smol_tokenizer):
    row = {"id": 0, "context": " ".join(f"w{i}" for i in range(3000)), "input": "", "answer": ["f", "A"],
           "options": ["f", "g", "h", "i"]}
    write(tmp_path, "code_debug", [row])
    t = make(smol_tokenizer, chat=True, subsets="Code.Debug", data_dir=str(tmp_path),
             protocol="infllm", max_length=1000)
    s = next(iter(t.samples()))
    full = t.encode("code_debug", dict(row, context=row["context"]))
    assert s.max_new_tokens == 32 and len(s.input_ids) == 1000 - 32 and s.params["truncated"]
    prompt = ib.format_prompt("code_debug", row, TEMPLATES["infllm"]["code_debug"])
    ids = smol_tokenizer(smol_tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True),
        add_special_tokens=False)["input_ids"]
    assert s.input_ids == ids[:128] + ids[-(1000 - 32 - 128):] and full[1] == len(ids)
    import random
    guess = random.Random("f").choice("ABCD")
    assert t.score(s, "no idea") == {"score": float(guess == "A")}     # InfLLM Code.Debug fallback
    assert t.describe()["protocol"] == "infllm"


@pytest.mark.parametrize("task, length", [("passkey", 4096), ("number_string", 4096),
                                          ("kv_retrieval", 8192)])
def test_generated_retrieval(smol_tokenizer, task, length):
    kw = {"subsets": task, "generate": True, "gen_length": length, "gen_samples": 3, "seed": 7}
    a, b = list(make(smol_tokenizer, **kw).samples()), list(make(smol_tokenizer, **kw).samples())
    assert [s.input_ids for s in a] == [s.input_ids for s in b]          # reproducible from the seed
    assert [s.references for s in a] != [s.references for s in make(
        smol_tokenizer, **{**kw, "seed": 8}).samples()]
    for s in a:
        assert abs(len(s.input_ids) - length) <= 0.01 * length
        text = smol_tokenizer.decode(s.input_ids)
        assert s.references[0] in text and s.max_new_tokens == MAX_NEW_TOKENS["official"][task]
        assert not s.params["truncated"] and s.extra["label"] == s.references[0]
    assert [s.params["depth"] for s in a] == [0.0, 0.5, 1.0]
    key = a[1].references[0]
    assert make(smol_tokenizer, **kw).score(a[1], f"{key}.") == {"score": 1.0}
    if task == "number_string":
        assert len(key) == 10
    chat = next(iter(make(smol_tokenizer, chat=True, **{**kw, "gen_samples": 1}).samples()))
    assert abs(len(chat.input_ids) - length) <= 0.01 * length


def ref_kv_row(records, ans_id, nnoise):
    """OpenBMB/InfiniteBench data/construct_synthetic_dataset.py build_kv_retrieval, one row, transcribed
    (its random.shuffle of the records left out: `records` come in the order it would write them)."""
    text = "JSON data:\n{"
    t = -1
    for item in records:
        t += 1
        if t == nnoise:
            break
        text += "\"" + item[0] + "\": \"" + item[1] + "\", "
    text = text[:-2] + '}'
    question = "\nKey: \"" + records[ans_id][0] + "\"\nThe value associated with the specified key is: "
    return {"context": text, "input": question, "answer": records[ans_id][1]}


@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_generated_kv_row_is_the_official_construction(depth):
    import random

    rng = random.Random(3)
    pairs = [(ib._uuid(rng), ib._uuid(rng)) for _ in range(40)]
    units = 25
    ours = ib.synthetic_row("kv_retrieval", units, depth, {"pairs": pairs})
    want = ref_kv_row(pairs, round(depth * (units - 1)), units)
    assert {k: ours[k] for k in want} == want and ours["input"].startswith("\nKey: ")
    # InfLLM's kv template reads the quoted key as input[6:44], which holds only with the leading "\n"
    assert ours["input"][6:44] == f'"{pairs[round(depth * (units - 1))][0]}"'
    old = ib.synthetic_row("kv_retrieval", units, depth, {"pairs": pairs}, kv_newline=False)
    assert old["input"] == want["input"][1:] and old["context"] == want["context"]


def test_generated_kv_newline_is_the_default_and_recorded(smol_tokenizer):
    kw = {"subsets": "kv_retrieval", "generate": True, "gen_length": 2048, "gen_samples": 1}
    on, off = make(smol_tokenizer, **kw), make(smol_tokenizer, **kw, gen_kv_newline=False)
    assert on.describe()["gen_kv_newline"] is True and off.describe()["gen_kv_newline"] is False
    a, b = smol_tokenizer.decode(next(iter(on.samples())).input_ids), smol_tokenizer.decode(
        next(iter(off.samples())).input_ids)
    assert '}\n\n\nKey: "' in a and '}\n\nKey: "' in b and '}\n\n\nKey: "' not in b


@pytest.mark.parametrize("over, msg", [
    ({"subsets": "En.Nope"}, "unknown InfiniteBench subset"),
    ({"protocol": "lm_eval"}, "protocol"),
    ({"templates": "kimi"}, "templates"),
    ({"subsets": "En.QA", "generate": True}, "generate=true only builds"),
    ({"subsets": "passkey", "generate": True, "gen_length": 100000}, "gen_length"),
])
def test_validation_errors(smol_tokenizer, over, msg):
    with pytest.raises(ConfigError, match=msg):
        make(smol_tokenizer, **over)


def test_summary(smol_tokenizer):
    t = make(smol_tokenizer, subsets="retrieval3", generate=True, gen_length=1024)
    rows = [{"params": {"subset": k}, "metrics": {"score": v}}
            for k, v in (("passkey", 1.0), ("passkey", 0.0), ("kv_retrieval", 1.0))]
    out = t.summarize(rows)
    assert out["by_subset"]["passkey"] == {"n": 2, "score": 50.0}
    assert out["average"] == 75.0 and out["average_without_kv"] == 50.0
    assert out["average_of"] == "passkey (n=2), kv_retrieval (n=1): 2 of 3 subtasks"


def test_limit_takes_the_subsets_in_turn(tmp_path, smol_tokenizer):
    write(tmp_path, "longbook_choice_eng", [CHOICE, dict(CHOICE, id=4)])
    write(tmp_path, "math_find", [MATH, dict(MATH, id=1)])
    t = make(smol_tokenizer, subsets=["longbook_choice_eng", "math_find"], data_dir=str(tmp_path), limit=3)
    assert [s.id for s in t.limited()] == ["longbook_choice_eng/3", "math_find/0", "longbook_choice_eng/4"]
