"""LongBench v1 (THUDM/LongBench, folder `LongBench/`): official prompts and generation lengths,
middle truncation, chat-template rules and metrics.

Protocol (LongBench pred.py / eval.py, kept byte for byte where it matters):
  1. `prompt = dataset2prompt[subset].format(**row)` (the JSON files in `tasks/longbench_config/`
     are verbatim copies of `LongBench/config/`, MIT).
  2. If the tokenized prompt (with the tokenizer's BOS) is longer than the model's max length:
     `half = int(max_length / 2)`, prompt = decode(ids[:half]) + decode(ids[-half:]) with
     special tokens skipped (middle truncation on the raw prompt, before any chat wrapper).
  3. Chat template: `chat_template: auto` applies the tokenizer's chat template when the model is an
     instruct model (ModelSpec.chat_template) and the subset is not one of trec, triviaqa, samsum,
     lsht, lcc, repobench-p; `always` / `never` force it (never on the no-chat subsets either way).
     The Quest / TidalDecode / LycheeDecode repos ran Llama-3 and Qwen3 with raw prompts
     (`chat_template: never` reproduces them).
  4. `decode_tail: quest` is the Quest LongBench protocol: the prompt text is split at the last
     "Question:" (qasper, hotpotqa), "Now," (multifieldqa_en, gov_report), "Answer the question"
     (triviaqa), "Do not provide" (narrativeqa), else nowhere, but at most the last 100 characters
     go to the tail; head and tail are tokenized separately (tail without BOS) and the tail tokens
     are fed one by one through the decode path. An integer N feeds the last N tokens instead.
     (Quest strips the tail's first token unconditionally, `[:, 1:]`: on a tokenizer without BOS,
     e.g. Qwen3, that drops a real token; we strip only the tokenizer's actual BOS.)
  5. Greedy generation of `dataset2maxlen[subset]` tokens; samsum also stops at the token that ends
     "\n" (pred.py's extra eos id, `Sample.stop_ids`); scoring by `tasks.metrics.longbench_score`
     (first line for trec/triviaqa/samsum/lsht, max over answers); dataset score round(100*mean, 2).
  Tokenization is `tokenizer(prompt)` as pred.py does (special prefix and suffix: a tokenizer that
  appends EOS gets it here too), minus a second BOS after a chat template (`tasks/_tokens.py`).

Data: `task.data_dir/<subset>.jsonl` (`<subset>_e.jsonl` for LongBench-E) with the LongBench rows
(input, context, answers, length, dataset, language, all_classes, _id), else the hub dataset's
`data.zip` (the dataset's loading script no longer runs under `datasets` >= 4).
"""
from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from common.errors import ConfigError
from common.options import option
from tasks import metrics
from tasks._tokens import bos_ids, encode_prompt  # noqa: F401  (part of this module's helpers)
from tasks.base import ModelSpec, Sample, Task, averaged_over, register, round_robin
from tasks.config import TaskConfig

CONFIG_DIR = Path(__file__).resolve().parent / "longbench_config"
HUB_ID = "THUDM/LongBench"
NO_CHAT = ("trec", "triviaqa", "samsum", "lsht", "lcc", "repobench-p")
CATEGORIES = {
    "single_doc_qa": ["narrativeqa", "qasper", "multifieldqa_en", "multifieldqa_zh"],
    "multi_doc_qa": ["hotpotqa", "2wikimqa", "musique", "dureader"],
    "summarization": ["gov_report", "qmsum", "multi_news", "vcsum"],
    "few_shot": ["trec", "triviaqa", "samsum", "lsht"],
    "synthetic": ["passage_count", "passage_retrieval_en", "passage_retrieval_zh"],
    "code": ["lcc", "repobench-p"],
}
ALL = [s for group in CATEGORIES.values() for s in group]
PRESETS = {
    "all": ALL,
    "en16": ["narrativeqa", "qasper", "multifieldqa_en", "hotpotqa", "2wikimqa", "musique",
             "gov_report", "qmsum", "multi_news", "trec", "triviaqa", "samsum", "passage_count",
             "passage_retrieval_en", "lcc", "repobench-p"],
    "e13": ["qasper", "multifieldqa_en", "hotpotqa", "2wikimqa", "gov_report", "multi_news", "trec",
            "triviaqa", "samsum", "passage_count", "passage_retrieval_en", "lcc", "repobench-p"],
    "quest6": ["qasper", "narrativeqa", "hotpotqa", "multifieldqa_en", "gov_report", "triviaqa"],
    "tidal8": ["qmsum", "narrativeqa", "qasper", "multifieldqa_en", "triviaqa",
               "passage_retrieval_en", "hotpotqa", "2wikimqa"],
    # Cascading KV Cache Table 9 / Figure 9 ("the same subset as StreamingLLM").
    "cascade6": ["narrativeqa", "hotpotqa", "qasper", "multi_news", "2wikimqa", "gov_report"],
}
QUEST_SPLIT = {"qasper": "Question:", "hotpotqa": "Question:", "multifieldqa_en": "Now,",
               "gov_report": "Now,", "triviaqa": "Answer the question",
               "narrativeqa": "Do not provide"}
