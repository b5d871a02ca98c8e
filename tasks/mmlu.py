"""MMLU (Hendrycks et al.): 57 subjects of four-choice questions, scored from the next-token
distribution after "Answer:" (run mode `choice`: one prefill, the last position's logits, no generation).

Protocols (`task.protocol`):
  official  the paper's 5-shot prompt: "The following are multiple choice questions (with answers)
            about {subject, spaces}.\\n\\n", the subject's 5 dev questions as "{q}\\nA. {a}\\n...D. {d}\\n
            Answer: {X}\\n\\n", then the test question ending "Answer:"; the prediction is the letter whose
            token " A".." D" is likeliest; categories and the overall score are micro averages over
            questions (the paper's "weighted accuracy"); subject -> category from its categories.py.
            One space after "about", as lm-eval writes it (the release's format_subject adds a second).
  cascade   the Cascading KV Cache reference's job (jeffwillette/cascading_kv_cache cascade/main/jobs/
            mmlu.py): 20 shots (the 5 dev questions, then validation questions), each "{n}. {q}\\n\\nA. {a}
            \\n...\\n\\nAnswer:{X}"; a letter's probability is the max over its tokens in 'A', ':A', ': A',
            ':  A' and the lower-case forms (last token of each); the overall score is the mean of the
            per-subject accuracies. `task.cascade_prompt` picks the job's version:
              one_header (default)  the job's final version (e326871, 2024-09-20, unchanged to its last
                  commit 76c89a4), the one issue 36's audit places behind the paper's Table 4:
                  "The following are multiple choice questions (with answers) about {subject_name}:\\n\\n",
                  the shots joined by blank lines, then "\\n\\nI want you to answer the following multiple
                  choice question about {subject_name}.\\n\\n21. ...Answer:".
              per_shot_header  the job at a53e7af-02b676c (before the Table 4 run): every shot prefixed
                  "> The following are ... about {subject_name}.\\n\\n" and the target "> I want you to
                  answer ...", blocks joined by blank lines.

Prompts longer than the model's length drop shots (`task.shots_kept`): `first` (default) keeps the first
k shots, as the release's evaluate.py does (gen_prompt(dev_df, subject, k) with k lowered until the
prompt fits); `last` keeps the last k (this harness's earlier rule). The test question is never cut.
(The cascade job cut no shots: its tokenizer truncated the left of prompts at the model's 128K.)

Data: the hub's `cais/mmlu` (one config per subject; splits dev / validation / test, fields question,
choices, answer 0-3) or `task.data_dir` holding the paper's release layout (`dev/<subject>_dev.csv`,
`val/<subject>_val.csv`, `test/<subject>_test.csv`; rows question, A, B, C, D, answer letter, no header);
a file the protocol needs that is missing is an error, never an empty split. The reference read
`lukaemon/mmlu`, the same questions in another layout.
"""
from __future__ import annotations

import csv
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from common.errors import ConfigError
from common.options import option
from tasks import hub_data
from tasks._mmlu_subjects import CATEGORY, SUBJECTS
from tasks.base import Sample, Task, register
from tasks.config import TaskConfig

LETTERS = "ABCD"
HUB_ID = "cais/mmlu"
PROTOCOLS = {"official": 5, "cascade": 20}
CASCADE_PROMPTS = ("one_header", "per_shot_header")
SHOTS_KEPT = ("first", "last")
CASCADE_VARIANTS = ["{}", ":{}", ": {}", ":  {}"]   # the reference's candidates, upper and lower case


def _subjects(spec) -> list[str]:
    if spec in (None, "all"):
        return list(SUBJECTS)
    names = [spec] if isinstance(spec, str) else list(spec)
    out = []
    for n in names:
        if n in SUBJECTS:
            out.append(n)
        elif n in set(CATEGORY.values()):
            out += [s for s in SUBJECTS if CATEGORY[s] == n]
        else:
            raise ConfigError(f"task.subjects: unknown MMLU subject or category {n!r} (e.g. abstract_algebra, "
                              f"STEM, humanities, social sciences, other)")
    return list(dict.fromkeys(out))


def _read_csv(path: Path) -> list[dict]:
    with path.open(newline="", encoding="utf-8") as f:
        return [{"question": r[0], "choices": r[1:5], "answer": LETTERS.index(r[5].strip())}
                for r in csv.reader(f) if r]


