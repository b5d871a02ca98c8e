"""Math reasoning sets of LycheeDecode Table 2 under the DeepSeek-R1-distill protocol (harnesses.md 2.4).

Tasks: `aime` (AIME 2024), `gaokao2023en`, `minerva_math`, `olympiadbench` (OE_TO_maths_en_COMP), one
class each over a shared implementation (they differ only in where the problem and the gold answer are).

Protocol (R1 paper / model card, distill checkpoints' generation_config): one user message
"{problem}\\nPlease reason step by step, and put your final answer within \\boxed{}." through the
model's chat template, no system prompt (a template that injects its own default system turn, as
SmolLM2's does, keeps it: that is the template's behaviour), temperature 0.6, top-p 0.95, up to
`max_new_tokens` (32768 in R1), `k` samples per problem, sample j seeded `seed + j`;
pass@1 = mean correctness over all k samples of a problem, averaged over problems.
`think_prefix: true` appends "<think>\\n" after the generation prompt (R1 card advice; the current
distill templates already end with it, in which case nothing is added).
Answer (`grader`): `math_verify` (default): the LAST `\\boxed{}` of the output, braces matched
(`metrics.last_boxed`), compared with the gold through `math-verify` (`metrics.math_verify_equal`, gold
first; a Unicode minus and \\left/\\right before brackets normalised away). No box -> incorrect.
`qwen25_math`: Qwen2.5-Math's evaluation parser and grader (tasks/metrics/qwen_math.py: its extract_answer,
strip_string, math_equal). LycheeDecode names no grader; the two disagree on about 30% of real outputs
(issue 36), so a table's numbers compare only under one grader (the rows record which).

LycheeDecode itself says it decodes greedily ("For all experiments, we employ the greedy decoding
strategy"): to reproduce its Table 2 use temperature=0 k=1. Its Gaokao/Minerva/OlympiadBench numbers
are multiples of 1/128, i.e. 128 problems each (`num_problems: 128`; which 128 is not stated: we take
the first 128 in dataset order).
Data: the hub by default, or `data_dir` (a directory with test.jsonl, or a .jsonl file; the
QwenLM/Qwen2.5-Math evaluation files fit; the repository ships them as data/<set>/test.jsonl.xz, read
through tasks/datafiles.py).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar

from common.errors import ConfigError
from common.options import option
from tasks import datafiles, hub_data
from tasks.base import Sample, Task, mean_metrics, register
from tasks.config import TaskConfig
from tasks.metrics import last_boxed, math_verify_equal

INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
GRADERS = {"math_verify": "last \\boxed{} (brace-matched) + math-verify verify(gold, pred)",
           "qwen25_math": "Qwen2.5-Math evaluation: extract_answer + strip_string + math_equal (3 s)"}


@dataclass(frozen=True)
class MathSet:
    hub_id: str
    hub_config: str | None
    split: str
    problem_keys: tuple[str, ...]        # first present field is the problem (hub and local schemas)
    answer_keys: tuple[str, ...]         # gold answer field (a list is joined with ", ")
    id_keys: tuple[str, ...]
    solution_key: str | None = None      # gold = last \boxed{} of this field when no answer field
    context_key: str | None = None       # prepended to the problem when non-empty (OlympiadBench)
    level_key: str | None = None         # difficulty level (MATH-500), for `task.levels`


SETS = {
    "aime24": MathSet("Maxwell-Jia/AIME_2024", None, "train", ("Problem", "problem"), ("Answer", "answer"),
                      ("ID", "id")),
    "gaokao2023en": MathSet("MARIO-Math-Reasoning/Gaokao2023-Math-En", None, "train",
                            ("question", "problem"), ("answer",), ("id",)),
    "minerva_math": MathSet("math-ai/minervamath", None, "test", ("problem", "question"), ("answer",),
                            ("idx", "id"), solution_key="solution"),
    "olympiadbench": MathSet("Hothan/OlympiadBench", "OE_TO_maths_en_COMP", "train", ("question",),
                             ("final_answer",), ("id",), context_key="context"),
    "math500": MathSet("HuggingFaceH4/MATH-500", None, "test", ("problem",), ("answer",), ("unique_id",),
                       solution_key="solution", level_key="level"),
}


def _first(row: dict, keys: tuple[str, ...]):
    for k in keys:
        if row.get(k) not in (None, "", []):
            return row[k]
    return None


def parse_row(row: dict, spec: MathSet, index: int) -> dict[str, Any]:
    """{id, problem, answer} from one dataset row. No problem field -> error (a schema mismatch);
    answer None when the row has no gold (2 Gaokao2023En rows hide it in the question text)."""
    problem = _first(row, spec.problem_keys)
    answer = _first(row, spec.answer_keys)
    if answer is None and spec.solution_key and row.get(spec.solution_key):
        answer = last_boxed(str(row[spec.solution_key]))
    if problem is None or not any(k in row for k in spec.answer_keys + (spec.solution_key or "",)):
        raise ConfigError(f"math row {index}: no problem {spec.problem_keys} or answer {spec.answer_keys}"
                          f" field; fields are {sorted(row)}")
    if isinstance(answer, list):
        answer = ", ".join(str(a) for a in answer)
    context = row.get(spec.context_key) if spec.context_key else None
    if context:
        problem = f"{context}\n{problem}"
    rid = _first(row, spec.id_keys)
    return {"id": str(rid if rid is not None else index), "problem": str(problem),
            "answer": None if answer is None else str(answer),
            "level": row.get(spec.level_key) if spec.level_key else None}


def load_problems(cfg, spec: MathSet) -> tuple[list[dict[str, Any]], list[str]]:
    """(problems with a gold answer, ids of rows dropped for having none: recorded in every row)."""
    data_dir = cfg.get("data_dir")
    if data_dir:
        path = datafiles.resolve(data_dir)
        path = path / "test.jsonl" if path.is_dir() else path
        if not datafiles.is_file(path):
            raise ConfigError(f"task.data_dir: {path} not found (a .jsonl or a directory with test.jsonl)")
        with datafiles.open_text(path) as fh:
            rows = [json.loads(line) for line in fh if line.strip()]
    else:
        rows = [dict(r) for r in hub_data.load(spec.hub_id, spec.hub_config, split=spec.split,
                                               fix="set task.data_dir to a .jsonl (or a folder with test.jsonl)")]
    parsed = [parse_row(r, spec, i) for i, r in enumerate(rows)]
    return [p for p in parsed if p["answer"] is not None], [p["id"] for p in parsed if p["answer"] is None]


_R1 = (" under the DeepSeek-R1-distill protocol (tasks/aime.py): chat template, no system prompt,\n"
       "last \\boxed{} + math-verify, pass@1 over k seeded samples. LycheeDecode Table 2 decodes greedily:\n"
       "temperature=0 k=1 (and num_problems=128 outside AIME) to reproduce it.")


@dataclass(frozen=True)
class MathConfig(TaskConfig):
    seed: int = option(0, "sample j of every problem uses seed + j")
    k: int = option(1, "samples per problem (R1 paper: 64)", min=1)
    temperature: float = option(0.6, "", min=0.0)
    top_p: float = option(0.95, "", min=0.0, max=1.0)
    max_new_tokens: int = option(32768, "R1 maximum generation length", min=1)
    num_problems: int | None = option(None, "first N problems (null = all)", min=0)
    think_prefix: bool = option(False, "append \"<think>\\n\" after the generation prompt if the template does not")
    verify_timeout: float = option(5, "seconds for math-verify parsing / comparison", min=0)
    grader: str = option("math_verify", "math_verify (last \\boxed{} + math-verify) | qwen25_math (Qwen2.5-Math "
                         "extract_answer + strip_string + math_equal); LycheeDecode names none: tables state the "
                         "grader", choices=tuple(GRADERS))
    data_dir: str | None = option(None, "a .jsonl or a directory with test.jsonl (the repository ships them in data/<set>/)")

    @classmethod
    def smoke(cls) -> dict:
        return {"max_new_tokens": 64}


def _math_config(title: str, base: type = MathConfig) -> type:
    """One set's options: the shared fields, its own header."""
    return dataclass(frozen=True)(type(f"{title}Config", (base,), {"__doc__": title + _R1, "__module__": __name__,
                                                                     "__qualname__": f"{title}Config"}))


