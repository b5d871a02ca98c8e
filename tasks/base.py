"""The task interface and its registry.

A task yields `Sample`s (token ids ready for the engine, references, the parameters that identify
the sample in result rows), says how to run each one (`generate` or `nll`), and scores the output
with the benchmark's own definition (`tasks/metrics/`). Data comes from the hub by default, a
local `task.data_dir` when given, or is generated from `task.seed`.

Every task config has `name`, `limit` and `seed`. `limit` keeps N samples of each grid cell
(`limit_keys`: each prompt length for tasks with a `lengths` grid, else the whole task), so
`task.lengths=[1024,2048] task.limit=4` runs 4 samples at each length; null = all. A task with
subtasks (RULER, LongBench, InfiniteBench) takes them in turn within a cell (`spread`): RULER's
`task.limit=2` is one niah_single_1 and one niah_single_2 sample, not two of the first subtask.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from common.errors import ConfigError
from common.registry import Registry
from tasks._tokens import bos_ids
from tasks.config import TaskConfig


@dataclass
class Sample:
    id: str                              # stable within the task config: the resume key
    input_ids: list[int]                 # the full prompt (template, truncation already applied)
    references: list[str] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)   # length, depth, subtask ... (go in the row)
    max_new_tokens: int = 32
    decode_tail: int = 0                 # last N prompt tokens fed one at a time through decode
    temperature: float = 0.0             # 0 = greedy
    top_p: float = 1.0
    seed: int | None = None              # per-sample sampling seed
    nll_mode: str = "decode"             # nll tasks: "decode" (token by token) | "stride" (prefill chunks)
    stride: int | None = None            # nll stride mode: chunk length (None = the method's prefill_chunk)
    extra: dict[str, Any] = field(default_factory=dict)    # what the scorer needs (all_classes ...)
    stop_ids: list[int] = field(default_factory=list)      # task's own stop tokens, on top of the model's


@dataclass
class ModelSpec:
    """What a task may know about the model without loading it (from the model YAML)."""

    name: str
    max_length: int                      # longest prompt the task may build (LongBench max length)
    chat_template: bool = True           # instruct model: may apply its chat template
    stop_tokens: list[str] = field(default_factory=list)
    max_position: int | None = None      # positions the model supports: prompt + new tokens must fit
    any_length: bool = False             # the method reads any length (bounded cache, in-cache positions)

    @property
    def positions(self) -> int:
        return self.max_position or self.max_length

    def too_long(self, tokens: int, limit: int | None = None) -> bool:
        """Whether `tokens` (a prompt, or prompt + new tokens) exceed what the model can read through
        the run's method: `limit` (default max_length); never when the method reads any length."""
        return not self.any_length and tokens > (self.max_length if limit is None else limit)


