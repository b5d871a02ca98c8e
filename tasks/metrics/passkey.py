"""Passkey and NIAH scorers (Landmark/Quest first integer, TidalDecode substring match)."""
from __future__ import annotations

import re

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
