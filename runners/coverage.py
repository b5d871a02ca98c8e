"""How much of what it saw a run's method attended: the check that a sparse run measured sparsity.

A budgeted method whose budget covers the whole prompt (the YAML default of 4096 keys on the embedded
model's ~4K-token RULER and NIAH prompts) is full attention under another name. Every row records
the keys each layer attended in the last decode step (`attended.attended_mean`, methods.base.stats);
divided by the tokens the sequence held at that step (prompt + generated) it is the row's attended
fraction. The summary keeps the mean over rows, and a run of a sparse method at or above
WARN_FRACTION says so on stderr and in summary.json.
"""
from __future__ import annotations

WARN_FRACTION = 0.95
# Methods whose decode step attends every token by design: their fraction is recorded, never warned.
DENSE_DECODE = ("full",)


def row_fraction(row: dict) -> float | None:
    """Keys attended in the last decode step / tokens of the sequence then; None without decode stats."""
    mean = (row.get("attended") or {}).get("attended_mean")
    seen = int(row.get("input_tokens") or 0) + max(int(row.get("output_tokens") or 0) - 1, 0)
    if not isinstance(mean, (int, float)) or seen <= 0:
        return None
    return float(mean) / seen


def summarize(rows: list[dict], method: str, semantics: dict) -> dict | None:
    """{"mean_fraction", "mean_attended", "mean_tokens", "n", "warning"?}; None when no row has decode
    stats (prefill-only tasks, NLL in stride mode)."""
    pairs = [(row_fraction(r), r) for r in rows]
    pairs = [(f, r) for f, r in pairs if f is not None]
    if not pairs:
        return None
    n = len(pairs)
    frac = sum(f for f, _ in pairs) / n
    attended = sum(float(r["attended"]["attended_mean"]) for _, r in pairs) / n
    tokens = sum(int(r.get("input_tokens") or 0) + max(int(r.get("output_tokens") or 0) - 1, 0) for _, r in pairs) / n
    out = {"mean_fraction": round(frac, 4), "mean_attended": round(attended, 1), "mean_tokens": round(tokens, 1),
           "n": n}
    dense = method in DENSE_DECODE or semantics.get("decode") == "dense"
    if frac >= WARN_FRACTION and not dense:
        budget = semantics.get("budget")
        hint = (f"method.budget={budget} covers the ~{tokens:.0f}-token sequences: lower it (e.g. "
                f"method.budget={_suggest(tokens)}) or lengthen the prompts (task.lengths)") if budget else \
            "its options keep (nearly) every token at these lengths"
        out["warning"] = (f"{method} attended {frac:.0%} of the tokens it saw (mean {out['mean_attended']:.0f} of "
                          f"{out['mean_tokens']:.0f} "
                          f"over {n} samples): this run measures full attention, not sparsity; {hint}")
    return out


def _suggest(tokens: float) -> int:
    """A power of two at most an eighth of the sequence (at least 64)."""
    k = 64
    while k * 2 <= tokens / 8:
        k *= 2
    return k
