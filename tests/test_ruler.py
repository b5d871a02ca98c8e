"""RULER task: prompts byte-identical to NVIDIA/RULER's templates, seeded reproducible samples,
lengths filled to within 1%, answers present in the haystack, RULER's scoring and tables."""
from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import tasks
from common.errors import ConfigError
from tasks import datafiles
from tasks.base import ModelSpec

ROOT = Path(__file__).resolve().parents[1]
L = 4096
MODEL = ModelSpec(name="smollm2", max_length=8192, chat_template=True)
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."

# RULER's strings, typed out here independently of tasks/ruler_spec.py.
NIAH_1 = ("A special magic number is hidden within the following text. Make sure to memorize it. "
          "I will quiz you about the number afterwards.\n")
NIAH_1_Q = ("\nWhat is the special magic number for {k} mentioned in the provided text?"
            " The special magic number for {k} mentioned in the provided text is")
NIAH_MV = ("Some special magic numbers are hidden within the following text. Make sure to memorize it. "
           "I will quiz you about the numbers afterwards.\n")
NIAH_MV_Q = ("\nWhat are all the special magic numbers for {k} mentioned in the provided text?"
             " The special magic numbers for {k} mentioned in the provided text are")
VT_Q = ("\nQuestion: Find all variables that are assigned the value {v} in the text above."
        " Answer: According to the chain(s) of variable assignment in the text above, 5 variables are "
        "assgined the value {v}, they are: ")
CWE_HEAD = ("Below is a numbered list of words. In these words, some appear more often than others. "
            "Memorize the ones that appear most often.\n")
CWE_Q = ("\nQuestion: What are the 10 most common words in the above list?"
         " Answer: The top 10 words that appear most often in the list are:")
FWE_HEAD = ("Read the following coded text and track the frequency of each coded word. "
            "Find the three most frequently appeared coded words. ")
FWE_Q = ("\nQuestion: Do not provide any explanation. Please ignore the dots '....'. What are the three "
         "most frequently appeared words in the above coded text? Answer: According to the coded text "
         "above, the three most frequently appeared words are:")
QA_HEAD = ("Answer the question based on the given documents. Only give me the answer and do not output "
           "any other words.\n\nThe following are given documents.\n\n")
QA_Q = ("\n\nAnswer the question based on the given documents. Only give me the answer and do not output "
        "any other words.\n\nQuestion: {q} Answer:")


def make(tok, **over):
    cfg = OmegaConf.load(ROOT / "conf/task/ruler.yaml")
    cfg.samples_per_task = 2
    cfg.sentence_splitter = "punkt_untrained"
    for k, v in over.items():
        cfg[k] = v
    return tasks.build(cfg, tok, MODEL)


@pytest.fixture(scope="module")
def base(smol_tokenizer):
    return make(smol_tokenizer, tasks="synthetic", template="base")


@pytest.fixture(scope="module")
def essay_path(repo_data):
    return str(repo_data / "paul_graham_essays/ruler/PaulGrahamEssays.json")


def test_niah_single_template_and_needle_byte_identical(base):
    text, ans, _, n = base.render("niah_single_1", L, 0)
    key = re.search(r"One of the special magic numbers for (\S+) is: (\d{7})\.", text).group(1)
    assert text.startswith(NIAH_1) and text.endswith(NIAH_1_Q.format(k=key))
    lines = text[len(NIAH_1):-len(NIAH_1_Q.format(k=key))].split("\n")
    needle = f"One of the special magic numbers for {key} is: {ans[0]}."
    assert lines.count(needle) == 1 and lines.count(NOISE) == n == len(lines) - 1


def test_multi_value_template_stays_plural(smol_tokenizer, essay_path):
    t = make(smol_tokenizer, tasks=["niah_multivalue"], template="base", essay_path=essay_path)
    text, ans, _, _ = t.render("niah_multivalue", L, 0)
    key = re.search(r"One of the special magic numbers for (\S+) is: \d{7}\.", text).group(1)
    assert text.startswith(NIAH_MV) and text.endswith(NIAH_MV_Q.format(k=key))
    assert len(ans) == 4 and all(f"for {key} is: {v}." in text for v in ans)


def test_hf_chat_wrapper_then_answer_prefix(smol_tokenizer):
    t = make(smol_tokenizer, tasks=["niah_single_1"], template="auto")
    assert t.describe()["template"] == "hf"
    text, _, ids, _ = t.render("niah_single_1", L, 0)
    sys_turn = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    assert text.startswith(sys_turn + "<|im_start|>user\n" + NIAH_1)   # "You are" left intact
    assert re.search(r"provided text\?<\|im_end\|>\n<\|im_start\|>assistant\n The special magic number for \S+ "
                     r"mentioned in the provided text is$", text)
    assert ids == smol_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids[0] == smol_tokenizer.convert_tokens_to_ids("<|im_start|>")


