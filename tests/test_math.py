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


# --- answers that carry a sign or brackets in another spelling (issue 36) ------------------------------------
@pytest.mark.parametrize("gold, answer, ok", [
    ("4e33", "\\left( 4e33 \\right)", True), ("4e33", "(4e33)", True), ("8.49e-4", "8.49e\u22124", True),
    ("-3", "\u22123", True), ("[1,2]", "\\left[1,2\\right]", True), ("4e33", "(4e33", False),
    ("4e33", "\\left( 5e33 \\right)", False)])
def test_unicode_minus_and_sized_brackets_are_normalised(gold, answer, ok):
    assert math_verify_equal(gold, answer) is ok


# --- Qwen2.5-Math's grader (task.grader=qwen25_math) -----------------------------------------------------------
# The modules are verbatim transcriptions of QwenLM/Qwen2.5-Math evaluation/parser.py and grader.py at a45202b:
# each function's source must hash as the official one does (SHA-256 of its text, first 16 hex digits, taken
# from the official files), so an edit to the transcription fails here.
OFFICIAL_SOURCE = {
    "parser": {"_fix_fracs": "6a6452f8dc783aac", "_fix_a_slash_b": "97111744bd2bdce3",
               "_fix_sqrt": "8bb72a102b21d76c", "convert_word_number": "8bf5d9c8f0baf857",
               "strip_string": "b5e75637c1f58fc7", "choice_answer_clean": "e3d6827a4332620a",
               "extract_answer": "ba116e7f51f8d5a6"},
    "grader": {"choice_answer_clean": "09bfe4a8b7d71730", "parse_digits": "d4046c13a698840a",
               "is_digit": "c0f1656e0d7aee9f", "str_to_pmatrix": "ce196fdab3da6cb5", "math_equal": "473025399e77cdf3",
               "numeric_equal": "8b5273a25a12abad", "symbolic_equal": "47871591d4491675"},
}
UNIT_TEXTS = ("8db5c972a62ca165", 132)     # repr() of parser.py's unit_texts literal, before its .extend


def test_qwen_grader_is_the_official_source_verbatim():
    import hashlib
    import inspect

    from tasks.metrics import qwen_math_grader, qwen_math_parser

    for mod, names in ((qwen_math_parser, OFFICIAL_SOURCE["parser"]), (qwen_math_grader, OFFICIAL_SOURCE["grader"])):
        for name, digest in names.items():
            assert hashlib.sha256(inspect.getsource(getattr(mod, name)).encode()).hexdigest()[:16] == digest, name
    units = qwen_math_parser.unit_texts[:UNIT_TEXTS[1]]
    assert hashlib.sha256(repr(units).encode()).hexdigest()[:16] == UNIT_TEXTS[0]
    assert qwen_math_parser.unit_texts[UNIT_TEXTS[1]:] == [t + "s" for t in units]


@pytest.mark.parametrize("output, data_name, gold, ok", [
    ("so \\boxed{\\frac{1}{2}}.", "math", "\\frac12", True),
    ("the result is \\boxed 204", "aime24", "204", True),             # read here, not by the default grader
    ("no box; the answer is 7.", "aime24", "7", True),
    ("we get 3 and then 12", "aime24", "12", True),                   # the last number
    ("\\boxed{(1,4.5)}", "math", "(1,\\frac{9}{2})", True),
    ("\\boxed{0.0833333333333333}", "math", "\\frac{1}{12}", True),
    ("\\boxed{4.5 \\text{ m}}", "minerva_math", "4.5", True),           # a trailing \\text{} unit always goes
    ("\\boxed{5}", "aime24", "6", False)])
def test_qwen_grader_cases(output, data_name, gold, ok):
    from tasks.metrics.qwen_math import qwen_math_equal

    assert qwen_math_equal(gold, output, data_name)[1] is ok


def test_grader_option_is_validated_scored_and_recorded(tmp_path, smol_tokenizer):
    data = tmp_path / "test.jsonl"
    data.write_text('{"id": 1, "problem": "What is 200 + 4?", "answer": "204"}\n')
    cfg = OmegaConf.merge(cfg_aime := OmegaConf.load(ROOT / "conf/task/aime.yaml"),
                          {"data_dir": str(data), "grader": "qwen25_math", "max_new_tokens": 1024})
    assert cfg_aime.grader == "math_verify"                                    # the default
    spec = ModelSpec("smol", 8192, True, [])
    tasks.get("aime").validate(cfg, spec)
    task = tasks.build(cfg, smol_tokenizer, spec)
    s = next(iter(task.samples()))
    gold = s.references[0]
    assert task.score(s, f"\\boxed {gold}")["correct"] == 1.0                 # Qwen's parser reads "\boxed 204"
    default = tasks.build(OmegaConf.merge(cfg, {"grader": "math_verify"}), smol_tokenizer, spec)
    assert default.score(s, f"\\boxed {gold}")["correct"] == 0.0              # hendrycks' remove_boxed does not
    assert task.describe()["grader"] == "qwen25_math" and default.describe()["grader"] == "math_verify"
    with pytest.raises(ConfigError, match="task.grader"):
        tasks.get("aime").validate(OmegaConf.merge(cfg, {"grader": "exact"}), spec)
