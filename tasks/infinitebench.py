"""InfiniteBench (OpenBMB/InfiniteBench, hub `xinrongzhang2022/InfiniteBench`).

Two protocols (`task.protocol`):
  official  OpenBMB src/: templates `gpt4` when a chat template is applied, `yarn_mistral` (answer
            prefixes such as "The pass key is") on raw prompts, `DATA_NAME_TO_MAX_NEW_TOKENS`,
            middle truncation of the templated prompt (eval_yarn_mistral `truncate_input`:
            ids[:M//2] + ids[-(M//2):] with the BOS counted, decoded with special tokens skipped),
            scorers of compute_scores.py.
  infllm    thunlp/InfLLM benchmark/ (InfLLM-based papers, e.g. Ltri-LLM Table 2): InfLLM's
            templates and max new tokens, chat template on every task, "suffix" truncation of the
            chat-wrapped ids (first 128 + last max_length - max_new_tokens - 128, applied to token
            ids directly instead of InfLLM's decode / re-encode round trip), and InfLLM's Code.Debug
            scorer (a seeded random letter when no answer is found); other scorers are the official.
En.Sum is HF-`evaluate` rougeLsum, computed with rouge-score directly (`evaluate` is not needed).

Data: `task.data_dir/<task>.jsonl` or `<task>.jsonl` from the hub repo. Retr.PassKey,
Retr.Number and Retr.KV can be generated instead (`generate: true`) as data/construct_synthetic_
dataset.py builds them, at `gen_length` tokens of the final prompt (+-1%), reproducible from `seed`.
Retr.KV's question starts with the "\\n" that build_kv_retrieval writes before `Key: "..."`
(`gen_kv_newline: true`, the default; false drops it, as this harness did before: recorded in the rows).
"""
from __future__ import annotations

import random
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.errors import ConfigError
from common.options import option
from tasks import metrics
from tasks._infinitebench_prompts import MAX_NEW_TOKENS, TEMPLATES
from tasks._tokens import encode_prompt
from tasks.base import ModelSpec, Sample, Task, averaged_over, register, round_robin
from tasks.config import TaskConfig
from tasks.longbench import apply_chat, read_jsonl, resolve_subsets, wants_chat

HUB_ID = "xinrongzhang2022/InfiniteBench"
ALIASES = {"En.Sum": "longbook_sum_eng", "En.QA": "longbook_qa_eng", "En.MC": "longbook_choice_eng",
           "En.Dia": "longdialogue_qa_eng", "Zh.QA": "longbook_qa_chn", "Code.Debug": "code_debug",
           "Code.Run": "code_run", "Math.Find": "math_find", "Math.Calc": "math_calc",
           "Retr.PassKey": "passkey", "Retr.Number": "number_string", "Retr.KV": "kv_retrieval"}
TASKS = list(ALIASES.values())
SYNTHETIC = ("passkey", "number_string", "kv_retrieval")
PRESETS = {
    "all": TASKS,
    "ltri10": ["longbook_sum_eng", "longbook_qa_chn", "longbook_qa_eng", "longbook_choice_eng",
               "longdialogue_qa_eng", "code_debug", "math_find", "passkey", "number_string",
               "kv_retrieval"],
    "cascade3": ["longbook_choice_eng", "longbook_qa_eng", "longbook_sum_eng"],
    "retrieval3": list(SYNTHETIC),
    **{alias: [name] for alias, name in ALIASES.items()},
}
INFLLM_INIT_TOKENS = 128

# construct_synthetic_dataset.py strings
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.\n"
NEEDLE = {"passkey": "The pass key is {key}. Remember it. {key} is the pass key.\n",
          "number_string": "The sequence of digits is {key}. Remember it. {key} is the sequence of "
                           "digits.\n"}
QUESTION = {"passkey": "What is the pass key?", "number_string": "What is the sequence of digits?"}