def test_ruler_named_wrapper(smol_tokenizer):
    t = make(smol_tokenizer, tasks=["niah_single_1"], template="meta-llama3")
    text = t.render("niah_single_1", L, 0)[0]
    assert text.startswith("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n" + NIAH_1)
    assert re.search(r"\?<\|eot_id\|><\|start_header_id\|>assistant<\|end_header_id\|>\n\n The special", text)


def test_vt_one_shot_and_template(base):
    text, ans, _, _ = base.render("vt", L, 0)
    value = re.search(rf"VAR {ans[0]} = (\d{{5}})", text).group(1)
    assert text.endswith(VT_Q.format(v=value))
    head = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
    assert text.startswith(head) and text.count(head) == 2          # the one-shot example, then the task
    shot, task = text.split("\n" + head)
    assert re.search(r"variables are assgined the value \d{5}, they are:  ([A-Z]{3} ){4}[A-Z]{3}\n$", shot + "\n")
    for a, b in itertools.pairwise(ans):
        assert f"VAR {b} = VAR {a} " in task
    assert all(line in (NOISE, f"VAR {ans[0]} = {value}") or line.startswith("VAR ")
               for line in task.split("\n")[:-2])


def test_cwe_few_shot_and_counts(base):
    text, ans, _, _ = base.render("cwe", L, 0)
    assert text.startswith(CWE_HEAD) and text.endswith(CWE_Q)
    shot, main = text.split("\n" + CWE_HEAD)
    assert re.search(r" Answer: The top 10 words that appear most often in the list are: 1\. \S+( \d+\. \S+){9}$", shot)
    words = re.findall(r"\d+\. (\S+)", main[: -len(CWE_Q)])
    counts = {w: words.count(w) for w in set(words)}
    assert len(ans) == 10 and all(counts[a] == 30 for a in ans)
    assert all(c == 3 for w, c in counts.items() if w not in ans)


def test_fwe_template_and_answers_are_the_most_frequent(base):
    text, ans, _, _ = base.render("fwe", L, 0)
    assert text.startswith(FWE_HEAD) and text.endswith(FWE_Q)
    words = text[len(FWE_HEAD):-len(FWE_Q)].split(" ")
    counts = sorted(((words.count(w), w) for w in set(words) if w != "..."), reverse=True)
    assert [w for _, w in counts[:3]] == ans
    assert words.count("...") > counts[0][0]


@pytest.mark.parametrize("name", ["niah_single_1", "niah_multikey_2", "niah_multikey_3", "vt", "cwe", "fwe"])
def test_length_filled_within_one_percent_and_answers_present(base, name):
    _, _, per_unit = base._prepare(name, L)
    tol = max(0.01 * L, per_unit)      # a needle line of two uuids is ~1% of 4K on its own
    for i in range(2):
        s = base._sample(name, L, i)
        total = len(s.input_ids) + s.max_new_tokens
        assert L - tol <= total <= L, (name, i, total)
        text = base.render(name, L, i)[0]
        assert s.references and all(r in text for r in s.references)
        assert s.extra["answer_prefix"] and text.endswith(s.extra["answer_prefix"])


def test_essay_tasks_fill_length(smol_tokenizer, essay_path):
    names = ["niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multiquery"]
    t = make(smol_tokenizer, tasks=names, essay_path=essay_path)
    essay = json.loads(datafiles.read_text(essay_path))["text"]
    for name in names:
        s = t._sample(name, L, 0)
        assert 0.99 * L <= len(s.input_ids) + s.max_new_tokens <= L
        text = t.render(name, L, 0)[0]
        assert all(f" is: {r}." in text for r in s.references)
        assert essay[:200].split()[0] in text                       # the haystack is the essay


def test_samples_reproducible_from_seed_and_independent_of_order(smol_tokenizer):
    a = make(smol_tokenizer, tasks=["niah_multikey_2", "vt"], template="base")
    b = make(smol_tokenizer, tasks=["niah_multikey_2", "vt"], template="base")
    c = make(smol_tokenizer, tasks=["niah_multikey_2", "vt"], template="base", seed=7)
    first = list(a.samples())
    assert [s.id for s in first] == ["niah_multikey_2/4096/0", "niah_multikey_2/4096/1", "vt/4096/0", "vt/4096/1"]
    # b renders sample 1 before sample 0: per-sample seeds make the order irrelevant
    assert b._sample("vt", L, 1).input_ids == first[3].input_ids
    assert [s.input_ids for s in b.samples()] == [s.input_ids for s in first]
    assert c._sample("vt", L, 1).input_ids != first[3].input_ids
    assert first[2].input_ids != first[3].input_ids