@dataclass(frozen=True)
class MMLUConfig(TaskConfig):
    """MMLU, scored from the next-token probabilities of the answer letters (run mode `choice`).
    protocol official: the paper's 5-shot prompt, " A".." D", micro averages; cascade: the Cascading KV
    Cache reference's 20-shot format and letter variants, overall = mean of subject means (tasks/mmlu.py)."""

    limit: int | None = option(None, "the first N test questions of each subject", min=0)
    protocol: str = option("official", "", choices=tuple(PROTOCOLS))
    shots: int | None = option(None, "null: the protocol's (5 official, 20 cascade)", min=0)
    subjects: str | tuple[str, ...] = option("all", "all | a subject | a category (STEM, humanities, social sciences, "
                                       "other) | a list")
    data_dir: str | None = option(None, "MMLU's release folder (dev/<s>_dev.csv, val/<s>_val.csv, "
                                  "test/<s>_test.csv); null: the hub")
    hub_id: str | None = option(None, "null: cais/mmlu")
    cascade_prompt: str = option("one_header", "protocol cascade: one_header (the reference job's final version, "
                                 "behind Table 4) | per_shot_header (its earlier \"> \" header before every shot)",
                                 choices=CASCADE_PROMPTS)
    shots_kept: str = option("first", "a prompt too long for the model keeps its first k shots (evaluate.py "
                             "gen_prompt) | last", choices=SHOTS_KEPT)

    @classmethod
    def smoke(cls) -> dict:
        return {"shots": 2}


