"""Qwen2.5-Math's grading protocol (QwenLM/Qwen2.5-Math evaluation/), an alternative to the harness's
last \\boxed{} + math-verify (tasks/metrics/math_answers.py): the two disagree on a sizeable share of real
outputs (issue 36 measured about 30%), so scores are comparable only under the same grader.

  prediction  run_execute (parser.py): extract_answer(output, data_name) -- the last "boxed" group
              (also "\\boxed 5"), else "the answer is ...", else the last number -- then strip_string
              (units kept for minerva_math, its STRIP_EXCEPTIONS);
  gold        parse_ground_truth's post-processing of the harness's gold answer: "$" removed for
              gaokao2023en and olympiadbench, then strip_string, or for minerva_math only \\neq/\\leq/\\geq
              rewritten (MATH-500's gold is its solution's boxed answer, as extract_answer reads it there);
  equal       grader.py math_equal(prediction, gold) in a child process, given 3 s as evaluate.py's
              pool.map(math_equal_process, params, timeout=3): a timeout scores wrong.
"""
from __future__ import annotations

import multiprocessing

# the harness's data sets -> Qwen2.5-Math's data names (MATH-500 is its "math" set's 500-problem subset)
DATA_NAME = {"aime24": "aime24", "gaokao2023en": "gaokao2023en", "minerva_math": "minerva_math",
             "olympiadbench": "olympiadbench", "math500": "math"}
TIMEOUT_S = 3


def qwen_prediction(output: str, data_name: str) -> str:
    from tasks.metrics.qwen_math_parser import (
        STRIP_EXCEPTIONS,
        extract_answer,
        strip_string,
    )

    return strip_string(extract_answer(output, data_name), skip_unit=data_name in STRIP_EXCEPTIONS)


def qwen_gold(gold: str, data_name: str) -> str:
    from tasks.metrics.qwen_math_parser import STRIP_EXCEPTIONS, strip_string

    if data_name == "gaokao2023en":
        gold = gold.replace("$", "").strip()
    elif data_name == "olympiadbench":
        gold = gold.strip("$")
    if data_name not in STRIP_EXCEPTIONS:
        return strip_string(gold, skip_unit=data_name == "carp_en")
    return gold.replace("\\neq", "\\ne").replace("\\leq", "\\le").replace("\\geq", "\\ge")


def _equal_into(pred: str, gold: str, out) -> None:
    from tasks.metrics.qwen_math_grader import math_equal

    try:
        out.put(bool(math_equal(pred, gold)))
    except Exception:  # noqa: BLE001  (evaluate.py: any exception in its pool scores the sample wrong)
        out.put(False)


def qwen_math_equal(gold: str, output: str, data_name: str, timeout: float = TIMEOUT_S) -> tuple[str, bool]:
    """(the extracted answer, whether Qwen2.5-Math's grader counts it correct)."""
    pred, ref = qwen_prediction(output, data_name), qwen_gold(gold, data_name)
    ctx = multiprocessing.get_context("fork")      # the child needs no re-import (sympy is slow to load)
    out = ctx.Queue()
    proc = ctx.Process(target=_equal_into, args=(pred, ref, out))
    proc.start()
    proc.join(timeout)
    if proc.is_alive():
        proc.terminate()
        proc.join()
        return pred, False
    return pred, bool(out.get()) if not out.empty() else False
