"""Needle in a haystack, TidalDecode protocol (DerrickYLJ/TidalDecode experiments/needle_test/
needle_tools.py, itself microsoft/MInference's needle test, itself gkamradt/LLMTest_NeedleInAHaystack).

Per (length, depth, round) sample: the round's haystack is cut to fit, the needle
"\\nThe special magic {city} number is: {7-digit number}\\n" is inserted at `int(n * depth / 100)` tokens
and moved back to just after the previous '.' token (a sentence boundary; depth 100 appends at the
end), and the result is wrapped, as raw text with no chat template, in the fixed template below.
32 greedy tokens; correct = the number is a substring of the output.

Differences from the reference, on purpose:
- Lengths are exact: the prompt (BOS, template, haystack, needle, question) is `length` tokens of the
  model's tokenizer. The reference reserves `final_context_length_buffer=200` tokens for the template
  and question, so its prompts are ~140 tokens shorter than the nominal length; `buffer: 200`
  reproduces that (haystack + needle = length - buffer; the prompt length is then recorded, not fixed).
- The prompt is assembled from separately tokenized pieces (needed for exact lengths); the reference
  tokenizes the whole string, so a token may differ at the four piece boundaries.
- The reference encodes the needle and the haystack with special tokens, so Llama prompts carry a
  literal "<s>" inside the context; we add BOS once, at the start, as the tokenizer would.
- Cities and numbers come from a seeded RNG per sample (the reference uses the unseeded global RNG).

Haystacks: `noise` (built in, no data: the "grass is green" text of the passkey tests, also RULER's
noise haystack), `pg19` (the paper: PG-19 books; pg19_mini.jsonl from the liyucheng09/LatestEval
release, or the hub's emozilla/pg19-test) and `essays` (Paul Graham essays, the original NIAH
haystack). `haystack_dir`: a directory of *.txt documents (sorted by name) or a .jsonl with `text`.
As in the reference, round r concatenates the next documents until the longest length is covered,
so each round has its own haystack.
"""
from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass

from common.errors import ConfigError
from common.options import option
from tasks import datafiles, hub_data, metrics
from tasks.base import Sample, Task, register
from tasks.config import TaskConfig

# Verbatim from needle_tools.py (OURS_TEMPLATE); tests check it byte for byte.
TEMPLATE = ("Write a high-quality answer for the given question using only the provided search results "
            "(some of which might be irrelevant).\n{context}\n\nQuestion: {question} Don't give information "
            "outside the document or repeat your findings. Keep your response short and direct. Answer: ")
NEEDLE = "\nThe special magic {city} number is: {number}\n"
QUESTION = "What is the special magic {city} number?"
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
# RANDOM_NEEDLE_CITIES of needle_tools.py, duplicates kept: random.choice draws from this exact list.
CITIES = [
    "Chicago", "Yangon", "Antananarivo", "Colombo", "Almaty", "Sydney", "Chicago", "Mexico City", "Seattle",
    "Lagos", "Amsterdam", "Belgrade", "Cairo", "Baghdad", "Damascus", "Kigali", "Dakar", "Dakar", "Sofia",
    "Kigali", "Victoria", "Tashkent", "Mumbai", "Barcelona", "Almaty", "Amman", "Toronto", "Bratislava",
    "Johannesburg", "Thimphu", "Bangkok", "Santiago", "Cairo", "San Francisco", "Lagos", "Amsterdam", "Paris",
    "Rabat", "Santiago", "Copenhagen", "Madrid", "Kigali", "Ho Chi Minh City", "Sarajevo", "Delhi", "Istanbul",
    "Ho Chi Minh City", "Khartoum", "Helsinki", "Doha", "Istanbul", "Kuala Lumpur", "Budapest", "Shanghai",
    "Moscow", "Los Angeles", "Oslo", "Johannesburg", "Berlin", "Bangalore", "Tokyo", "Melbourne", "Barcelona",
    "Chicago", "Port Louis", "Lisbon", "Nairobi", "Kampala", "Lima", "Maputo", "Vancouver", "Dubai", "Khartoum",
    "Jakarta", "Madrid", "Yerevan", "Beirut", "Athens", "Chicago", "Paris", "Bucharest", "Copenhagen",
    "Brussels", "Damascus", "Seattle", "Los Angeles", "Yerevan", "Victoria", "Tunis", "Astana", "Seoul",
    "Buenos Aires", "Bangkok", "Colombo", "Brussels", "Khartoum", "Doha", "San Francisco", "Vienna", "Jakarta",
]
HAYSTACKS = ("noise", "pg19", "essays")
HUB_DEFAULTS = {"pg19": "emozilla/pg19-test"}   # essays: no canonical hub copy; pass haystack_dir
DIGITS = 7


def template_parts(question: str) -> tuple[str, str]:
    """The template text before and after {context}."""
    head, tail = TEMPLATE.split("{context}")
    return head, tail.format(question=question)


