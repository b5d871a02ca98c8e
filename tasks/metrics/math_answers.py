"""Math answers: brace-balanced last \\boxed{} and math-verify equivalence (R1-distill protocol)."""
from __future__ import annotations

import re

def last_boxed(text: str) -> str | None:
    """Content of the LAST `\\boxed{...}` / `\\fbox{...}` in `text`, braces matched so nested groups
    (`\\boxed{\\frac{1}{2}}`) survive; `\\boxed 5` (no braces) gives the token after the space. Same
    contract as hendrycks `last_boxed_only_string` + `remove_boxed`; None when absent or unbalanced.
    Regex/split extractors (`[^}]*`) cut nested braces: that is why this walks the string."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    i = start + (len("\\boxed") if text.startswith("\\boxed", start) else len("\\fbox"))
    if i < len(text) and text[i] == " ":                         # "\boxed 5": up to "$" or whitespace
        m = re.match(r"\s*([^\s$]+)", text[i:])
        return m.group(1) if m else None
    while i < len(text) and text[i].isspace():
        i += 1
    if i >= len(text) or text[i] != "{":
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1: j]
    return None


_SCI = re.compile(r"\s*([+-]?\d+(?:\.\d+)?)[eE]([+-]?\d+)\s*")


def _sci_to_latex(ans: str) -> str:
    """`4.5e33` -> `4.5\\times 10^{33}`. math-verify reads a bare `e` as Euler's number, and Minerva
    Math golds use this notation (58 of 272); only a whole-answer match is rewritten."""
    m = _SCI.fullmatch(ans)
    return f"{m.group(1)}\\times 10^{{{int(m.group(2))}}}" if m else ans


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