def test_score_uses_ruler_metric_per_task(base):
    s = base._sample("vt", L, 0)
    pred = " " + " ".join(r.lower() for r in s.references[:3]) + "\x00"
    assert base.score(s, pred) == {"score": pytest.approx(0.6), "null": 0.0}
    assert base.score(s, "  ") == {"score": 0.0, "null": 1.0}
    assert s.params["metric"] == "string_match_all" and s.max_new_tokens == 30


def test_limit_takes_the_subtasks_in_turn_and_the_average_says_what_it_averages(smol_tokenizer):
    t = make(smol_tokenizer, tasks=["niah_single_1", "niah_multikey_2", "vt"], template="base", lengths=[1024, 2048],
             limit=4)
    ids = [s.id for s in t.limited()]
    a, b, c = t.tasks      # the subtasks in the task's order
    assert ids == [f"{a}/1024/0", f"{b}/1024/0", f"{c}/1024/0", f"{a}/1024/1",
                   f"{a}/2048/0", f"{b}/2048/0", f"{c}/2048/0", f"{a}/2048/1"]
    rows = [{"id": i, "params": {"subtask": i.split("/")[0], "length": int(i.split("/")[1]),
                                 "index": int(i.split("/")[2])}, "metrics": {"score": 1.0, "null": 0.0}} for i in ids]
    out = t.summarize(rows)
    assert out["by_length"]["1024"]["average_of"] == f"{a} (n=2), {b} (n=1), {c} (n=1): 3 of 3 subtasks"
    assert out["score_of"].startswith(f"{a} (n=2)") and out["score_of"].endswith("over 2 length(s)")
    two = make(smol_tokenizer, tasks=["niah_single_1", "niah_multikey_2", "vt"], template="base", lengths=[1024], limit=2)
    rows2 = [dict(r, id=s.id) for r, s in zip(rows, two.limited())]
    assert "2 of 3 subtasks" in two.summarize(rows2)["score_of"]


def test_summarize_per_length_table():
    rows = [{"params": {"subtask": t, "length": n}, "metrics": {"score": v, "null": 0.0}}
            for t, n, v in [("niah_single_1", 4096, 1.0), ("niah_single_1", 4096, 0.5),
                            ("vt", 4096, 0.0), ("vt", 8192, 1.0)]]
    t = tasks.get("ruler").__new__(tasks.get("ruler"))
    t.tasks = ["niah_single_1", "vt"]
    out = t.summarize(rows)
    assert out["by_length"]["4096"]["tasks"] == {"niah_single_1": 75.0, "vt": 0.0}
    assert out["by_length"]["4096"]["average"] == 37.5
    assert out["by_length"]["8192"]["average"] == 100.0 and out["score"] == 68.75


def test_summarize_sums_like_ruler_string_match():
    # RULER: round(sum(per-sample) / n * 100, 2) over samples in order; a pandas/numpy mean of these
    # 16 scores gives 45.62, RULER's running sum 45.63
    v = [0.75, 0.8, 0.6, 0.6, 0.25, 1.0, 0.0, 1.0, 1 / 3, 0.0, 0.4, 0.4, 0.0, 0.5, 0.0, 2 / 3]
    rows = [{"params": {"subtask": "vt", "length": 4096, "index": i}, "metrics": {"score": x, "null": 0.0}}
            for i, x in enumerate(v)]
    t = tasks.get("ruler").__new__(tasks.get("ruler"))
    t.tasks = ["vt"]
    assert t.summarize(rows[::-1])["by_length"]["4096"]["tasks"] == {"vt": 45.63}   # sample order restored


def test_vt_prompt_version(smol_tokenizer):
    fixed = make(smol_tokenizer, tasks=["vt"], template="base", prompt_version="fixed")
    text, ans, _, _ = fixed.render("vt", L, 0)
    value = re.search(rf"VAR {ans[0]} = (\d{{5}})", text).group(1)
    assert text.endswith(VT_Q.replace("assgined", "assigned").format(v=value))
    assert "assgined" not in text                                       # one-shot example too
    assert fixed.describe()["prompt_version"] == "fixed"
    assert OmegaConf.load(ROOT / "conf/task/ruler.yaml").prompt_version == "original"
    with pytest.raises(ConfigError, match="prompt_version"):
        make(smol_tokenizer, tasks=["vt"], prompt_version="2025")