class Task:
    name: ClassVar[str] = ""
    mode: ClassVar[str] = "generate"     # "generate" | "nll" | "choice" | "compare" (tasks/compare.py)
    Config: ClassVar[type[TaskConfig]] = TaskConfig   # the typed options (tasks/config.py)

    def __init__(self, cfg, tokenizer, model: ModelSpec):
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.model = model

    @classmethod
    def validate(cls, cfg, model: ModelSpec) -> None:
        """Raise ConfigError (one line) before any model loads: first the typed options (unknown
        keys, types, ranges, choices: `Config`), then the task's own and model-dependent checks
        (override and call super), e.g. lengths beyond the model."""
        cls.Config.parse(cfg)
        if "lengths" in cfg:   # a length grid: every entry a positive token count, whatever the task
            lengths = cfg.lengths
            if isinstance(lengths, (str, int, float)) or lengths is None:
                raise ConfigError(f"task.lengths must be a list of token counts, got {lengths!r}")
            for L in lengths:
                if isinstance(L, bool) or not isinstance(L, int) or L <= 0:
                    raise ConfigError(f"task.lengths must be positive integers (tokens), got {L!r}")

    @classmethod
    def check_data(cls, cfg, model: ModelSpec) -> None:
        """Raise ConfigError (one line) when the task's data cannot be had (a missing data_dir file,
        a hub dataset neither cached nor reachable). Called before the tokenizer or the model loads,
        so it must be cheap: look, do not load. Default: nothing to check (generated data)."""

    def samples(self) -> Iterable[Sample]:
        raise NotImplementedError

    def limit_keys(self) -> list[str]:
        """Sample params that make a grid cell: `task.limit` applies to each cell. Default: the
        prompt length, for tasks with a `lengths` grid (so a limit never cuts whole lengths off);
        otherwise the whole task is one cell (first N samples)."""
        return ["length"] if self.cfg.get("lengths") is not None else []

    def limited(self) -> Iterator[Sample]:
        """The samples a run computes: `samples()` with `task.limit` applied per grid cell."""
        limit = self.cfg.get("limit")
        if limit is None:
            yield from self.samples()
            return
        limit, keys = int(limit), self.limit_keys()
        if limit == 0:
            return
        # Stop reading early once every cell is full when the number of cells is known (the lengths).
        cells = len(set(self.cfg.lengths)) if keys == ["length"] else None
        counts: dict[tuple, int] = {}
        for s in self.spread(limit):
            cell = tuple(s.params.get(k) for k in keys)
            n = counts.get(cell, 0)
            if n < limit:
                counts[cell] = n + 1
                yield s
                if cells is not None and len(counts) == cells and all(c >= limit for c in counts.values()):
                    return

    def spread(self, limit: int) -> Iterable[Sample]:
        """The samples in the order `task.limit` takes them (the same set as `samples()`). Default:
        `samples()`. A task with subtasks overrides it to take, within each cell, one sample of each
        subtask in turn (`round_robin`), and may stop a cell once it holds `limit` samples."""
        return self.samples()

    def score(self, sample: Sample, prediction: str) -> dict[str, float]:
        """Metrics for one generated output (generate mode)."""
        raise NotImplementedError

    def score_nll(self, sample: Sample, nll) -> dict[str, float]:
        """Metrics for per-token NLL [T-1] (nll mode)."""
        raise NotImplementedError

    def score_choice(self, sample: Sample, probs) -> dict[str, float]:
        """Metrics from the next-token distribution [V] at the prompt's last position (choice mode)."""
        raise NotImplementedError

    def summarize(self, rows: list[dict]) -> dict[str, Any]:
        """Aggregate rows into the run summary. Default: mean of every metric, overall and per
        value of the task's grouping keys (`group_by`)."""
        return mean_metrics(rows, self.group_by())

    def group_by(self) -> list[str]:
        return []

    def describe(self) -> dict[str, Any]:
        """Protocol facts recorded in every row (scorer, protocol variant, template ...)."""
        return {"task": self.name}

    # what the shared conformance suite checks (tests/test_tasks_conformance.py) ---------------------
    metric: ClassVar[str] = ""                                   # the headline metric of a sample's scores
    metric_range: ClassVar[tuple[float, float]] = (0.0, 1.0)     # (worst, best) of `metric`

    @classmethod
    def subset_names(cls) -> list[str]:
        """The names of the task's subsets (a suite's sub-benchmarks): task and subset names must not
        collide, or rows and tables could not tell them apart."""
        return []

    def perfect(self, sample: Sample) -> Any:
        """What a perfect model returns for `sample`, in this task's mode: the text (generate; default:
        the first reference), per-token NLLs (nll: zeros), the next-token distribution (choice), or
        the comparison with a method equal to full attention (compare). Its score is the best end of
        `metric_range`."""
        if self.mode == "generate":
            return sample.references[0]
        if self.mode == "nll":
            import torch

            return torch.zeros(max(len(sample.input_ids) - 1, 1))
        raise NotImplementedError(f"task {self.name}: say what a perfect {self.mode} output is (perfect)")

    def score_output(self, sample: Sample, output: Any) -> dict[str, Any]:
        """The metrics of one output in this task's mode (the run loop calls the mode's scorer)."""
        scorer = {"generate": self.score, "nll": self.score_nll, "choice": self.score_choice,
                  "compare": getattr(self, "score_compare", None)}[self.mode]
        return scorer(sample, output)

    # helpers ------------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def bos(self) -> list[int]:
        """The ids the tokenizer puts before a text (its BOS; none for tokenizers that add none,
        and never an appended EOS: see tasks/_tokens.py)."""
        return bos_ids(self.tokenizer)


def round_robin(streams: list[Iterable[Sample]], limit: int | None = None) -> Iterator[Sample]:
    """One sample of each stream in turn until `limit` samples (or every stream is spent). Streams
    are read lazily: a subtask whose turn never comes builds nothing."""
    its = [iter(x) for x in streams]
    n = 0
    while its and (limit is None or n < limit):
        for it in list(its):
            if limit is not None and n >= limit:
                return
            s = next(it, None)
            if s is None:
                its.remove(it)
                continue
            n += 1
            yield s


def averaged_over(per: dict[str, int], every: list[str] | None = None) -> str:
    """What an average over subtasks averages, in words: `niah_single_1 (n=1), niah_single_2 (n=1):
    2 of 13 subtasks`; `13 subtasks, n=500 each` when every subtask ran the same count."""
    total = len(every) if every else len(per)
    counts = set(per.values())
    if len(per) == total and len(counts) == 1:
        return f"{total} subtasks, n={counts.pop()} each"
    return ", ".join(f"{k} (n={v})" for k, v in per.items()) + f": {len(per)} of {total} subtasks"


def mean_metrics(rows: list[dict], group_by: list[str]) -> dict[str, Any]:
    import pandas as pd

    if not rows:
        return {"n": 0}
    df = pd.json_normalize(rows)
    metric_cols = [c for c in df.columns if c.startswith("metrics.")]
    out: dict[str, Any] = {"n": len(df)}
    for c in metric_cols:
        out[c[len("metrics."):]] = float(df[c].mean())
    for key in group_by:
        col = f"params.{key}"
        if col in df.columns:
            g = df.groupby(col)[metric_cols].mean()
            out[f"by_{key}"] = {str(idx): {c[len("metrics."):]: float(v) for c, v in r.items()}
                                for idx, r in g.iterrows()}
    return out


REGISTRY = Registry("task", "tasks", skip=("base", "config", "metrics"))
register = REGISTRY.register
