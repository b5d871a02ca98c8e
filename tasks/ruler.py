"""RULER (NVIDIA/RULER): the 13 synthetic long-context tasks, generated per tokenizer and per
length as RULER's scripts/data/prepare.py does, scored with RULER's string_match_all / _part.

Per (task, length): the haystack size is found by binary search so that the prompt (model
wrapper + task template + answer prefix, tokenized as the engine will see it) plus the task's
tokens_to_generate fits the length; then each sample is generated from its own seed and shrunk
if it does not fit. Protocol details and where they differ from RULER are in `describe()` and in
the generator docstrings (tasks/ruler_gen.py, tasks/ruler_gen_aggregation.py).
"""
from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass
from typing import Any

import numpy as np

from common.errors import ConfigError
from common.options import option
from tasks.base import ModelSpec, Sample, Task, averaged_over, register, round_robin
from tasks.config import TaskConfig
from tasks.metrics import RULER_METRICS, ruler_postprocess
from tasks.ruler_gen import QA, Niah, VariableTracking
from tasks.ruler_gen_aggregation import CommonWords, FreqWords
from tasks.ruler_spec import (
    METRIC,
    MODEL_TEMPLATES,
    PRESETS,
    PROMPT_VERSIONS,
    TASKS,
    TEMPLATES,
)

GENERATORS = {"niah": Niah, "variable_tracking": VariableTracking, "common_words_extraction": CommonWords,
              "freq_words_extraction": FreqWords, "qa": QA}

_MARK = "\x00RULER_TASK_TEMPLATE\x00"


def resolve_tasks(spec) -> list[str]:
    """`tasks` is a preset name (all | synthetic) or a list of RULER task names (presets allowed)."""
    items = [spec] if isinstance(spec, str) else list(spec)
    out: list[str] = []
    for it in items:
        names = PRESETS.get(it, [it])
        for n in names:
            if n not in TASKS:
                raise ConfigError(f"unknown RULER task {n!r}; known: {', '.join(TASKS)} "
                                  f"or presets {', '.join(PRESETS)}")
            if n not in out:
                out.append(n)
    if not out:
        raise ConfigError("task.tasks is empty")
    return out


def derive_seed(*parts) -> int:
    """A stable 63-bit seed from the task seed and the sample's coordinates (not Python's hash,
    which changes between processes)."""
    h = hashlib.sha256("/".join(str(p) for p in parts).encode()).hexdigest()
    return int(h[:16], 16) >> 1


def _escape_twice(s: str) -> str:
    # The wrapper goes through str.format twice (RULER: once with task_template, once with the
    # context): a chat template's own braces must survive both.
    return s.replace("{", "{{{{").replace("}", "}}}}")


@dataclass(frozen=True)
class RulerConfig(TaskConfig):
    """RULER (NVIDIA/RULER): 13 synthetic long-context tasks, generated per tokenizer and length."""

    seed: int = option(42, "RULER's --random_seed; every sample derives its own seed from it")
    tasks: str | tuple[str, ...] = option(
        ("niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2",
         "niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe", "qa_1", "qa_2"),
        "RULER task names, or a preset: all (these 13) | synthetic (no download)")
    lengths: tuple[int, ...] = option((4096,), "prompt + tokens_to_generate <= length, in the model's tokens")
    samples_per_task: int = option(500, "RULER's NUM_SAMPLES (papers often use 100-200)", min=1)
    template: str = option("auto", "auto (hf for chat models, else base) | hf | base | RULER wrapper name "
                           "(meta-llama3, meta-chat, ...)", choices=("auto", "hf", *MODEL_TEMPLATES))
    prompt_version: str = option("original", "original: RULER's prompts as released (vt answer prefix \"... "
                                 "variables are assgined the value ...\", what Ltri-LLM / LycheeDecode ran); "
                                 "fixed: upstream's later correction to \"assigned\" (@c3f5e3b)",
                                 choices=tuple(PROMPT_VERSIONS))
    remove_newline_tab: bool = option(False, "RULER's REMOVE_NEWLINE_TAB")
    essay_path: str | None = option(None, "RULER's PaulGrahamEssays.json ({\"text\": ...}); null = the hub copy "
                                    "below")
    essay_hub_id: str = option("baber/paul_graham_essays", "")
    sentence_splitter: str = option("punkt", "punkt (nltk's pretrained model, as RULER; needs nltk punkt_tab "
                                    "data) | punkt_untrained", choices=("punkt", "punkt_untrained"))
    data_dir: str | None = option(None, "folder with squad.json (SQuAD v2 dev) and hotpotqa.json (HotpotQA dev "
                                  "distractor); null = hub")
    english_words_path: str | None = option(None, "RULER's json/english_words.json: only cwe at lengths beyond "
                                            "the wonderwords lists needs it")

    @classmethod
    def smoke(cls) -> dict:
        return {"tasks": "synthetic", "lengths": [1024], "samples_per_task": 1, "template": "base",
                "sentence_splitter": "punkt_untrained"}