def test_qa_from_local_files(smol_tokenizer, tmp_path):
    paras = [{"context": f"Paragraph {i} says that the capital of land {i} is city {i * 7}. " * 3,
              "qas": [{"question": f"What is the capital of land {i}?", "is_impossible": False,
                       "answers": [{"text": f"city {i * 7}"}, {"text": f"City {i * 7}"}]},
                      {"question": "Unanswerable?", "is_impossible": True, "answers": []}]}
             for i in range(60)]
    squad = {"data": [{"title": f"T{j}", "paragraphs": paras[j * 10:(j + 1) * 10]} for j in range(6)]}
    (tmp_path / "squad.json").write_text(json.dumps(squad))
    t = make(smol_tokenizer, tasks=["qa_1"], template="base", data_dir=str(tmp_path))
    s = t._sample("qa_1", 2048, 1)
    text = t.render("qa_1", 2048, 1)[0]
    assert text.startswith(QA_HEAD + "Document 1:\n") and text.endswith(QA_Q.format(q="What is the capital of land 1?"))
    assert "the capital of land 1 is city 7." in text                      # the gold paragraph is in
    assert len(s.input_ids) + 32 <= 2048 and s.max_new_tokens == 32
    assert t.score(s, "City 7") == {"score": 1.0, "null": 0.0}               # string_match_part


def test_qa_without_data_names_the_option(smol_tokenizer, tmp_path):
    t = make(smol_tokenizer, tasks=["qa_2"], data_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="data_dir"):
        next(iter(t.samples()))


def test_missing_essay_names_the_option(smol_tokenizer, tmp_path):
    t = make(smol_tokenizer, tasks=["niah_single_2"], essay_path=str(tmp_path / "none.json"))
    with pytest.raises(ConfigError, match="essay_path"):
        next(iter(t.samples()))


def test_validate_errors_and_presets(smol_tokenizer):
    with pytest.raises(ConfigError, match="max_length"):
        make(smol_tokenizer, lengths=[16384])
    with pytest.raises(ConfigError, match="unknown RULER task"):
        make(smol_tokenizer, tasks=["niah_single_9"])
    with pytest.raises(ConfigError, match="template"):
        make(smol_tokenizer, template="chatml")
    t = make(smol_tokenizer, tasks="synthetic")
    assert t.tasks == ["niah_single_1", "niah_multikey_2", "niah_multikey_3", "vt", "cwe", "fwe"]
    assert len(make(smol_tokenizer).tasks) == 13


def test_hotpotqa_local_file_keeps_all_ten_paragraphs(smol_tokenizer, tmp_path):
    rows = [{"question": f"Who founded firm {i}?", "answer": f"Founder{i}",
             "context": [[f"Title {i}-{j}", [f"Firm {i} text {j}. ", f"Founder{i} did it {j}."]] for j in range(10)]}
            for i in range(4)]
    (tmp_path / "hotpotqa.json").write_text(json.dumps(rows))
    t = make(smol_tokenizer, tasks=["qa_2"], template="base", data_dir=str(tmp_path))
    text, ans, ids, n = t.render("qa_2", 1024, 2)
    assert ans == ["Founder2"] and n >= 10 and len(ids) + 32 <= 1024
    assert all(f"Title 2-{j}\nFirm 2 text {j}. Founder2 did it {j}." in text for j in range(10))


def test_hub_rows_rebuild_ruler_json_shapes():
    from tasks.ruler_data import (
        _hotpot_from_hub,
        _squad_from_hub,
        read_hotpotqa,
        read_squad,
    )
    rows = [{"title": "A", "context": "c1", "question": "q1", "answers": {"text": ["x"], "answer_start": [0]}},
            {"title": "A", "context": "c1", "question": "q2", "answers": {"text": [], "answer_start": []}},
            {"title": "A", "context": "c2", "question": "q3", "answers": {"text": ["y", "y"], "answer_start": [0, 0]}},
            {"title": "B", "context": "c3", "question": "q4", "answers": {"text": ["z"], "answer_start": [0]}}]
    qas, docs = read_squad(_squad_from_hub(rows))
    assert docs == ["c1", "c2", "c3"] and [q["query"] for q in qas] == ["q1", "q3", "q4"]
    assert qas[0]["context"] == [0] and qas[0]["more_context"] == [1] and qas[1]["outputs"] == ["y", "y"]
    assert qas[2]["more_context"] == []
    hp = [{"question": "q", "answer": "a", "context": {"title": ["t1", "t2"], "sentences": [["s1 ", "s2"], ["s3"]]}}]
    qas, docs = read_hotpotqa(_hotpot_from_hub(hp))
    assert docs == ["t1\ns1 s2", "t2\ns3"] and qas == [{"query": "q", "outputs": ["a"], "context": [0, 1]}]


def test_remove_newline_tab(smol_tokenizer):
    t = make(smol_tokenizer, tasks=["niah_single_1"], template="base", remove_newline_tab=True)
    s = t._sample("niah_single_1", L, 0)
    assert "\n" not in smol_tokenizer.decode(s.input_ids) and len(s.input_ids) + 128 <= L
