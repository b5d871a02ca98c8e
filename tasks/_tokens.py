"""Where a tokenizer puts its special tokens, and prompts tokenized as the official scripts do.

`tokenizer(text)` may add ids before the text's own tokens (BOS), after them (EOS, for tokenizers
built with add_eos_token or an "$A </s>" post-processor), both, or none. They are found by locating
the text's own tokens inside the full encoding of a probe. Comparing lengths instead (the first
len(full) - len(plain) ids are "the BOS") is wrong as soon as anything is appended: for an EOS-only
tokenizer it takes the probe's own first token for a BOS and prefixes every prompt with it.
"""
from __future__ import annotations

from common.errors import HarnessError

_PROBE = "a"


def special_affixes(tokenizer) -> tuple[list[int], list[int]]:
    """(prefix, suffix): the ids `tokenizer(text)` adds before and after the text's own tokens."""
    full = list(tokenizer(_PROBE)["input_ids"])
    plain = list(tokenizer(_PROBE, add_special_tokens=False)["input_ids"])
    n = len(plain)
    for start in range(len(full) - n + 1) if n else ():
        if full[start:start + n] == plain:
            return full[:start], full[start + n:]
    raise HarnessError(f"cannot tell this tokenizer's special tokens: {_PROBE!r} encodes to {plain} "
                       f"without them and to {full} with them (the text's own tokens are not a run of "
                       f"the full encoding)")


def bos_ids(tokenizer) -> list[int]:
    """The ids the tokenizer puts before a text (its BOS; [] for tokenizers that add none)."""
    return special_affixes(tokenizer)[0]


def encode_prompt(tokenizer, text: str, prefix: bool = True) -> list[int]:
    """`tokenizer(text)["input_ids"]`, what LongBench pred.py and InfiniteBench feed the model
    (special prefix and suffix included: a tokenizer that appends EOS gets it appended here too),
    except that the special prefix is left out when the text already starts with the BOS token (a
    chat template wrote it: no second BOS) or when `prefix` is False (a continuation of a prompt,
    e.g. the Quest decode tail, whose BOS the official script strips)."""
    ids = list(tokenizer(text)["input_ids"])
    pre = bos_ids(tokenizer)
    bos_in_text = bool(tokenizer.bos_token) and text.startswith(tokenizer.bos_token)
    if pre and ids[:len(pre)] == pre and (bos_in_text or not prefix):
        ids = ids[len(pre):]
    return ids
