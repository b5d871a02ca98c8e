"""Math reasoning tasks (R1-distill protocol): prompt, seeds, last-\\boxed extraction, math-verify."""
from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

import tasks
from common.errors import ConfigError
from tasks.aime import summarize_pass1
from tasks.base import ModelSpec
from tasks.metrics import last_boxed, math_verify_equal

ROOT = Path(__file__).resolve().parents[1]
SPEC = ModelSpec(name="smol", max_length=8192)
SETS = {"aime": ("aime24", 30), "gaokao2023en": ("gaokao2023en", 383),
        "minerva_math": ("minerva_math", 272), "olympiadbench": ("olympiadbench", 675)}
INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


def cfg(name, **kw):
    c = OmegaConf.load(ROOT / f"conf/task/{name}.yaml")
    c.max_new_tokens = 1024
    for k, v in kw.items():
        c[k] = v
    return c


@pytest.mark.parametrize("name", list(SETS))
def test_yaml_and_local_data(name, repo_data, smol_tokenizer):
    c = OmegaConf.load(ROOT / f"conf/task/{name}.yaml")
    assert c.name == name and c.limit is None and "seed" in c
    assert c.temperature == 0.6 and c.top_p == 0.95 and c.max_new_tokens == 32768
    folder, n = SETS[name]
    task = tasks.build(cfg(name, data_dir=str(repo_data / folder)), smol_tokenizer, SPEC)
    problems = task.problems()
    assert len(problems) == n and all(p["answer"] for p in problems)
    assert task.describe()["dataset"] == folder


def test_gold_answers_by_schema(repo_data, smol_tokenizer):
    probs = {n: tasks.build(cfg(n, data_dir=str(repo_data / SETS[n][0])), smol_tokenizer, SPEC).problems()
             for n in SETS}
    assert probs["aime"][0]["answer"] == "204"
    assert probs["minerva_math"][0]["answer"] == "1.6"                 # last \boxed{} of the solution
    assert probs["minerva_math"][1]["answer"] == "4.5e33"
    assert probs["olympiadbench"][0]["answer"] == "2"                  # final_answer list joined
    assert probs["gaokao2023en"][0]["answer"] == "$\\{x|-2\\leq x < 1\\}$"
    g = tasks.build(cfg("gaokao2023en", data_dir=str(repo_data / "gaokao2023en")), smol_tokenizer, SPEC)
    assert g.describe()["dropped_no_gold"] == ["HMMT2023General_9", "052023SATS4_11"]   # empty answers


def test_prompt_verbatim_and_seeds(repo_data, smol_tokenizer):
    task = tasks.build(cfg("aime", data_dir=str(repo_data / "aime24"), k=3, seed=10, num_problems=2),
                       smol_tokenizer, SPEC)
    samples = list(task.limited())
    assert len(samples) == 6
    problem = task.problems()[0]["problem"]
    expected = smol_tokenizer.apply_chat_template(
        [{"role": "user", "content": problem + "\n" + INSTRUCTION}], tokenize=False, add_generation_prompt=True)
    assert smol_tokenizer.decode(samples[0].input_ids) == expected
    assert [s.seed for s in samples[:3]] == [10, 11, 12] and len({s.id for s in samples}) == 6
    assert all(s.temperature == 0.6 and s.top_p == 0.95 and s.max_new_tokens == 1024 for s in samples)
    think = tasks.build(cfg("aime", data_dir=str(repo_data / "aime24"), think_prefix=True), smol_tokenizer, SPEC)
    assert smol_tokenizer.decode(next(iter(think.limited())).input_ids) == expected + "<think>\n"


def test_validate():
    cls = tasks.get("aime")
    with pytest.raises(ConfigError, match="greedy"):
        cls.validate(cfg("aime", k=4, temperature=0.0), SPEC)
    with pytest.raises(ConfigError, match="max_length"):
        cls.validate(OmegaConf.load(ROOT / "conf/task/aime.yaml"), SPEC)          # 32768 > 8K model
    with pytest.raises(ConfigError):
        cls.validate(cfg("aime"), ModelSpec(name="base", max_length=8192, chat_template=False))
    cls.validate(cfg("aime", k=1, temperature=0.0), SPEC)                          # LycheeDecode: greedy


@pytest.mark.parametrize("text, expected", [
    # hendrycks/math: remove_boxed(last_boxed_only_string(text)), values from its code
    ("\\boxed{1} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),        # the last one, nested braces
    ("x \\boxed{\\{1, \\{2\\}\\}} y", "\\{1, \\{2\\}\\}"),
    ("$\\boxed{a_{n}^{2}}$.", "a_{n}^{2}"),
    ("The answer is \\boxed{204}.", "204"),
    ("\\boxed{}", ""),
    ("</think> The answer is 3.", None),
    ("\\boxed{\\frac{1}{2}", None),                                  # unbalanced
    ("\\boxed 12, 13", None),                                        # no brace after \\boxed
    ("so \\boxed 5$ done", None),
    ("\\boxed 5 and {x}", None),                                     # braces found, not "\\boxed{"
    ("\\fbox{5}", None),                                             # found, but remove_boxed needs \\boxed{
    ("\\boxed{5} and \\fbox{6}", "5"),                              # any \\boxed beats a later \\fbox
    ("\\boxed {2}", None),
    ("\\boxed{3} \\boxed{ 4 }", " 4 "),
])
def test_last_boxed_is_hendrycks_extraction(text, expected):
    assert last_boxed(text) == expected


@pytest.mark.parametrize("gold, answer, ok", [
    ("1/2", "0.5", True), ("\\frac{1}{2}", "0.5", True), ("$\\frac{1}{2}$", "\\dfrac12", True),
    ("025", "25", True), ("204", "204", True), ("204", "205", False),
    ("4.5e33", "4.5\\times 10^{33}", True), ("$\\frac{\\pi}{3}$", "\\pi/3", True),
    ("$48$, $384$", "48, 384", True), ("$(1,8,19), (2,7,13)$", "(2,7,13),(1,8,19)", True),
    ("2", None, False), ("2", "", False),
])
def test_math_verify_equivalences(gold, answer, ok):
    assert math_verify_equal(gold, answer) is ok


def test_score_and_pass_at_1(repo_data, smol_tokenizer):
    task = tasks.build(cfg("aime", data_dir=str(repo_data / "aime24"), num_problems=1), smol_tokenizer, SPEC)
    s = next(iter(task.limited()))
    good = "<think>maybe \\boxed{203}</think> So the walk takes \\boxed{204} minutes."
    assert task.score(s, good) == {"correct": 1.0, "boxed": 1.0, "gold_unparsed": 0.0}
    assert task.score(s, "I think 204")["correct"] == 0.0                         # no box: wrong
    rows = [{"params": {"problem_id": p}, "metrics": {"correct": c}}
            for p, c in [("a", 1.0), ("a", 0.0), ("a", 1.0), ("a", 0.0), ("b", 1.0)]]
    out = summarize_pass1(rows)
    assert out["pass@1"] == pytest.approx(75.0)          # problems weigh equally: (0.5 + 1) / 2
    assert out["problems"] == 2 and out["correct"] == pytest.approx(0.6)
