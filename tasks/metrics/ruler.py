"""RULER scorers, as NVIDIA/RULER scripts/eval/synthetic/constants.py defines them."""
from __future__ import annotations

import re

# RULER scores each prediction against all its references, case-insensitively, by substring:
# `string_match_all` is the fraction of references found (niah, vt, cwe, fwe); `string_match_part`
# is 1 if ANY reference is found (qa). lm-eval's `string_match_part` is not this one (it averages
# over references like match_all); do not swap them.

_RULER_NONPRINTABLE = re.compile(r"[\x00-\x1f]")


def ruler_postprocess(prediction: str) -> str:
    """scripts/eval/evaluate.py postprocess_pred: strip, control characters -> newline, strip."""
    return _RULER_NONPRINTABLE.sub("\n", prediction.strip()).strip()


def ruler_string_match_all(prediction: str, references: list[str]) -> float:
    """Fraction of references that occur in the prediction (case-insensitive), in [0, 1]."""
    pred = prediction.lower()
    return sum(1.0 if r.lower() in pred else 0.0 for r in references) / len(references)


def ruler_string_match_part(prediction: str, references: list[str]) -> float:
    """1.0 if any reference occurs in the prediction (case-insensitive), else 0.0."""
    pred = prediction.lower()
    return max(1.0 if r.lower() in pred else 0.0 for r in references)


RULER_METRICS = {"string_match_all": ruler_string_match_all, "string_match_part": ruler_string_match_part}


def ruler_score(predictions: list[str], references: list[list[str]], metric: str) -> float:
    """RULER's reduced score over a task: 100 x mean per-sample score, rounded to 2 decimals."""
    fn = RULER_METRICS[metric]
    return round(sum(fn(p, r) for p, r in zip(predictions, references)) / len(predictions) * 100, 2)
