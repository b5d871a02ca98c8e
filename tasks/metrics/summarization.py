"""Cascading passkey digit accuracy and ROUGE with the rouge-score package (Booksum)."""
from __future__ import annotations


def passkey_digit_accuracy(prediction: str, target: str) -> float:
    """Cascading KV Cache passkey score (jeffwillette/cascading_kv_cache cascade/main/jobs/passkey.py
    `get_numbers`): keep the characters of the output for which `str.isdigit()` is true, take the first
    len(target), right-pad with "A" (never a digit, so missing digits count as wrong) and compare
    position by position. Returns correct / len(target); the per-"{length}-{loc}" accuracy is the mean
    of this over the bin's samples (same digit count each). `isdigit` as in the reference: a "²" or a
    full-width "５" takes a digit position (and never equals an ASCII target digit)."""
    digits = "".join(c for c in prediction if c.isdigit())[: len(target)]
    digits = digits.ljust(len(target), "A")
    return sum(a == b for a, b in zip(digits, target)) / len(target)


ROUGE_TYPES = ("rouge1", "rouge2", "rougeL", "rougeLsum")


_ROUGE_SCORERS: dict = {}   # (types, use_stemmer) -> RougeScorer; building one loads the stemmer


def _rouge_scorer(types: tuple[str, ...], use_stemmer: bool):
    key = (types, use_stemmer)
    if key not in _ROUGE_SCORERS:
        from rouge_score import rouge_scorer  # optional dependency: only summarization tasks need it

        _ROUGE_SCORERS[key] = rouge_scorer.RougeScorer(list(types), use_stemmer=use_stemmer)
    return _ROUGE_SCORERS[key]


def rouge_scores(prediction: str, reference: str, types: tuple[str, ...] = ROUGE_TYPES,
                 use_stemmer: bool = True, precision_recall: bool = False) -> dict[str, float]:
    """Booksum: Google `rouge-score` (not LongBench's PyPI `rouge`) F-measure x100 per type, the
    de-facto setting (use_stemmer=True, per-sample scores averaged by the caller). `rougeLsum` splits sentences on newlines only, as rouge-score does.
    With `precision_recall`, also `<type>_p` / `<type>_r` (x100): Cascading reported R/P/F.
    Empty prediction or reference -> 0 (rouge-score's own convention)."""
    scores = _rouge_scorer(tuple(types), bool(use_stemmer)).score(reference, prediction)  # target first
    out: dict[str, float] = {}
    for t in types:
        out[t] = 100.0 * float(scores[t].fmeasure)
        if precision_recall:
            out[f"{t}_p"] = 100.0 * float(scores[t].precision)
            out[f"{t}_r"] = 100.0 * float(scores[t].recall)
    return out
