"""Official scorers, one section per benchmark, each reproducing the benchmark's own definition
(source file named in each section). Tested against hand-made cases in tests/test_metrics_*.py.

Sections are owned by different task files; keep each scorer in its section.
"""
from __future__ import annotations

import re

# --- passkey / NIAH (Landmark, Quest, TidalDecode) -------------------------------------------------


def first_integer(text: str) -> int | None:
    """The first run of digits in `text` as an int (Landmark/Quest passkey parsing), or None."""
    m = re.search(r"\d+", text)
    return int(m.group()) if m else None


def passkey_exact(prediction: str, passkey: int) -> float:
    """1.0 if the first integer in the output equals the pass key (Landmark/Quest definition)."""
    return float(first_integer(prediction) == passkey)


def substring_match(prediction: str, needle: str) -> float:
    """1.0 if the needle value appears in the output (TidalDecode NIAH)."""
    return float(needle in prediction)


# --- LongBench (THUDM/LongBench LongBench/metrics.py, eval.py) --------------------------------------

# --- InfiniteBench (OpenBMB/InfiniteBench src/compute_scores.py) ------------------------------------

# --- RULER (NVIDIA/RULER scripts/eval/synthetic/constants.py) ---------------------------------------

# --- Cascading passkey digit accuracy, Booksum ROUGE (rouge-score) ----------------------------------

# --- math (R1-distill protocol: last \boxed{}, math-verify) -----------------------------------------