@dataclass(frozen=True)
class _Math500Fields(MathConfig):
    levels: tuple[int, ...] | None = option(None, "difficulty levels to keep, e.g. [1] (the easiest: lychee.table2's "
                                      "embedded profile)", min=1)


class MathTask(Task):
    """Shared R1-distill protocol; subclasses name the data set."""

    dataset: ClassVar[str] = ""
    metric = "correct"

    def perfect(self, sample: Sample) -> str:
        return f"The answer is \\boxed{{{sample.references[0]}}}."

    @classmethod
    def validate(cls, cfg, model) -> None:
        super().validate(cfg, model)
        if not model.chat_template:
            raise ConfigError(f"task {cls.name}: the R1 protocol needs a chat template; "
                              f"model {model.name} has none")
        k = int(cfg.get("k", 1))
        if k > 1 and float(cfg.temperature) == 0.0:
            raise ConfigError("task.k > 1 with temperature 0 repeats one greedy output k times")
        if cfg.get("grader") == "qwen25_math":
            import importlib.util

            if importlib.util.find_spec("word2number") is None:    # Qwen2.5-Math's parser imports it
                raise ConfigError("task.grader=qwen25_math needs the word2number package (pip install word2number)")
        if int(cfg.max_new_tokens) >= model.max_length:
            raise ConfigError(f"task.max_new_tokens {cfg.max_new_tokens} >= model {model.name} "
                              f"max_length {model.max_length}")

    def prompt(self, problem: str) -> list[int]:
        text = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": f"{problem}\n{INSTRUCTION}"}],
            tokenize=False, add_generation_prompt=True)
        if self.cfg.get("think_prefix", False) and not text.endswith("<think>\n"):
            text += "<think>\n"
        return self.encode(text)          # the template already carries BOS where the model wants one

    def problems(self) -> list[dict[str, Any]]:
        if not hasattr(self, "_problems"):
            self._problems, self._dropped = load_problems(self.cfg, SETS[self.dataset])
        probs = self._problems
        levels = self.cfg.get("levels")
        if levels is not None:            # MATH-500: keep the listed difficulty levels (dataset order kept)
            keep = {int(x) for x in levels}
            probs = [p for p in probs if p.get("level") is not None and int(p["level"]) in keep]
        n = self.cfg.get("num_problems")
        return probs[: int(n)] if n is not None else probs

    def samples(self):
        k, seed = int(self.cfg.get("k", 1)), int(self.cfg.seed)
        for p in self.problems():
            ids = self.prompt(p["problem"])
            for j in range(k):
                yield Sample(
                    id=f"{p['id']}-{j}", input_ids=ids, references=[p["answer"]],
                    params={"dataset": self.dataset, "problem_id": p["id"], "sample_idx": j,
                            "seed": seed + j},
                    max_new_tokens=int(self.cfg.max_new_tokens),
                    temperature=float(self.cfg.temperature), top_p=float(self.cfg.top_p),
                    seed=seed + j,
                )

    def score(self, sample: Sample, prediction: str) -> dict[str, float]:
        if self.cfg.get("grader", "math_verify") == "qwen25_math":
            from tasks.metrics.qwen_math import DATA_NAME, qwen_math_equal

            _, correct = qwen_math_equal(sample.references[0], prediction, DATA_NAME[self.dataset])
            return {"correct": float(correct), "boxed": float(last_boxed(prediction) is not None),
                    "gold_unparsed": 0.0}
        answer = last_boxed(prediction)
        timeout = int(self.cfg.get("verify_timeout", 5))
        try:
            correct, unparsed = math_verify_equal(sample.references[0], answer, timeout=timeout), False
        except ValueError:                # a gold math-verify cannot read: counted, never a crash
            correct, unparsed = False, True
        return {"correct": float(correct), "boxed": float(answer is not None),
                "gold_unparsed": float(unparsed)}

    def summarize(self, rows: list[dict]) -> dict[str, Any]:
        return summarize_pass1(rows)

    def describe(self) -> dict[str, Any]:
        spec = SETS[self.dataset]
        self.problems()                   # loads the data once (cached) so dropped rows are known
        return {"task": self.name, "dataset": self.dataset,
                "data": self.cfg.get("data_dir") or f"{spec.hub_id}:{spec.hub_config or ''}:{spec.split}",
                "prompt": "{problem}\\n" + INSTRUCTION + " (chat template, no system prompt)",
                "think_prefix": bool(self.cfg.get("think_prefix", False)),
                "k": int(self.cfg.get("k", 1)), "temperature": float(self.cfg.temperature),
                "top_p": float(self.cfg.top_p), "max_new_tokens": int(self.cfg.max_new_tokens),
                "grader": self.cfg.get("grader", "math_verify"),
                "scorer": GRADERS[self.cfg.get("grader", "math_verify")],
                "dropped_no_gold": self._dropped, "levels": self.cfg.get("levels"),
                "problems": len(self.problems())}