QUEST_TAIL_CHARS = 100
# pred.py passes these as extra eos ids ("prevent illegal output on samsum"); it also sets
# min_length = prompt + 1, which the engine has no equivalent for (see describe()).
STOP_STRINGS = {"samsum": ["\n"]}


@lru_cache(maxsize=1)
def official_config() -> tuple[dict[str, str], dict[str, int]]:
    """(dataset2prompt, dataset2maxlen) from the bundled official JSON files."""
    prompts = json.loads((CONFIG_DIR / "dataset2prompt.json").read_text(encoding="utf-8"))
    maxlen = json.loads((CONFIG_DIR / "dataset2maxlen.json").read_text(encoding="utf-8"))
    return prompts, maxlen


def resolve_subsets(spec, presets: dict[str, list[str]], known, what: str) -> list[str]:
    """A preset name, one subset name, or a list of names (presets expand inside lists too)."""
    items = [spec] if isinstance(spec, str) else list(spec or [])
    out: list[str] = []
    for item in items:
        for name in presets.get(str(item), [str(item)]):
            if name not in known:
                raise ConfigError(f"unknown {what} subset {name!r}; known: {', '.join(known)}; "
                                  f"presets: {', '.join(presets)}")
            if name not in out:
                out.append(name)
    if not out:
        raise ConfigError(f"task.subsets selects no {what} subset")
    return out


# prompt helpers (shared with tasks/infinitebench.py) ----------------------------------------------
def stop_token_ids(tokenizer, stop_strings) -> list[int]:
    """pred.py's extra eos ids: `tokenizer.encode(s, add_special_tokens=False)[-1]` per stop string
    (samsum: "\n"), i.e. the token that ends the string, not every token that contains it."""
    out = []
    for s in stop_strings:
        ids = tokenizer(s, add_special_tokens=False)["input_ids"]
        if not ids:
            raise ConfigError(f"stop string {s!r} encodes to no token with this tokenizer")
        out.append(int(ids[-1]))
    return out


def middle_truncate(tokenizer, prompt: str, max_length: int) -> tuple[str, int]:
    """LongBench pred.py middle truncation. Returns (prompt, token count before truncation)."""
    ids = tokenizer(prompt)["input_ids"]
    if len(ids) > max_length:
        half = int(max_length / 2)
        prompt = (tokenizer.decode(ids[:half], skip_special_tokens=True)
                  + tokenizer.decode(ids[-half:], skip_special_tokens=True))
    return prompt, len(ids)


def wants_chat(mode: str, model: ModelSpec, no_chat: bool) -> bool:
    if mode not in ("auto", "always", "never"):
        raise ConfigError(f"task.chat_template must be auto | always | never, got {mode!r}")
    if no_chat or mode == "never":
        return False
    return mode == "always" or bool(model.chat_template)


def apply_chat(tokenizer, prompt: str) -> str:
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError("task.chat_template asks for a chat template but the tokenizer has none "
                          "(set task.chat_template=never)")
    return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                         add_generation_prompt=True)


def read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def hub_longbench_rows(fname: str) -> list[dict]:
    """`data/<fname>` from the hub dataset's data.zip (downloaded once into the HF cache)."""
    try:
        from huggingface_hub import hf_hub_download

        path = hf_hub_download(HUB_ID, "data.zip", repo_type="dataset")
    except Exception as e:  # offline, gated, renamed ...
        raise ConfigError(f"cannot fetch {HUB_ID} data.zip from the hub ({type(e).__name__}: {e}); "
                          f"set task.data_dir to a folder of <subset>.jsonl files") from e
    with zipfile.ZipFile(path) as z, z.open(f"data/{fname}") as f:
        return [json.loads(line) for line in io.TextIOWrapper(f, encoding="utf-8") if line.strip()]