def load_documents(cfg) -> Iterator[str]:
    """Documents of a pg19/essays haystack in order (lazy: the paper's haystack only needs a few)."""
    path = cfg.get("haystack_dir")
    if path:
        path = datafiles.resolve(path)
        if path.is_dir():
            files = sorted(path.glob("*.txt"))
            if not files:
                raise ConfigError(f"task.haystack_dir {path} has no *.txt files")
            for f in files:
                yield f.read_text(encoding="utf-8")
            return
        if datafiles.is_file(path) and datafiles.plain_name(path).endswith(".jsonl"):
            with datafiles.open_text(path) as fh:
                for line in fh:
                    if line.strip():
                        yield json.loads(line)["text"]
            return
        raise ConfigError(f"task.haystack_dir {path} is neither a directory of *.txt nor a .jsonl file")
    hub_id = cfg.get("hub_id") or HUB_DEFAULTS[cfg.haystack]
    for row in hub_data.stream(hub_id, split=cfg.get("split") or "test",
                               fix="set task.haystack_dir to a folder of *.txt or a .jsonl (field text)"):
        yield row["text"]


@dataclass(frozen=True)
class NIAHConfig(TaskConfig):
    """Needle in a haystack, TidalDecode protocol (tasks/niah.py): "special magic {city} number" needle at
    a sentence boundary, raw-text template (no chat template), 32 greedy tokens, substring match.
    The run_needle_example.sh grid: lengths linspace(1000, 10000, 15) (the paper: 10K/32K/100K),
    depths round(linspace(0, 100, 10)), 5 rounds per (length, depth)."""

    seed: int = option(42, "")
    haystack: str = option("noise", "noise (built in) | pg19 (the paper) | essays (Paul Graham, original NIAH)",
                           choices=HAYSTACKS)
    haystack_dir: str | None = option(None, "directory of *.txt or a .jsonl with `text`; null = hub (pg19) / "
                                      "built in (noise)")
    hub_id: str | None = option(None, "null = emozilla/pg19-test for pg19")
    split: str = option("test", "")
    lengths: tuple[int, ...] = option((4096,), "prompt tokens, exact (template, haystack, needle and question included)")
    depths: tuple[float, ...] = option((0, 11, 22, 33, 44, 56, 67, 78, 89, 100), "percent of the haystack before "
                                 "the needle")
    rounds: int = option(5, "samples per (length, depth), each with its own haystack, city and number", min=1)
    buffer: int | None = option(None, "null = exact lengths; 200 = the reference's final_context_length_buffer",
                                min=0)
    max_new_tokens: int = option(32, "", min=1)
    decode_tail: int = option(0, "the reference generates straight after a dense prefill", min=0)
    needle_block: tuple[int, ...] | None = option(None, "[first, size]: keep the needle inside one block of `size` "
                                            "tokens starting at token `first` (Ltri-LLM figure 8's restricted "
                                            "needle: InfLLM's n_init, block_size)", min=0)

    @classmethod
    def smoke(cls) -> dict:
        return {"lengths": [512], "depths": [0, 50], "rounds": 1}