@register
class Ruler(Task):
    name = "ruler"
    Config = RulerConfig
    metric = "score"

    @classmethod
    def subset_names(cls) -> list[str]:
        return list(TASKS)

    def perfect(self, sample: Sample) -> str:
        return " ".join(sample.references)      # every needle's value: string_match_all scores it 1

    @classmethod
    def validate(cls, cfg, model: ModelSpec) -> None:
        super().validate(cfg, model)
        resolve_tasks(cfg.get("tasks", "all"))
        lengths = list(cfg.get("lengths") or [])
        if not lengths:
            raise ConfigError("task.lengths is empty")
        for L in lengths:
            if not isinstance(L, int) or L <= 0:
                raise ConfigError(f"task.lengths must be positive integers, got {L!r}")
            if model.too_long(L):
                raise ConfigError(f"RULER length {L} exceeds model {model.name}'s max_length {model.max_length}")
        tmpl = cfg.get("template", "auto")
        if tmpl == "hf" and not model.chat_template:
            raise ConfigError(f"task.template=hf but model {model.name} is not a chat model (chat_template: false)")

    def __init__(self, cfg, tokenizer, model: ModelSpec):
        super().__init__(cfg, tokenizer, model)
        self.tasks = resolve_tasks(cfg.get("tasks", "all"))
        self.lengths = [int(L) for L in cfg.lengths]
        self.n_samples = int(cfg.samples_per_task)
        self.seed = int(cfg.get("seed", 42))
        self.template_name, self.wrap = self._wrapper(cfg.get("template", "auto"))
        self._bos = self.bos()
        self._state: dict = {}

    # prompt assembly --------------------------------------------------------------------------
    def _wrapper(self, name: str) -> tuple[str, str]:
        """RULER's template.py wraps the task template in the model's chat format; `hf` builds
        that wrapper from the tokenizer's own chat template (one user turn, generation prompt)."""
        if name == "auto":
            name = "hf" if self.model.chat_template and getattr(self.tokenizer, "chat_template", None) else "base"
        if name != "hf":
            return name, MODEL_TEMPLATES[name]
        if not getattr(self.tokenizer, "chat_template", None):
            raise ConfigError(f"task.template=hf but the tokenizer of {self.model.name} has no chat template")
        text = self.tokenizer.apply_chat_template([{"role": "user", "content": _MARK}], tokenize=False,
                                                  add_generation_prompt=True)
        pre, post = text.split(_MARK)
        return name, _escape_twice(pre) + "{task_template}" + _escape_twice(post)

    def ids(self, text: str) -> list[int]:
        """Token ids as the engine receives them: BOS (if the tokenizer adds one and the wrapper
        did not already write it) + the text. RULER's HF client would add a second BOS after a
        wrapper that writes one; we do not."""
        ids = self.encode(text)
        if self._bos and ids[:len(self._bos)] != self._bos:
            ids = self._bos + ids
        return ids

    # generation -------------------------------------------------------------------------------
    def _rngs(self, *coords) -> tuple[random.Random, np.random.RandomState]:
        s = derive_seed("ruler", self.seed, *coords)
        return random.Random(s), np.random.RandomState(s % 2 ** 32)

    def _prepare(self, task: str, length: int):
        """Build the generator and find its haystack size for this length (cached)."""
        key = (task, length)
        if key in self._state:
            return self._state[key]
        spec = TASKS[task]
        gen = GENERATORS[spec["task"]](dict(spec["args"]), self.wrap, self.seed, self.cfg, length)
        if spec["task"] == "variable_tracking":
            gen.make_icl(*self._rngs(task, "icl"), count=lambda t: len(self.encode(t)))
        ttg = gen.tokens_to_generate
        rng, nprng = self._rngs(task, length, "search")

        def tokens(n: int) -> int:
            return len(self.ids(gen.build(n, rng, nprng, 0)[0]))

        probe = gen.estimate_units()
        probe_tokens = tokens(probe)
        inc, floor, cap = gen.incremental(), gen.min_units(0), gen.max_units()
        lo, hi = max(inc, floor), max(gen.upper_bound(probe_tokens / probe), inc * 2)
        if cap is not None:
            hi = min(hi, cap)
        best = self._search(tokens, lo, hi, length - ttg)
        if best is None:   # RULER would fall back to `incremental` and loop forever; search below it
            best = self._search(tokens, floor, lo - 1, length - ttg)
        if best is None:
            raise ConfigError(f"RULER {task}: even {floor} {gen.unit} exceed length {length} "
                              f"(with {ttg} tokens to generate); raise task.lengths")
        if cap is not None and best == cap:
            raise ConfigError(gen.cap_error())
        best_tokens = tokens(best)
        per_unit = (best_tokens - probe_tokens) / (best - probe) if best != probe else probe_tokens / probe
        self._state[key] = (gen, best, max(per_unit, 1e-3))
        return self._state[key]

    @staticmethod
    def _search(tokens, lo: int, hi: int, budget: int) -> int | None:
        """The largest n in [lo, hi] whose prompt fits `budget` tokens (RULER's binary search)."""
        best = None
        while lo <= hi:
            mid = (lo + hi) // 2
            if tokens(mid) <= budget:
                best, lo = mid, mid + 1
            else:
                hi = mid - 1
        return best

    def render(self, task: str, length: int, index: int) -> tuple[str, list[str], list[int], int]:
        """One sample's prompt text, gold answers, token ids and haystack size.

        RULER builds each sample at the task's haystack size and, if it does not fit, retries
        with `incremental` fewer units (25 noise lines, 500 essay words), so samples can fall
        several percent short. We re-search the size per sample instead: every build of sample
        `index` restarts from its own seed (so its content is a function of the size only), and
        the largest size that fits is kept once it is within 0.5% of the budget or the next
        unit would not fit."""
        gen, n_fit, per_unit = self._prepare(task, length)
        budget = length - gen.tokens_to_generate
        floor, cap = gen.min_units(index), gen.max_units()
        tol = max(1, length // 200)

        def build(n: int):
            rng, nprng = self._rngs(task, length, index)
            text, answers = gen.build(n, rng, nprng, index)
            return text, answers, self.ids(text)

        best, fail, n = None, None, max(n_fit, floor)      # best: (n, built) largest that fits
        for _ in range(64):
            built = build(n)
            slack = budget - len(built[2])
            if slack >= 0:
                if best is None or n > best[0]:
                    best = (n, built)
                if slack <= tol:
                    break
            elif fail is None or n < fail:
                fail = n
            lower = best[0] + 1 if best else floor
            upper = fail - 1 if fail is not None else (cap if cap is not None else 1 << 40)
            if lower > upper:
                break
            step = slack / per_unit                         # Newton step on tokens per unit
            cand = n + (int(step) or 1 if slack >= 0 else -max(1, math.ceil(-step)))
            n = cand if lower <= cand <= upper else (lower + upper) // 2
        if best is None:
            raise ConfigError(f"RULER {task} sample {index}: {floor} {gen.unit} already exceed "
                              f"length {length} with {gen.tokens_to_generate} tokens to generate; "
                              f"raise task.lengths")
        n, (text, answers, ids) = best
        if self.cfg.get("remove_newline_tab", False):
            text = " ".join(text.replace("\n", " ").replace("\t", " ").strip().split())
            ids = self.ids(text)
        return text, list(answers), ids, n

    def _sample(self, task: str, length: int, index: int) -> Sample:
        gen = self._prepare(task, length)[0]
        text, answers, ids, n = self.render(task, length, index)
        cut = text.rfind(TEMPLATES[gen.key]["answer_prefix"][:10])   # as RULER splits it off
        return Sample(
            id=f"{task}/{length}/{index}", input_ids=ids, references=answers,
            params={"subtask": task, "length": length, "index": index, "haystack": n,
                    "metric": METRIC[gen.key], "tokens_to_generate": gen.tokens_to_generate},
            max_new_tokens=gen.tokens_to_generate,
            extra={"answer_prefix": text[cut:]},
        )

    def samples(self):
        for length in self.lengths:
            for task in self.tasks:
                for i in range(self.n_samples):
                    yield self._sample(task, length, i)

    def spread(self, limit: int):
        """Per length, the subtasks in turn (`task.limit=2`: the first sample of two subtasks), and no
        more than `limit` prompts built per length."""
        for length in self.lengths:
            yield from round_robin([self._stream(t, length) for t in self.tasks], limit)

    def _stream(self, task: str, length: int):
        for i in range(self.n_samples):
            yield self._sample(task, length, i)

    # scoring ----------------------------------------------------------------------------------
    def score(self, sample: Sample, prediction: str) -> dict[str, float]:
        pred = ruler_postprocess(prediction)
        fn = RULER_METRICS[sample.params["metric"]]
        return {"score": fn(pred, sample.references), "null": float(len(pred) == 0)}

    def group_by(self) -> list[str]:
        return ["subtask", "length"]

    def summarize(self, rows: list[dict]) -> dict[str, Any]:
        """RULER's tables: per length, each task's mean x100 (rounded to 2, as RULER's
        evaluate.py) and their average; nulls = empty predictions. `score` averages the
        per-length averages."""
        import pandas as pd

        if not rows:
            return {"n": 0}
        df = pd.json_normalize(rows)
        out: dict[str, Any] = {"n": len(df), "scale": "percent (0-100)", "by_length": {}}
        for length, g in df.groupby("params.length"):
            # RULER's string_match_*: sum of per-sample scores in sample order / n * 100 (a running
            # sum, not pandas' mean: the two can differ in the last bit and so in the rounding).
            if "params.index" in g:
                g = g.sort_values("params.index", kind="stable")
            per_task = {t: sum(x["metrics.score"].tolist()) / len(x) * 100 for t, x in g.groupby("params.subtask")}
            order = [t for t in self.tasks if t in per_task] + [t for t in per_task if t not in self.tasks]
            counts = {t: int((g["params.subtask"] == t).sum()) for t in order}
            out["by_length"][str(int(length))] = {
                "tasks": {t: round(float(per_task[t]), 2) for t in order},
                "average": round(float(np.mean(list(per_task.values()))), 2),
                "average_of": averaged_over(counts, self.tasks),
                "nulls": {t: int(g.loc[g["params.subtask"] == t, "metrics.null"].sum()) for t in order},
                "n": {t: int((g["params.subtask"] == t).sum()) for t in order},
            }
        out["score"] = round(float(np.mean([v["average"] for v in out["by_length"].values()])), 2)
        over = {v["average_of"] for v in out["by_length"].values()}
        out["score_of"] = (over.pop() if len(over) == 1 else "per-length averages") + \
            f", averaged over {len(out['by_length'])} length(s)"
        return out

    def describe(self) -> dict[str, Any]:
        c = self.cfg
        return {
            "task": self.name,
            "generator": "NVIDIA/RULER scripts/data/synthetic (per-sample seeds; fit: prompt+tokens_to_generate<=length)",
            "template": self.template_name,
            "prompt_version": c.get("prompt_version", "original"),
            "answer_prefix": "appended after the model wrapper (RULER prepare.py)",
            "scorer": "RULER string_match_all (niah, vt, cwe, fwe) / string_match_part (qa), case-insensitive",
            "seed": self.seed,
            "samples_per_task": self.n_samples,
            "sentence_splitter": c.get("sentence_splitter", "punkt"),
            "essay": c.get("essay_path") or c.get("essay_hub_id"),
            "remove_newline_tab": bool(c.get("remove_newline_tab", False)),
        }