@dataclass(frozen=True)
class LongBenchConfig(TaskConfig):
    """LongBench v1 (THUDM/LongBench). Prompts / max new tokens: tasks/longbench_config (official, verbatim)."""

    limit: int | None = option(None, "first N samples over all subsets (null = all)", min=0)
    limit_per_subset: int | None = option(None, "first N samples of each subset", min=0)
    seed: int = option(42, "")
    subsets: str | tuple[str, ...] = option("tidal8", "preset (all | en16 | e13 | quest6 | tidal8 | cascade6), one "
                                      "subset, or a list of names/presets")
    longbench_e: bool = option(False, "LongBench-E files (<subset>_e.jsonl) and 0-4k / 4-8k / 8k+ buckets")
    data_dir: str | None = option(None, "folder of <subset>.jsonl rows; null = hub THUDM/LongBench data.zip")
    chat_template: str = option("auto", "auto: the model's chat template for instruct models, except trec/"
                                "triviaqa/samsum/lsht/lcc/repobench-p. never: raw prompts (what the Quest/"
                                "TidalDecode/LycheeDecode repos ran for Llama-3/Qwen3). always: force.",
                                choices=("auto", "always", "never"))
    decode_tail: int | str = option(0, "0 = prefill the whole prompt; N = feed the last N tokens one by one "
                                    "through decode; quest = Quest LongBench split rule (last \"Question:\"/"
                                    "\"Now,\"/... but at most the last 100 characters)")
    max_length: int | None = option(None, "prompt truncation length in tokens; null = the model's max_length",
                                    min=2)
    max_length_overrides: dict[str, int] = option(  # noqa: RUF009 (a fresh dict each)
        {}, "per subset, e.g. {narrativeqa: 28000} (TidalDecode)", min=2)
    max_new_tokens: int | None = option(None, "null = official dataset2maxlen", min=1)
    code_sim_backend: str = option("levenshtein", "fuzzywuzzy ratio backend for lcc/repobench-p: levenshtein | "
                                   "difflib", choices=("levenshtein", "difflib"))