def summarize_pass1(rows: list[dict]) -> dict[str, Any]:
    """pass@1 = mean over problems of the mean correctness of its k samples (equal to the plain mean
    when every problem has k rows; a partially finished run still weighs problems equally)."""
    if not rows:
        return {"n": 0}
    per_problem: dict[str, list[float]] = {}
    for r in rows:
        per_problem.setdefault(str(r["params"]["problem_id"]), []).append(float(r["metrics"]["correct"]))
    out = mean_metrics(rows, [])
    out.update({"pass@1": 100.0 * sum(sum(v) / len(v) for v in per_problem.values()) / len(per_problem),
                "problems": len(per_problem), "samples_per_problem": max(len(v) for v in per_problem.values())})
    lengths = [r["output_tokens"] for r in rows if r.get("output_tokens") is not None]
    if lengths:                           # decode-time sparsity matters most on long generations
        out["mean_output_tokens"] = sum(lengths) / len(lengths)
    return out


@register
class Aime(MathTask):
    name = "aime"
    Config = _math_config("aime")
    dataset = "aime24"


@register
class Gaokao2023En(MathTask):
    name = "gaokao2023en"
    Config = _math_config("gaokao2023en")
    dataset = "gaokao2023en"


@register
class MinervaMath(MathTask):
    name = "minerva_math"
    Config = _math_config("minerva_math")
    dataset = "minerva_math"


@register
class OlympiadBench(MathTask):
    name = "olympiadbench"
    Config = _math_config("olympiadbench")
    dataset = "olympiadbench"


@register
class Math500(MathTask):
    """MATH-500 (HuggingFaceH4/MATH-500), same protocol; `levels` picks difficulty levels (1 = easiest):
    the embedded stand-in for LycheeDecode Table 2's sets, which SmolLM2-135M cannot solve at all."""

    name = "math500"
    Config = _math_config("math500 (MATH-500)", _Math500Fields)
    dataset = "math500"