@register
class NIAH(Task):
    name = "niah"
    Config = NIAHConfig
    metric = "accuracy"

    @classmethod
    def validate(cls, cfg, model):
        super().validate(cfg, model)
        if cfg.haystack != "noise" and not cfg.get("haystack_dir") and not (cfg.get("hub_id")
                                                                           or cfg.haystack in HUB_DEFAULTS):
            raise ConfigError(f"task.haystack={cfg.haystack} needs task.haystack_dir (a directory of *.txt or a "
                              f".jsonl with `text`) or task.hub_id")
        if not cfg.lengths or not cfg.depths:
            raise ConfigError("task.lengths and task.depths must not be empty")
        for length in cfg.lengths:
            if model.too_long(int(length) + int(cfg.max_new_tokens)):
                raise ConfigError(f"task.lengths: {length} + {cfg.max_new_tokens} new tokens exceeds "
                                  f"{model.name}'s maximum of {model.max_length} tokens")
        for d in cfg.depths:
            if not 0 <= float(d) <= 100:
                raise ConfigError(f"task.depths are percentages in [0, 100], got {d}")
        buffer = cfg.get("buffer")
        if buffer is not None and not 0 <= int(buffer) < min(int(n) for n in cfg.lengths):
            raise ConfigError(f"task.buffer must be null or in [0, shortest length), got {buffer}")

    def __init__(self, cfg, tokenizer, model):
        super().__init__(cfg, tokenizer, model)
        self._period: dict[int, bool] = {}
        self._haystacks: list[list[int]] | None = None   # one token stream per round, built lazily

    # haystack --------------------------------------------------------------------------------------
    def haystack(self, round_: int) -> list[int]:
        if self._haystacks is None:
            self._haystacks = self._build_haystacks()
        return self._haystacks[round_]

    def _build_haystacks(self) -> list[list[int]]:
        """Round r takes the next documents until the longest length is covered (reference:
        read_context_files). Documents are concatenated with no separator, as the reference does;
        a huge document (a PG-19 book) is only encoded as far as needed."""
        need = max(int(n) for n in self.cfg.lengths)
        if self.cfg.haystack == "noise":
            # One stream tokenized at once so it has the merges running text would have.
            stream = self.encode(" ".join([NOISE] * (need // 8 + 16)))
            return [stream] * int(self.cfg.rounds)
        docs = load_documents(self.cfg)
        out = []
        for r in range(int(self.cfg.rounds)):
            text, toks = "", []
            for doc in docs:
                text += doc
                # ~4 characters per token: encode once the text should be long enough, then check.
                if len(text) >= 3 * need:
                    toks = self.encode(text[: 12 * need])
                    if len(toks) >= need:
                        break
            else:
                toks = self.encode(text)
                if len(toks) < need:
                    raise ConfigError(f"task.haystack={self.cfg.haystack}: the data runs out in round {r} "
                                      f"({len(toks)} < {need} tokens); lower task.rounds or the lengths")
            out.append(toks[:need])
        return out

    def is_period(self, token_id: int) -> bool:
        """A token that ends a sentence: the reference compares with encode('.'); we accept every
        token whose text ends with '.', which also covers tokenizers that merge '.' with a prefix."""
        if token_id not in self._period:
            self._period[token_id] = self.tokenizer.decode([token_id]).endswith(".")
        return self._period[token_id]

    # samples ---------------------------------------------------------------------------------------
    def samples(self):
        for length in self.cfg.lengths:
            for depth in self.cfg.depths:
                for r in range(int(self.cfg.rounds)):
                    yield self.sample(int(length), float(depth), r)

    def needle_for(self, length: int, depth: float, round_: int) -> tuple[str, str]:
        """(city, number) for one sample: seeded per sample, so a sample does not change when the
        grid around it does."""
        rng = random.Random(f"niah:{self.cfg.seed}:{length}:{depth:g}:{round_}")
        city = rng.choice(CITIES)
        number = str(rng.randint(10 ** (DIGITS - 1), 10 ** DIGITS - 1))
        return city, number

    def sample(self, length: int, depth: float, round_: int) -> Sample:
        city, number = self.needle_for(length, depth, round_)
        head_text, tail_text = template_parts(QUESTION.format(city=city))
        head = self.bos() + self.encode(head_text)
        tail = self.encode(tail_text)
        needle = self.encode(NEEDLE.format(city=city, number=number))
        buffer = self.cfg.get("buffer")
        n_hay = (length - int(buffer) if buffer is not None else length - len(head) - len(tail)) - len(needle)
        if n_hay <= 0:
            raise ConfigError(f"task.lengths: {length} tokens is too short for the NIAH template and needle")
        hay = self.haystack(round_)[:n_hay]
        at = self.insertion_point(hay, depth)
        if self.cfg.get("needle_block"):
            at = self.inside_one_block(at, len(head), len(needle), len(hay))
        ids = head + hay[:at] + needle + hay[at:] + tail
        if buffer is None:
            assert len(ids) == length, (len(ids), length)
        return Sample(
            id=f"len{length}-depth{depth:g}-r{round_}",
            input_ids=ids,
            references=[number],
            params={"length": length, "depth": depth, "round": round_, "city": city,
                    "needle_token": len(head) + at, "needle_end": len(head) + at + len(needle),
                    "haystack": self.cfg.haystack},
            max_new_tokens=int(self.cfg.max_new_tokens),
            decode_tail=int(self.cfg.decode_tail),
        )

    def insertion_point(self, hay: list[int], depth: float) -> int:
        """Token index of the needle in the haystack: int(n * depth / 100), then back to just after
        the previous period token (0 when there is none); depth 100 = the end."""
        if depth >= 100:
            return len(hay)
        at = int(len(hay) * depth / 100)
        while at > 0 and not self.is_period(hay[at - 1]):
            at -= 1
        return at

    def inside_one_block(self, at: int, offset: int, n_needle: int, n_hay: int) -> int:
        """Ltri-LLM's restricted needle (figure 8): with needle_block [start, size] (InfLLM's blocks: n_init,
        block_size), a needle that would straddle a block boundary moves back to the start of its
        first block, so that it lies in one block. A needle longer than a block is refused."""
        first, size = (int(x) for x in self.cfg.needle_block)
        if n_needle > size:
            raise ConfigError(f"task.needle_block: the needle ({n_needle} tokens) is longer than a block ({size})")
        start = offset + at
        if start < first:
            return at
        block = (start - first) // size
        if (start + n_needle - 1 - first) // size != block:
            at = max(0, first + block * size - offset)
        return min(at, n_hay)

    # scoring ---------------------------------------------------------------------------------------
    def score(self, sample, prediction):
        return {"accuracy": metrics.substring_match(prediction, sample.references[0])}

    def group_by(self):
        return ["length", "depth"]

    def describe(self):
        return {"task": self.name, "protocol": "tidaldecode/minference needle_test",
                "scorer": "substring match of the 7-digit number", "haystack": self.cfg.haystack,
                "buffer": self.cfg.get("buffer"), "chat_template": False,
                "decode_tail": int(self.cfg.decode_tail)}