@register
class LongBench(Task):
    name = "longbench"
    Config = LongBenchConfig
    metric = "score"

    @classmethod
    def subset_names(cls) -> list[str]:
        return list(ALL)

    @classmethod
    def validate(cls, cfg, model: ModelSpec) -> None:
        super().validate(cfg, model)
        prompts, _ = official_config()
        subsets = resolve_subsets(cfg.get("subsets", "tidal8"), PRESETS, list(prompts), "LongBench")
        if cfg.get("longbench_e") and (bad := [s for s in subsets if s not in PRESETS["e13"]]):
            raise ConfigError(f"LongBench-E has no subset {bad[0]!r}; it has {PRESETS['e13']}")
        wants_chat(cfg.get("chat_template", "auto"), model, False)
        tail = cfg.get("decode_tail", 0)
        if not (tail == "quest" or (isinstance(tail, int) and tail >= 0)):
            raise ConfigError(f"task.decode_tail must be quest or an integer >= 0, got {tail!r}")
        for key, value in {"max_length": cfg.get("max_length") or model.max_length,
                           **dict(cfg.get("max_length_overrides") or {})}.items():
            if not isinstance(value, int) or value < 2:
                raise ConfigError(f"LongBench max length {key}={value!r} must be an integer >= 2")
        if cfg.get("data_dir"):
            suffix = "_e" if cfg.get("longbench_e") else ""
            missing = [s for s in subsets if not (Path(cfg.data_dir) / f"{s}{suffix}.jsonl").is_file()]
            if missing:
                raise ConfigError(f"task.data_dir {cfg.data_dir} lacks {missing[0]}{suffix}.jsonl")

    def __init__(self, cfg, tokenizer, model: ModelSpec):
        super().__init__(cfg, tokenizer, model)
        self.prompts, self.maxlen = official_config()
        self.subsets = resolve_subsets(cfg.get("subsets", "tidal8"), PRESETS, list(self.prompts),
                                       "LongBench")
        self.chat_mode = cfg.get("chat_template", "auto")
        self.tail = cfg.get("decode_tail", 0)
        self.backend = cfg.get("code_sim_backend", "levenshtein")

    # data ------------------------------------------------------------------------------------------
    def rows(self, subset: str) -> list[dict]:
        fname = f"{subset}_e.jsonl" if self.cfg.get("longbench_e") else f"{subset}.jsonl"
        if self.cfg.get("data_dir"):
            return read_jsonl(Path(self.cfg.data_dir) / fname)
        return hub_longbench_rows(fname)

    def max_length(self, subset: str) -> int:
        overrides = dict(self.cfg.get("max_length_overrides") or {})
        return int(overrides.get(subset) or self.cfg.get("max_length") or self.model.max_length)

    def samples(self) -> Iterator[Sample]:
        for subset in self.subsets:
            yield from self.subset_samples(subset)

    def subset_samples(self, subset: str) -> Iterator[Sample]:
        per = self.cfg.get("limit_per_subset")
        for i, row in enumerate(self.rows(subset)):
            if per is not None and i >= int(per):
                break
            yield self.build(subset, row, i)

    def spread(self, limit: int) -> Iterator[Sample]:
        """`task.limit`: the subsets in turn (base.round_robin), not the first subset's first rows."""
        return round_robin([self.subset_samples(s) for s in self.subsets], limit)

    # prompt ----------------------------------------------------------------------------------------
    def prompt_text(self, subset: str, row: dict) -> tuple[str, int, bool]:
        """(final prompt text, raw prompt tokens before truncation, chat applied)."""
        prompt = self.prompts[subset].format(**row)
        prompt, n_full = middle_truncate(self.tokenizer, prompt, self.max_length(subset))
        chat = wants_chat(self.chat_mode, self.model, subset in NO_CHAT)
        return (apply_chat(self.tokenizer, prompt) if chat else prompt), n_full, chat

    def split_ids(self, subset: str, text: str) -> tuple[list[int], int]:
        """(input ids, decode_tail) for the configured tail rule."""
        if self.tail == "quest":
            key = QUEST_SPLIT.get(subset)
            q_pos = text.rfind(key) if key else -1
            q_pos = max(len(text) - QUEST_TAIL_CHARS, q_pos)
            head = encode_prompt(self.tokenizer, text[:q_pos])
            tail = encode_prompt(self.tokenizer, text[q_pos:], prefix=False)
            return head + tail, len(tail)
        ids = encode_prompt(self.tokenizer, text)
        return ids, min(int(self.tail), len(ids) - 1)

    def build(self, subset: str, row: dict, index: int) -> Sample:
        text, n_full, chat = self.prompt_text(subset, row)
        ids, tail = self.split_ids(subset, text)
        params = {"subset": subset, "length": row.get("length"), "prompt_tokens": len(ids),
                  "prompt_tokens_full": n_full, "truncated": n_full > self.max_length(subset),
                  "chat_template": chat}
        return Sample(
            id=f"{subset}/{row.get('_id') or index}", input_ids=ids,
            references=list(row["answers"]), params=params,
            max_new_tokens=int(self.cfg.get("max_new_tokens") or self.maxlen[subset]),
            decode_tail=tail, stop_ids=stop_token_ids(self.tokenizer, STOP_STRINGS.get(subset, ())),
            extra={"all_classes": row.get("all_classes"), "subset": subset})

    # scoring ---------------------------------------------------------------------------------------
    def score(self, sample: Sample, prediction: str) -> dict[str, float]:
        s = metrics.longbench_score(sample.extra["subset"], prediction, sample.references,
                                    sample.extra.get("all_classes"), self.backend)
        return {"score": s}

    def group_by(self) -> list[str]:
        return ["subset"]

    def summarize(self, rows: list[dict]) -> dict[str, Any]:
        per: dict[str, list[float]] = {}
        buckets: dict[str, dict[str, list[float]]] = {}
        for r in rows:
            subset, s = r["params"]["subset"], float(r["metrics"]["score"])
            per.setdefault(subset, []).append(s)
            if self.cfg.get("longbench_e"):
                b = metrics.longbench_e_bucket(int(r["params"]["length"]))
                buckets.setdefault(subset, {}).setdefault(b, []).append(s)
        by = {k: {"n": len(v), "score": metrics.longbench_aggregate(v)} for k, v in per.items()}
        for k, bk in buckets.items():
            by[k]["buckets"] = {b: metrics.longbench_e_aggregate(v) for b, v in sorted(bk.items())}
        out: dict[str, Any] = {"n": len(rows), "by_subset": by}
        if by:
            out["average"] = round(sum(v["score"] for v in by.values()) / len(by), 2)
            out["average_of"] = averaged_over({k: v["n"] for k, v in by.items()}, list(self.subsets))
            out["by_category"] = {
                c: round(sum(by[s]["score"] for s in m) / len(m), 2)
                for c, subs in CATEGORIES.items() if (m := [s for s in subs if s in by])}
        return out

    def describe(self) -> dict[str, Any]:
        return {
            "task": self.name, "benchmark": "LongBench v1" + ("-E" if self.cfg.get("longbench_e") else ""),
            "prompts": "THUDM/LongBench LongBench/config @2e00731f (bundled verbatim)",
            "truncation": "middle: first+last int(max_length/2) tokens of the raw prompt (pred.py)",
            "max_length": self.cfg.get("max_length") or self.model.max_length,
            "max_length_overrides": dict(self.cfg.get("max_length_overrides") or {}),
            "chat_template": self.chat_mode, "no_chat_subsets": list(NO_CHAT),
            "decode_tail": self.tail if self.tail == "quest" else int(self.tail),
            "metric": "LongBench metrics.py; first line for trec/triviaqa/samsum/lsht; max over "
                      "answers; dataset score round(100*mean, 2)",
            "rouge": "PyPI rouge ROUGE-L F", "code_sim_backend": self.backend,
            "stop_strings": STOP_STRINGS,
            "not_reproduced": "pred.py's min_length=prompt+1 for samsum (a newline or EOS as the "
                              "first token ends our generation empty; pred.py would suppress it)",
        }