def format_prompt(task: str, eg: dict, template: str) -> str:
    """eval_utils.create_prompt (current OpenBMB version; InfLLM's load_infinite_bench agrees)."""
    ctx = eg["content"] if "content" in eg else eg["context"]
    if task == "code_run":
        func_call = re.findall(r"func_[0-9]+\(\-?[0-9]+\)", eg["input"])[0]
        return template.format(func=func_call.split("(")[0], func_call=func_call, context=ctx)
    if task in ("code_debug", "longbook_choice_eng"):
        options = {f"OPTION_{c}": eg["options"][i] for i, c in enumerate("ABCD")}
        return template.format(context=ctx, question=eg.get("input", ""), **options)
    if task in ("longbook_qa_eng", "longbook_qa_chn"):
        return template.format(context=ctx, question=eg["input"])
    if task in ("longbook_sum_eng", "longdialogue_qa_eng", "math_calc"):
        return template.format(context=ctx)
    if task == "math_find":
        found = re.findall(r"The .+ of", eg["input"])
        if not found:
            raise ValueError(f"math_find input names no target number: {eg['input']!r}")
        prefix = f"What is {found[0].lower()[:-3]} in the following list?"
        return template.format(prefix=prefix, context=ctx, input=eg["input"])
    fields = {"context": ctx, "input": eg["input"]}
    if "{key}" in template:  # InfLLM kv_retrieval: the quoted key (input[6:44] in InfLLM)
        fields["key"] = re.findall(r'"[^"]*"', eg["input"])[0]
    return template.format(**fields)


def get_label(task: str, eg: dict):
    """eval_utils.get_answer: [option text, letter] for code_debug / longbook_choice_eng."""
    ans = eg["answer"]
    if task in ("code_debug", "longbook_choice_eng"):
        if isinstance(ans, str):
            return [ans, "ABCD"[eg["options"].index(ans)]]
        if len(ans) == 1:
            return [ans[0], "ABCD"[eg["options"].index(ans[0])]]
        if len(ans) == 2 and ans[1] in ["A", "B", "C", "D"]:
            return list(ans)
        raise ValueError(f"cannot read the {task} answer {ans!r}")
    if task == "math_find":  # the hub parquet stores answers as strings; the scorer needs the type
        first = ans[0] if isinstance(ans, list) else ans
        if isinstance(first, str):
            return int(first) if re.fullmatch(r"-?\d+", first.strip()) else float(first)
    return ans


def official_truncate(tokenizer, prompt: str, max_length: int) -> tuple[str, int]:
    """eval_yarn_mistral truncate_by_tokens: tok.encode (with BOS), middle, decode. Its
    truncate_input keeps ids[:M//2] + ids[-(M//2):], 2*(M//2) tokens: one fewer than M when M is
    odd (eval_utils.truncate_input, used only for GPT-4, slices [-M//2:] and keeps M)."""
    ids = tokenizer(prompt)["input_ids"]
    if len(ids) <= max_length:
        return prompt, len(ids)
    split = max_length // 2
    kept = ids[:split] + ids[-split:]
    return tokenizer.decode(kept, skip_special_tokens=True), len(ids)


def _digits(rng: random.Random, task: str) -> str:
    keys = [str(rng.randint(0, 9)) for _ in range(5)]
    if task == "number_string":  # 10 digits: five random repeats of random positions
        for k in range(5):
            pos = rng.randint(0, 5 + k - 1)
            keys.insert(pos, keys[pos])
    return "".join(keys)


def _uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def synthetic_row(task: str, units: int, depth: float, rng_state: dict, kv_newline: bool = True) -> dict:
    """One retrieval row with `units` noise lines (passkey, number_string) or JSON pairs (kv).
    kv_newline: the question's leading "\\n", as build_kv_retrieval writes it (False: without)."""
    if task == "kv_retrieval":
        pairs = rng_state["pairs"][:units]
        target = round(depth * (units - 1))
        ctx = "JSON data:\n{" + ", ".join(f'"{k}": "{v}"' for k, v in pairs) + "}"
        question = ("\n" if kv_newline else "") + \
            f'Key: "{pairs[target][0]}"\nThe value associated with the specified key is: '
        return {"context": ctx, "input": question, "answer": pairs[target][1], "options": []}
    j = round(depth * units)
    ctx = NOISE * j + NEEDLE[task].replace("{key}", rng_state["key"]) + NOISE * (units - j)
    return {"context": ctx, "input": QUESTION[task], "answer": rng_state["key"], "options": []}


