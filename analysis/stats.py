"""Uncertainty of a cell's mean over its samples: the Wilson score interval for 0/1 metrics
(accuracy), the normal approximation otherwise. No dependency: the formulas are short."""
from __future__ import annotations

import math
from collections.abc import Sequence

Z95 = 1.959963984540054      # the 97.5% quantile of the standard normal


def wilson(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (successes out of n), as fractions."""
    if n <= 0:
        raise ValueError("wilson: n must be positive")
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def interval(values: Sequence[float], z: float = Z95) -> tuple[float, float, str] | None:
    """(low, high, method) of the mean of per-sample values: Wilson when every value is 0 or 1,
    else mean +- z * sd / sqrt(n) ("normal"), clipped to [0, 1] when every value lies there (a mean of
    per-sample accuracies or F1s cannot leave it). None without samples."""
    vals = [float(v) for v in values]
    n = len(vals)
    if n == 0:
        return None
    if all(v in (0.0, 1.0) for v in vals):
        lo, hi = wilson(sum(vals), n, z)
        return lo, hi, "wilson"
    mean = sum(vals) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1)) if n > 1 else float("inf")
    half = z * sd / math.sqrt(n)
    if all(0.0 <= v <= 1.0 for v in vals):
        return max(0.0, mean - half), min(1.0, mean + half), "normal"
    return mean - half, mean + half, "normal"


def token_ppl(nll_sums: Sequence[float], tokens: Sequence[int], z: float = Z95) -> dict | None:
    """Token-weighted perplexity exp(sum NLL / sum tokens) over books (the references' nll-total /
    count-total) with a 95% interval from the books as clusters (ratio estimator); unbounded for one
    book. {"ours", "ci_lo", "ci_hi", "ci", "n"}; None without books."""
    N, n = sum(tokens), len(tokens)
    if n == 0 or N == 0:
        return None
    mean = sum(nll_sums) / N
    if n > 1:
        half = z * math.sqrt(n / (n - 1) * sum((a - mean * t) ** 2 for a, t in zip(nll_sums, tokens)) / N ** 2)
        lo, hi = math.exp(mean - half), math.exp(mean + half)
    else:
        lo, hi = -math.inf, math.inf
    return {"ours": math.exp(mean), "ci_lo": lo, "ci_hi": hi, "ci": "books", "n": n}
