"""Math answers: hendrycks MATH last \\boxed{} extraction and math-verify equivalence (R1-distill protocol)."""
from __future__ import annotations

import re


def last_boxed_only_string(text: str) -> str | None:
    """hendrycks/math modeling/dataset/util.py `last_boxed_only_string`: the LAST "\\boxed" (only if
    there is none, the last "\\fbox"), up to the brace that brings the count of braces seen from
    there back to zero; None when there is no such brace. Braces are counted, so nested groups
    (`\\boxed{\\frac{1}{2}}`) survive, unlike regex/split extractors (`[^}]*`)."""
    idx = text.rfind("\\boxed")
    if idx < 0:
        idx = text.rfind("\\fbox")
        if idx < 0:
            return None
    depth = 0
    for j in range(idx, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[idx:j + 1]
    return None


def remove_boxed(s: str | None) -> str | None:
    """hendrycks/math eval_math_gpt.py `remove_boxed`: the content of "\\boxed{...}", None for
    anything else (its asserts fail and its bare except returns None): "\\fbox{5}", "\\boxed {2}",
    "\\boxed 5" give None."""
    left = "\\boxed{"
    if s is not None and s.startswith(left) and s.endswith("}"):
        return s[len(left):-1]
    return None


def last_boxed(text: str) -> str | None:
    """The answer of an output as hendrycks MATH extracts it: remove_boxed(last_boxed_only_string).
    Matched exactly (lm-eval's variant also reads "\\boxed 5"; Qwen2.5-Math's reads "\\boxed 5" and
    falls back to the last number). What that means for AIME-style outputs: "\\boxed{204}" -> "204";
    "\\boxed 204", "\\boxed {204}", "\\fbox{204}" -> None (scored incorrect); "\\boxed{5} and
    \\fbox{6}" -> "5" (a \\boxed anywhere wins over a later \\fbox)."""
    return remove_boxed(last_boxed_only_string(text))


# a whole answer in e-notation, optionally in one pair of parentheses: "4.5e33", "( 8.49e-4 )"
_SCI = re.compile(r"\s*(\()?\s*([+-]?\d+(?:\.\d+)?)[eE]([+-]?\d+)\s*(?(1)\))\s*")
# \left / \right before a bracket only size it ("\left( 4e33 \right)"); "\left." and "\rightarrow" stay
_SIZED = re.compile(r"\\(?:left|right)(?=\s*[()\[\]|])")


def normalise_answer(ans: str) -> str:
    """What carries no mathematical meaning, removed before math-verify reads an answer or a gold:
    the Unicode minus U+2212 ("8.49e\u22124") becomes "-", and \\left / \\right before a bracket go."""
    return _SIZED.sub("", ans.replace("\u2212", "-"))


def _sci_to_latex(ans: str) -> str:
    """`4.5e33` -> `4.5\\times 10^{33}`. math-verify reads a bare `e` as Euler's number, and Minerva
    Math golds use this notation (58 of 272); only a whole-answer match (parentheses allowed) is rewritten."""
    m = _SCI.fullmatch(normalise_answer(ans))
    return f"{m.group(2)}\\times 10^{{{int(m.group(3))}}}" if m else normalise_answer(ans)


def math_verify_equal(gold: str, answer: str | None, timeout: int = 5) -> bool:
    """Equivalence of an extracted answer with the gold via `math-verify`, argument order as its docs
    say: `verify(gold, prediction)` (gold first: the check is not symmetric for sets/intervals).
    Gold is parsed as LaTeX (wrapped in `$..$` unless it already has `$` or `\\boxed`) or as a plain
    expression; the answer is re-boxed so LaTeX extraction takes it whole. `timeout` bounds sympy."""
    if answer is None or not answer.strip():
        return False
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    gold = _sci_to_latex(gold.strip())
    gold_cfg = (LatexExtractionConfig(), ExprExtractionConfig())
    gold_text = gold if ("$" in gold or "\\boxed" in gold) else f"${gold}$"
    gold_p = parse(gold_text, extraction_config=gold_cfg, parsing_timeout=timeout)
    if not gold_p and "$" in gold:     # stray inner "$" (a Minerva gold): read it as one formula
        gold_p = parse("$" + gold.replace("$", " ") + "$", extraction_config=gold_cfg, parsing_timeout=timeout)
    pred_p = parse("\\boxed{" + _sci_to_latex(answer) + "}",
                   extraction_config=(LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()),
                   parsing_timeout=timeout)
    if not gold_p:
        raise ValueError(f"math-verify could not parse the gold answer {gold!r}")
    return bool(verify(gold_p, pred_p, timeout_seconds=timeout))