@dataclass(frozen=True)
class InfiniteBenchConfig(TaskConfig):
    """InfiniteBench (OpenBMB/InfiniteBench; hub xinrongzhang2022/InfiniteBench)."""

    limit: int | None = option(None, "first N samples over all subsets (null = all)", min=0)
    limit_per_subset: int | None = option(None, "first N samples of each subset", min=0)
    seed: int = option(42, "")
    subsets: str | tuple[str, ...] = option("ltri10", "preset (ltri10 = Ltri-LLM Table 2, cascade3 = Cascading Table "
                                      "10, retrieval3, all), official task names (longbook_sum_eng, ...) or "
                                      "aliases (En.Sum, En.QA, En.MC, En.Dia, Zh.QA, Code.Debug, Math.Find, "
                                      "Retr.PassKey, Retr.Number, Retr.KV, Code.Run, Math.Calc), or a list of them")
    protocol: str = option("official", "official: OpenBMB templates / max new tokens / middle truncation / "
                           "compute_scores.py; infllm: thunlp/InfLLM benchmark templates, max new tokens, suffix "
                           "truncation, Code.Debug scorer", choices=("official", "infllm"))
    templates: str | None = option(None, "null = protocol default (official: gpt4 with chat, yarn_mistral raw; "
                                   "infllm)", choices=tuple(TEMPLATES))
    chat_template: str = option("auto", "auto | always | never (auto = the model's ModelSpec.chat_template)",
                                choices=("auto", "always", "never"))
    max_length: int | None = option(None, "truncation length in tokens; null = the model's max_length (OpenBMB: "
                                    "128K)", min=2 * INFLLM_INIT_TOKENS + 1)
    max_new_tokens: int | None = option(None, "null = the protocol's per-task table", min=1)
    data_dir: str | None = option(None, "folder of <task>.jsonl; null = hub")
    generate: bool = option(False, "build passkey / number_string / kv_retrieval offline from the seed")
    gen_length: int = option(32768, "tokens of the final prompt (+-1%)", min=256)
    gen_samples: int = option(20, "per task; needle depth i/(n-1)", min=1)
    gen_kv_newline: bool = option(True, "Retr.KV question starts \"\\nKey: ...\" as "
                                  "construct_synthetic_dataset.py writes it (false: without the \"\\n\", the "
                                  "harness before issue 36: older rows)")

    @classmethod
    def smoke(cls) -> dict:
        return {"generate": True, "subsets": "retrieval3", "gen_length": 512, "gen_samples": 2}


