"""RULER scorers (NVIDIA/RULER scripts/eval/synthetic/constants.py, scripts/eval/evaluate.py)."""
from __future__ import annotations

import pytest

from tasks.metrics import (
    ruler_postprocess,
    ruler_score,
    ruler_string_match_all,
    ruler_string_match_part,
)


def test_match_all_is_fraction_of_references_found():
    pred = "The special magic numbers are 1234567 and 7654321."
    assert ruler_string_match_all(pred, ["1234567", "7654321", "1111111"]) == pytest.approx(2 / 3)
    assert ruler_string_match_all(pred, ["1234567"]) == 1.0
    assert ruler_string_match_all(pred, ["9999999"]) == 0.0


def test_match_part_is_one_if_any_reference_found():
    # RULER's qa scorer; lm-eval's "string_match_part" would give 0.5 here (it averages).
    assert ruler_string_match_part("Paris", ["Paris", "the city of Paris, France"]) == 1.0
    assert ruler_string_match_part("London", ["Paris", "France"]) == 0.0
    assert ruler_string_match_all("Paris", ["Paris", "the city of Paris, France"]) == 0.5


def test_matching_is_case_insensitive_substring():
    assert ruler_string_match_all("ANSWER: APPLE-PIE", ["apple-pie"]) == 1.0
    assert ruler_string_match_part("answer: apple-pie", ["Apple-Pie"]) == 1.0
    # substring, not token match: RULER does not look at word boundaries
    assert ruler_string_match_all("12345678", ["2345"]) == 1.0


def test_postprocess_like_evaluate_py():
    assert ruler_postprocess("  \x00ans\twer\n ") == "ans\nwer"
    assert ruler_postprocess("\n\n") == ""
    assert ruler_postprocess(" a\x1fb ") == "a\nb"


def test_reduced_score_is_percent_rounded_to_two_decimals():
    preds = ["a b", "a", "nothing"]
    refs = [["a", "b"], ["a", "b"], ["a"]]
    assert ruler_score(preds, refs, "string_match_all") == 50.0          # (1 + 0.5 + 0) / 3
    assert ruler_score(preds, refs, "string_match_part") == 66.67        # (1 + 1 + 0) / 3
