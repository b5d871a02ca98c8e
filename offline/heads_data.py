"""Training data for head identification: multiple passkeys in a book (LycheeDecode
src/train/passkey_retrieval.py, adapted from DuoAttention duo_attn/data.py).

Reference behaviour kept: the haystack is the concatenated books cut to `context_max` tokens and
every sample uses its PREFIX (only the passkeys change); sample i of an epoch has context length
linspace(context_min, context_max, n_lengths)[i] (epochs shuffled); `num_passkeys` passkeys of
`passkey_length` NATO words each, inserted (between separators) at sorted depths drawn without
replacement from linspace(depth_min, depth_max, n_depths); the prompt starts "<|im_start|> This is a
very long story book: <book> " (BOS added if the tokenizer adds one), the context ends " </book>.\n\n"
after the reference's padding (its precedence slip always appends 1-16 haystack-tail tokens); the
labels (the tokens the student is distilled on) are, per passkey, the question + the passkey + the
separator. The needle keeps the reference's "Remeber". The haystack here is PG-19 books from
data/pg19_books (the reference used BookSum from togethercomputer/Long-Data-Collections).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from common.errors import ConfigError
from tasks import datafiles

NATO = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliett", "kilo",
        "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango", "uniform", "victor",
        "whiskey", "xray", "yankee", "zulu"]
ORDINALS = ["first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth",
            "eleventh", "twelfth", "thirteenth", "fourteenth", "fifteenth", "sixteenth", "seventeenth",
            "eighteenth", "nineteenth", "twentieth"]
NEEDLE = "Remeber this sequence of words, it's the {ordinal} passkey to the vault: "
QUESTION = "Based on the content of the book, what is the {ordinal} passkey to the vault?\nPasskey: "
PROMPT1 = "<|im_start|> This is a very long story book: <book> "
PROMPT2 = " </book>.\n\n"
SEPARATOR = "\n\n"


def load_books(path: Path, splits: list[str] | None, max_chars: int) -> str:
    """Books of a PG-19-style jsonl (`text`, `pg19_split`) concatenated in file order, up to max_chars."""
    if not datafiles.is_file(path):
        raise ConfigError(f"data.books={path} does not exist (PG-19 books: data/pg19_books/pg19_books.jsonl)")
    out, n = [], 0
    with datafiles.open_text(path) as f:    # the repository's copy is stored as FILE.xz
        for line in f:
            row = json.loads(line)
            if splits and row.get("pg19_split") not in splits:
                continue
            out.append(row["text"])
            n += len(row["text"])
            if n >= max_chars:
                break
    if not out:
        raise ConfigError(f"no books in {path} for splits {splits}")
    return "".join(out)


class PasskeyBook:
    def __init__(self, tokenizer, haystack_text: str, *, context_min: int, context_max: int, n_lengths: int,
                 num_passkeys: int, passkey_length: int, depth_min: float, depth_max: float, n_depths: int,
                 seed: int, buffer: int = 300):
        if num_passkeys > len(ORDINALS):
            raise ConfigError(f"data.num_passkeys={num_passkeys} exceeds {len(ORDINALS)} (the ordinals the prompts use)")
        if n_depths < num_passkeys:
            raise ConfigError(f"data.n_depths={n_depths} must be >= num_passkeys={num_passkeys}")
        self.tok = tokenizer
        self.lengths = torch.linspace(context_min, context_max, n_lengths).to(torch.int).tolist()
        self.depths = torch.linspace(depth_min, depth_max, n_depths)
        self.num_passkeys, self.passkey_length = num_passkeys, passkey_length
        self.gen = torch.Generator().manual_seed(seed)
        enc = lambda s, special=False: self.tok.encode(s, add_special_tokens=special)
        self.needles = [enc(NEEDLE.format(ordinal=o)) for o in ORDINALS[:num_passkeys]]
        self.questions = [enc(QUESTION.format(ordinal=o)) for o in ORDINALS[:num_passkeys]]
        self.sep, self.p1, self.p2 = enc(SEPARATOR), enc(PROMPT1, True), enc(PROMPT2)
        hay = enc(haystack_text[: context_max * 12])[:context_max]
        sample_key = enc(self._passkey())
        other = len(self.p1) + len(self.p2) + (2 * len(self.sep) + len(self.needles[0]) + len(self.questions[0])
                                               + len(sample_key)) * num_passkeys
        if len(hay) + other > context_max - buffer:   # reference buffer_size = 300
            hay = hay[: max(0, context_max - buffer - other)]
        if len(hay) < context_min // 2:
            raise ConfigError(f"data: context_max={context_max} leaves only {len(hay)} haystack tokens for "
                              f"{num_passkeys} passkeys of {passkey_length} words; raise context_max or lower them")
        self.hay = hay
        self._order: list[int] = []

    def _passkey(self) -> str:
        return " ".join(NATO[i] for i in torch.randint(0, len(NATO), (self.passkey_length,), generator=self.gen))

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(context ids [1, C], label ids [1, T]) of the next sample (epochs of shuffled lengths)."""
        if not self._order:
            self._order = torch.randperm(len(self.lengths), generator=self.gen).tolist()
        return self.sample(self.lengths[self._order.pop()])

    def sample(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        pick = torch.randperm(len(self.depths), generator=self.gen)[: self.num_passkeys]
        depths = self.depths[pick].sort().values.tolist()
        keys = [self.tok.encode(self._passkey(), add_special_tokens=False) for _ in range(self.num_passkeys)]
        hay = self.hay[:length]
        context, last = [], 0
        for i, (d, key) in enumerate(zip(depths, keys)):
            at = int(len(hay) * d)
            context += hay[last:at] + self.sep + self.needles[i] + key + self.sep
            last = at
        context += hay[last:]
        labels = [t for i, key in enumerate(keys) for t in self.questions[i] + key + self.sep]
        context = self.p1 + context
        pad = 16 - (len(context) + len(labels) + len(self.p2)) % 16   # 1..16: the reference always pads
        context += self.hay[-pad:] + self.p2
        return torch.tensor([context]), torch.tensor([labels])