@register
class InfiniteBench(Task):
    name = "infinitebench"
    Config = InfiniteBenchConfig
    metric = "score"

    @classmethod
    def subset_names(cls) -> list[str]:
        return TASKS + list(ALIASES)

    @classmethod
    def validate(cls, cfg, model: ModelSpec) -> None:
        super().validate(cfg, model)
        subsets = resolve_subsets(cfg.get("subsets", "ltri10"), PRESETS, TASKS, "InfiniteBench")
        protocol = cfg.get("protocol", "official")
        wants_chat(cfg.get("chat_template", "auto"), model, False)
        max_length = cfg.get("max_length") or model.max_length
        if not isinstance(max_length, int) or max_length <= 2 * INFLLM_INIT_TOKENS:
            raise ConfigError(f"InfiniteBench max length {max_length!r} must be an integer > 256")
        if cfg.get("generate"):
            if bad := [s for s in subsets if s not in SYNTHETIC]:
                raise ConfigError(f"task.generate=true only builds {list(SYNTHETIC)}, not {bad[0]!r}")
            n, room = cfg.get("gen_length"), max_length
            if protocol == "infllm":  # InfLLM truncates above max_length - max_new_tokens
                room -= max(int(cfg.get("max_new_tokens") or MAX_NEW_TOKENS["infllm"][s]) for s in subsets)
            if not isinstance(n, int) or not 256 <= n <= room:
                raise ConfigError(f"task.gen_length={n!r} must be in [256, {room}]")
        elif cfg.get("data_dir") and (
                missing := [s for s in subsets if not (Path(cfg.data_dir) / f"{s}.jsonl").is_file()]):
            raise ConfigError(f"task.data_dir {cfg.data_dir} lacks {missing[0]}.jsonl")

    def __init__(self, cfg, tokenizer, model: ModelSpec):
        super().__init__(cfg, tokenizer, model)
        self.subsets = resolve_subsets(cfg.get("subsets", "ltri10"), PRESETS, TASKS, "InfiniteBench")
        self.protocol = cfg.get("protocol", "official")
        self.chat = wants_chat(cfg.get("chat_template", "auto"), model, False)
        default = "infllm" if self.protocol == "infllm" else ("gpt4" if self.chat else "yarn_mistral")
        self.template_set = cfg.get("templates") or default
        self.max_length = int(cfg.get("max_length") or model.max_length)

    # data ------------------------------------------------------------------------------------------
    def rows(self, task: str) -> list[dict]:
        if self.cfg.get("data_dir"):
            return read_jsonl(Path(self.cfg.data_dir) / f"{task}.jsonl")
        try:
            from huggingface_hub import hf_hub_download

            path = hf_hub_download(HUB_ID, f"{task}.jsonl", repo_type="dataset")
        except Exception as e:
            raise ConfigError(f"cannot fetch {HUB_ID}/{task}.jsonl ({type(e).__name__}: {e}); set "
                              f"task.data_dir, or task.generate=true for the retrieval tasks") from e
        return read_jsonl(Path(path))

    def samples(self) -> Iterator[Sample]:
        for task in self.subsets:
            yield from self.subset_samples(task)

    def subset_samples(self, task: str) -> Iterator[Sample]:
        per = self.cfg.get("limit_per_subset")
        if self.cfg.get("generate"):
            n = int(self.cfg.get("gen_samples", 20))
            for i in range(n if per is None else min(n, int(per))):
                yield self.synthetic(task, i, n)
            return
        for i, eg in enumerate(self.rows(task)):
            if per is not None and i >= int(per):
                break
            yield self.build(task, eg, f"{task}/{eg.get('id', i)}")

    def spread(self, limit: int) -> Iterator[Sample]:
        """`task.limit`: the subsets in turn (base.round_robin), not the first subset's first rows."""
        return round_robin([self.subset_samples(t) for t in self.subsets], limit)

    # prompt ----------------------------------------------------------------------------------------
    def max_new(self, task: str) -> int:
        return int(self.cfg.get("max_new_tokens") or MAX_NEW_TOKENS[self.protocol][task])

    def encode(self, task: str, eg: dict, truncate: bool = True) -> tuple[list[int], int, bool]:
        """(final input ids, token count before truncation, truncated)."""
        prompt = format_prompt(task, eg, TEMPLATES[self.template_set][task])
        if not truncate:
            ids = encode_prompt(self.tokenizer, apply_chat(self.tokenizer, prompt) if self.chat else prompt)
            return ids, len(ids), False
        if self.protocol == "official":
            prompt, n_full = official_truncate(self.tokenizer, prompt, self.max_length)
            truncated = n_full > self.max_length
        ids = encode_prompt(self.tokenizer, apply_chat(self.tokenizer, prompt) if self.chat else prompt)
        if self.protocol == "infllm":
            n_full, keep = len(ids), self.max_length - self.max_new(task)
            truncated = len(ids) > keep
            if truncated:
                ids = ids[:INFLLM_INIT_TOKENS] + ids[-(keep - INFLLM_INIT_TOKENS):]
        return ids, n_full, truncated

    def build(self, task: str, eg: dict, sid: str, params: dict | None = None) -> Sample:
        ids, n_full, truncated = self.encode(task, eg)
        label = get_label(task, eg)
        refs = [str(x) for x in (label if isinstance(label, list) else [label])]
        ctx = eg["content"] if "content" in eg else eg["context"]
        return Sample(
            id=sid, input_ids=ids, references=refs, max_new_tokens=self.max_new(task),
            params={"subset": task, "length": len(ctx.split()), "prompt_tokens": len(ids),
                    "prompt_tokens_full": n_full, "truncated": truncated, **(params or {})},
            extra={"subset": task, "label": label})

    def synthetic(self, task: str, i: int, n: int) -> Sample:
        """Sample i of n: needle depth i/(n-1), noise sized so the final prompt has gen_length
        tokens (+-1%): a linear estimate, then corrections with the real token count."""
        target = int(self.cfg.gen_length)
        rng = random.Random(f"{self.cfg.get('seed', 42)}:{task}:{target}:{i}")
        state = {"key": _digits(rng, task)} if task != "kv_retrieval" else {
            "pairs": [(_uuid(rng), _uuid(rng)) for _ in range(target // 16 + 2)]}
        depth = i / (n - 1) if n > 1 else 0.5

        def count(units: int) -> tuple[int, dict]:
            row = synthetic_row(task, units, depth, state, bool(self.cfg.get("gen_kv_newline", True)))
            return len(self.encode(task, row, truncate=False)[0]), row

        # never longer than what the protocol keeps untruncated
        limit = self.max_length - (self.max_new(task) if self.protocol == "infllm" else 0)
        lo, _ = count(2)
        hi, _ = count(34)
        per = max((hi - lo) / 32, 1e-6)
        units = max(2, 2 + round((target - lo) / per))
        best = None
        for _ in range(10):
            units = min(units, len(state.get("pairs", ())) or units)
            got, row = count(units)
            if got <= limit and (best is None or abs(got - target) < abs(best[0] - target)):
                best = (got, row, units)
            if got <= limit and abs(got - target) <= max(0.002 * target, per / 2):
                break
            units = max(2, units + (round((target - got) / per) if got <= limit else
                                    min(-1, round((limit - got) / per) - 1)))
        if best is None:
            raise ConfigError(f"cannot build a {task} prompt of {target} tokens within the "
                              f"{limit}-token limit")
        got, row, units = best
        params = {"gen_length": target, "depth": round(depth, 4), "units": units}
        return self.build(task, row, f"{task}/gen{target}/{i}", params)

    # scoring ---------------------------------------------------------------------------------------
    def score(self, sample: Sample, prediction: str) -> dict[str, float]:
        task = sample.extra["subset"]
        fn = metrics.INFINITEBENCH_METRIC[task]
        if task == "code_debug" and self.protocol == "infllm":
            fn = metrics.ib_code_debug_infllm
        return {"score": fn(prediction, sample.extra["label"])}

    def group_by(self) -> list[str]:
        return ["subset"]

    def summarize(self, rows: list[dict]) -> dict[str, Any]:
        per: dict[str, list[float]] = {}
        for r in rows:
            per.setdefault(r["params"]["subset"], []).append(float(r["metrics"]["score"]))
        by = {k: {"n": len(v), "score": round(100 * sum(v) / len(v), 2)} for k, v in per.items()}
        out: dict[str, Any] = {"n": len(rows), "by_subset": by}
        if by:
            out["average"] = round(sum(v["score"] for v in by.values()) / len(by), 2)
            out["average_of"] = averaged_over({k: v["n"] for k, v in by.items()}, list(self.subsets))
            if "kv_retrieval" in by and len(by) > 1:
                rest = [v["score"] for k, v in by.items() if k != "kv_retrieval"]
                out["average_without_kv"] = round(sum(rest) / len(rest), 2)
        return out

    def describe(self) -> dict[str, Any]:
        return {
            "task": self.name, "protocol": self.protocol, "templates": self.template_set,
            "chat_template": self.chat, "max_length": self.max_length,
            "truncation": ("middle: ids[:M//2] + ids[-(M//2):] of the templated prompt"
                           if self.protocol == "official" else
                           "suffix: first 128 + last (M - max_new_tokens - 128) chat-wrapped ids"),
            "data": "generated (construct_synthetic_dataset.py strings)" if self.cfg.get("generate")
                    else (self.cfg.get("data_dir") or f"hub {HUB_ID}"),
            **({"gen_kv_newline": bool(self.cfg.get("gen_kv_newline", True))}
               if self.cfg.get("generate") and "kv_retrieval" in self.subsets else {}),
            "metric": "InfiniteBench compute_scores.py" + (
                " (Code.Debug: InfLLM variant)" if self.protocol == "infllm" else ""),
            "en_sum_rouge": "rougeLsum F (rouge-score, no stemmer; = HF evaluate 'rouge')",
        }
