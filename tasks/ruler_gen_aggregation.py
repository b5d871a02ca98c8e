"""RULER's aggregation generators (NVIDIA/RULER scripts/data/synthetic/{common_words_extraction,
freq_words_extraction}.py) on the base of tasks/ruler_gen.py (same conventions: `build` is RULER's
`generate_input_output`, RULER's random calls in RULER's order)."""
from __future__ import annotations

import math
import random
import string

import numpy as np

from common.errors import ConfigError
from tasks import ruler_data as data
from tasks.ruler_gen import Generator


class CommonWords(Generator):
    key, unit = "common_words_extraction", "words"

    def __init__(self, args, wrap, seed, cfg, max_seq_length):
        super().__init__(args, wrap, seed, cfg, max_seq_length)
        self.words = list(data.cwe_words())
        random.Random(seed).shuffle(self.words)
        self.randle = data.english_words(cfg.get("english_words_path"))

    def incremental(self) -> int:
        return 10

    def estimate_units(self) -> int:
        return 4096

    def upper_bound(self, tokens_per_unit):
        return int(self.length // tokens_per_unit) * 2

    def max_units(self):
        return None if self.randle is not None else len(self.words)

    def cap_error(self):
        return (f"RULER cwe at length {self.length} needs more than the {len(self.words)} wonderwords "
                f"words: set task.english_words_path to RULER's json/english_words.json")

    def _example(self, num_words, common_repeats, uncommon_repeats, common_nums, rng):
        if num_words <= len(self.words):
            full = rng.sample(self.words, num_words)
        elif self.randle is not None:
            full = rng.sample(self.randle, num_words)
        else:
            raise ConfigError(f"RULER cwe at length {self.length} needs more than the {len(self.words)} "
                              f"wonderwords words: set task.english_words_path to RULER's json/english_words.json")
        common, uncommon = full[:common_nums], full[common_nums:]
        word_list = common * int(common_repeats) + uncommon * int(uncommon_repeats)
        random.Random(self.seed).shuffle(word_list)
        return " ".join(f"{i + 1}. {w}" for i, w in enumerate(word_list)), common

    def build(self, n, rng, nprng, index):
        a, shots = self.args, []
        if self.length < 4096:
            for _ in range(a["num_fewshot"]):
                shots.append(self._example(20, 3, 1, a["num_cw"], rng))
            context, answer = self._example(n, 6, 1, a["num_cw"], rng)
        else:
            for _ in range(a["num_fewshot"]):
                shots.append(self._example(40, 10, 3, a["num_cw"], rng))
            context, answer = self._example(n, a["freq_cw"], a["freq_ucw"], a["num_cw"], rng)
        # RULER formats the few-shot example with the full template, model wrapper included.
        shots = [self.template.format(num_cw=a["num_cw"], context=c, query="") + " "
                 + " ".join(f"{i + 1}. {w}" for i, w in enumerate(ans)) for c, ans in shots]
        text = self.template.format(num_cw=a["num_cw"], context=context, query="")
        return "\n".join(shots) + "\n" + text, answer


def zeta(s: float) -> float:
    """Riemann zeta (scipy.special.zeta in RULER). s=2 (RULER's alpha) is pi^2/6, equal to scipy's
    value to the last bit; other s use Euler-Maclaurin with N=64 terms (error < 1e-15)."""
    if s == 2.0:
        return math.pi ** 2 / 6
    if s <= 1:
        raise ConfigError(f"fwe alpha must be > 1, got {s}")
    n = 64
    total = sum(k ** -s for k in range(1, n))
    tail = n ** (1 - s) / (s - 1) + n ** -s / 2 + s * n ** (-s - 1) / 12 \
        - s * (s + 1) * (s + 2) * n ** (-s - 3) / 720
    return total + tail


class FreqWords(Generator):
    """freq_words_extraction.py. RULER sizes this task with a linear search that ignores the
    generation budget (prompt alone <= length, up to 1/32 below it); we size it like the other
    tasks (prompt + tokens_to_generate <= length, binary search over the word count)."""
    key, unit = "freq_words_extraction", "words"

    def __init__(self, args, wrap, seed, cfg, max_seq_length):
        super().__init__(args, wrap, seed, cfg, max_seq_length)
        vs = args.get("vocab_size", -1)
        self.vocab_size = max_seq_length // 50 if vs == -1 else vs

    def incremental(self) -> int:
        return max(self.length // 32, 1)

    def build(self, n, rng, nprng, index):
        a, wl = self.args, self.args.get("coded_wordlen", 6)
        vocab = ["".join(rng.choices(string.ascii_lowercase, k=wl)) for _ in range(self.vocab_size)]
        while len(set(vocab)) < self.vocab_size:
            vocab.append("".join(rng.choices(string.ascii_lowercase, k=wl)))
        vocab = sorted(set(vocab))
        random.Random(self.seed).shuffle(vocab)
        vocab[0] = "..."   # RULER: the top-ranked word is noise
        k = np.arange(1, len(vocab) + 1)
        counts = n * (k ** -a["alpha"]) / zeta(a["alpha"])
        words = [w for w, c in zip(vocab, counts.astype(int)) for _ in range(c)]
        random.Random(self.seed).shuffle(words)
        return self.template.format(context=" ".join(words), query=""), vocab[1:4]