@register
class MMLU(Task):
    name = "mmlu"
    Config = MMLUConfig
    metric = "acc"

    @classmethod
    def subset_names(cls) -> list[str]:
        return list(SUBJECTS)

    def perfect(self, sample: Sample):
        """All the next-token mass on the answer letter's candidates."""
        import torch

        cands = sample.extra["candidates"]
        probs = torch.zeros(max(t for ids in cands for t in ids) + 1)
        probs[list(cands[LETTERS.index(sample.references[0])])] = 1.0
        return probs
    mode = "choice"
    # the release's folders and file suffixes: dev/<s>_dev.csv, val/<s>_val.csv, test/<s>_test.csv
    SPLIT_FILES: ClassVar[dict[str, str]] = {"dev": "dev", "validation": "val", "test": "test"}

    @classmethod
    def validate(cls, cfg, model) -> None:
        super().validate(cfg, model)
        _subjects(cfg.get("subjects"))

    @classmethod
    def path(cls, root: Path, subject: str, split: str) -> Path:
        name = cls.SPLIT_FILES[split]
        return root / name / f"{subject}_{name}.csv"

    @classmethod
    def check_data(cls, cfg, model) -> None:
        if cfg.get("data_dir"):
            root = Path(str(cfg.data_dir)).expanduser()
            shots = cfg.get("shots")
            shots = PROTOCOLS[cfg.get("protocol", "official")] if shots is None else int(shots)
            # more shots than the 5 dev questions: the protocol reads validation questions too
            splits = ("dev", "validation", "test") if shots > 5 else ("dev", "test")
            for s in _subjects(cfg.get("subjects")):
                for split in splits:
                    p = cls.path(root, s, split)
                    if not p.is_file():
                        raise ConfigError(f"task.data_dir {root}: no {p.relative_to(root)} (MMLU's release layout: "
                                          f"dev/<s>_dev.csv, val/<s>_val.csv, test/<s>_test.csv)")

    # data ------------------------------------------------------------------------------------------
    def split(self, subject: str, split: str) -> list[dict]:
        if self.cfg.get("data_dir"):
            root = Path(str(self.cfg.data_dir)).expanduser()
            p = self.path(root, subject, split)
            if not p.is_file():     # never an empty split: the protocol would silently lose shots
                raise ConfigError(f"task.data_dir {root}: no {p.relative_to(root)} (MMLU's release layout)")
            return _read_csv(p)
        ds = hub_data.load(self.cfg.get("hub_id") or HUB_ID, subject, split=split,
                           fix="set task.data_dir to MMLU's release folder (dev/ val/ test/ csv files)")
        return [{"question": r["question"], "choices": list(r["choices"]), "answer": int(r["answer"])} for r in ds]

    @property
    def protocol(self) -> str:
        return self.cfg.get("protocol", "official")

    @property
    def shots(self) -> int:
        shots = self.cfg.get("shots")
        return PROTOCOLS[self.protocol] if shots is None else int(shots)

    @property
    def cascade_prompt(self) -> str:
        return self.cfg.get("cascade_prompt", "one_header")

    @property
    def shots_kept(self) -> str:
        return self.cfg.get("shots_kept", "first")

    def shot_pool(self, subject: str) -> list[dict]:
        pool = self.split(subject, "dev")
        if len(pool) < self.shots:   # the reference: train (= dev) then validation, first 20
            pool += self.split(subject, "validation")
        return pool[:self.shots]

    # prompts ---------------------------------------------------------------------------------------
    def official_text(self, subject: str, shots: list[dict], q: dict) -> str:
        def block(x, answer):
            opts = "".join(f"\n{L}. {c}" for L, c in zip(LETTERS, x["choices"]))
            return f"{x['question']}{opts}\nAnswer:" + (f" {LETTERS[x['answer']]}\n\n" if answer else "")

        head = f"The following are multiple choice questions (with answers) about {subject.replace('_', ' ')}.\n\n"
        return head + "".join(block(x, True) for x in shots) + block(q, False)

    def cascade_text(self, subject: str, shots: list[dict], q: dict) -> str:
        def block(x, n, target):
            opts = "\n".join(f"{L}. {c}" for L, c in zip(LETTERS, x["choices"]))
            return f"{n}. {x['question']}\n\n{opts}\n\nAnswer:" + ("" if target else LETTERS[x["answer"]])

        ask = f"I want you to answer the following multiple choice question about {subject}.\n\n"
        target = block(q, len(shots) + 1, True)
        if self.cascade_prompt == "one_header":     # format_mmlu_plain from e326871 on
            shots_text = "\n\n".join(block(x, i + 1, False) for i, x in enumerate(shots))
            return (f"The following are multiple choice questions (with answers) about {subject}:\n\n"
                    f"{shots_text}\n\n{ask}{target}")
        head = f"> The following are multiple choice questions (with answers) about {subject}.\n\n"
        return "\n\n".join([head + block(x, i + 1, False) for i, x in enumerate(shots)] + [f"> {ask}{target}"])

    def candidates(self) -> list[list[int]]:
        """Token ids whose probability stands for each letter (max over a letter's list)."""
        if self.protocol == "official":
            return [[self.encode(f" {L}")[-1]] for L in LETTERS]
        return [sorted({self.encode(v.format(c))[-1] for v in CASCADE_VARIANTS for c in (L, L.lower())})
                for L in LETTERS]

    def samples(self) -> Iterable[Sample]:
        cands = self.candidates()
        text = self.official_text if self.protocol == "official" else self.cascade_text
        for subject in _subjects(self.cfg.get("subjects")):
            shots = self.shot_pool(subject)
            for i, q in enumerate(self.split(subject, "test")):
                k = len(shots)
                ids = self.bos() + self.encode(text(subject, shots, q))
                while k > 0 and self.model.too_long(len(ids)):   # drop shots until the prompt fits
                    k -= 1
                    kept = shots[:k] if self.shots_kept == "first" else (shots[len(shots) - k:] if k else [])
                    ids = self.bos() + self.encode(text(subject, kept, q))
                if self.model.too_long(len(ids)):
                    raise ConfigError(f"MMLU {subject} test {i}: {len(ids)} tokens without shots exceed the model's "
                                      f"{self.model.max_length}")
                yield Sample(id=f"{subject}/{i}", input_ids=ids, references=[LETTERS[q["answer"]]],
                             params={"subject": subject, "category": CATEGORY[subject], "shots": k,
                                     "length": len(ids)},
                             max_new_tokens=0, extra={"candidates": cands})

    def limit_keys(self) -> list[str]:
        return ["subject"]    # task.limit=N: the first N test questions of every subject

    # scoring ---------------------------------------------------------------------------------------
    def score_choice(self, sample: Sample, probs) -> dict[str, float]:
        """probs [V]: the softmax at the prompt's last position."""
        p = [max(float(probs[t]) for t in ids) for ids in sample.extra["candidates"]]
        pred = max(range(4), key=lambda i: (p[i], -i))
        return {"acc": float(LETTERS[pred] == sample.references[0]), "p_answer": p[LETTERS.index(sample.references[0])]}

    def group_by(self) -> list[str]:
        return ["category", "subject"]

    def summarize(self, rows: list[dict]) -> dict[str, Any]:
        out = super().summarize(rows)
        by_subject = out.get("by_subject") or {}
        if by_subject:   # the reference's overall: the mean of the subjects' accuracies
            out["acc_subject_mean"] = sum(v["acc"] for v in by_subject.values()) / len(by_subject)
        return out

    def describe(self) -> dict[str, Any]:
        return {"task": self.name, "protocol": self.protocol, "shots": self.shots, "shots_kept": self.shots_kept,
                **({"cascade_prompt": self.cascade_prompt} if self.protocol == "cascade" else {}),
                "data": self.cfg.get("data_dir") or self.cfg.get("hub_id") or HUB_ID,
                "score": "argmax over the letters' next-token probabilities" +
                         (" (' A'..' D')" if self.protocol == "official" else " (max over the reference's variants)"),
                "overall": "micro mean over questions" if self.protocol == "official" else "mean of subject means"}
