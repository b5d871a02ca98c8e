"""Cascading KV Cache items on datasets that are not on these machines: Table 2 (Booksum) and Table 9 /
Fig. 9 (LongBench). They run wherever the data is (`-- task.data_dir=DIR` after the item key is added
to every run and to the matching) and, without rows, render their no-data table here (Impl.data,
analysis/nodata.py).

Booksum (tasks/booksum.py variant=cascade: the reference's Long-Data-Collections book-level set, 5%
test split, its prompt, greedy 512 tokens, predictions cut to 256 tokens, rouge-score F x100, stemmed): the
paper names neither the scorer nor the data's source; the reference code (cascade/main/jobs/booksum.py)
scores with Perl ROUGE-1.5.5 through pyrouge (stemmed), which reads one sentence per line, so its ROUGE-L
is summary-level: rouge-score's `rougeLsum`, the Rouge-L column here (`rougeL`, one LCS over the whole
text, stays in the rows). Cascade and StreamingLLM (one cascade) with the reference's cache
2^floor(log2(L/2)) (method.cache_rule=half), stride 512, the whole book streamed (task.truncation=none);
the vanilla baseline truncated from the left to the model's length (the reference: 32768 - 512).
LongBench (tasks/longbench.py, the paper's six tasks, preset cascade6): cache 2^floor(log2(L/4))
(cache_rule=quarter), stride 512. L is the sequence the engine allocates (prompt + new tokens), the
reference's L the prompt: the two rules differ only where that crosses a power of two.
Rows of methods that are not on this branch (H2O/SnapKV/BigBird: evict branch; the truncated flash
baseline needs a per-sample truncation length; MInference, PyramidKV as run there) show the paper only.
"Cascade (Ours) + MInference" (the paper's `cascade+minference`) is method=minference_cascade (a ~100K stride).
"""
from __future__ import annotations

import pandas as pd

from analysis import render
from analysis.catalogue import Impl, register
from analysis.nodata import BOOKSUM, infinitebench, longbench
from analysis.papers.cascade_render import (
    RUN_EXTRA,
    bars_figure,
    facts_note,
    header,
    model_args,
    multi_stats,
    paper_rows,
    tables,
)

STRIDE = 512


def cascade(rule: str, cap: int, cascades: str = "1,4") -> list[str]:
    return ["method=cascade", "method.sink=64", f"method.cache_rule={rule}", f"method.cache_size={cap}",
            f"method.cascades={cascades}", f"method.stride={STRIDE}"]


def method_row(v: dict, ours: str) -> str:
    m = v["method"]
    if m == "minference_cascade":                    # the paper's label (Table 9: LLaMA3.1-8B only)
        return f"{ours} + MInference"
    if m == "cascade":
        return "Streaming LLM" if int(v.get("method.cascades", 4)) == 1 else ours
    return {"full": "Vanilla Transformer", "h2o": "H2O", "snapkv": "Snap KV", "bigbird": "BigBird"}.get(m, m)


# --- Table 2: Booksum ------------------------------------------------------------------------------
BOOKSUM_MODELS = {"paper": (["llama31_8b", "qwen2_7b"], 65536), "embedded": (["smollm2"], 2048)}
# the reference code's Perl ROUGE-L is summary-level (sentences = lines): rouge-score's rougeLsum, not rougeL
ROUGE = {"rouge1": "Rouge-1", "rouge2": "Rouge-2", "rougeLsum": "Rouge-L"}
BOOKSUM_LABEL = {"llama31_8b": "Llama 3.1-8B", "qwen2_7b": "Qwen 2-7B", "smollm2": "SmolLM2-135M"}


def _booksum_sweeps(profile: str) -> list[list[str]]:
    models, cap = BOOKSUM_MODELS[profile]
    task = ["task=booksum", "task.variant=cascade"]
    out = []
    for m in models:
        out += [[*task, "task.truncation=none", *model_args(m), *cascade("half", cap)],
                [*task, "task.truncation=left", *model_args(m), "method=full"],
                [*task, "task.truncation=none", *model_args(m), "method=h2o", "method.budget=9216"],
                [*task, "task.truncation=none", *model_args(m), "method=snapkv"],
                [*task, "task.truncation=none", *model_args(m), "method=bigbird"]]
    return out


def _booksum_render(item, impl, df, profile, out):
    """One cell per run in the frame (ROUGE-1); expanded here to ROUGE-1/2/L from RUN_EXTRA."""
    rows = []
    for _, x in df.iterrows():
        extra = RUN_EXTRA.get(x["run"], {}) if isinstance(x["run"], str) and x["run"] else {}
        for key, col in ROUGE.items():
            if x["col"] not in (col, "Rouge-1"):
                continue
            st = extra.get(key, {})
            rows.append({**x.to_dict(), "col": col, "ours": st.get("ours"), "ci_lo": st.get("ci_lo", float("nan")),
                         "ci_hi": st.get("ci_hi", float("nan")), "n": st.get("n", x["n"]),
                         "paper": _paper(x["block"], x["row"], col)})
    full = pd.DataFrame(rows).drop_duplicates(["block", "row", "col"])
    md = (header(item, impl, profile, full, "ROUGE F x100 (rouge-score, stemmed; Rouge-L = rougeLsum, the "
                 "summary-level ROUGE-L that the reference code's Perl ROUGE-1.5.5 computes; the paper names no "
                 "scorer)") + tables(full, 2, row_title="Method") + facts_note(item.key))
    return render.write(out, item.key, md, full, bars_figure(full, item.key, "ROUGE"))


def _paper(block, row, col):
    for r in paper_rows("cascade.table2"):
        if (r["block"], r["row"], r["col"]) == (block, row, col):
            return r["paper"]
    return float("nan")


TABLE2 = Impl(
    title="Booksum ROUGE, book level (Cascading Table 2)",
    sweeps={p: _booksum_sweeps(p) for p in BOOKSUM_MODELS},
    label=lambda v: (BOOKSUM_LABEL.get(v["model"], v["model"]), method_row(v, "Cascade (Ours)"), "Rouge-1"),
    render=_booksum_render, paper=paper_rows("cascade.table2"),
    setup={"paper": "llama31_8b, qwen2_7b; booksum variant=cascade (give task.data_dir: not on these machines); "
                    "cascade/StreamingLLM cache 2^floor(log2(L/2)) up to 65536, stride 512.",
           "embedded": "SmolLM2-135M-Instruct; cache 2^floor(log2(L/2)) up to 2048 (its 8K positions), stride 512."},
    paper_setup="Llama 3.1-8B and Qwen 2-7B (Table 5: instruct), Booksum; cache, data source and scorer not stated "
                "(the reference code: 2^floor(log2(L/2)), Long-Data-Collections' book-level set, Perl ROUGE-1.5.5 "
                "via pyrouge).",
    metric="rouge1", scale=1.0, aggregate=multi_stats(list(ROUGE)), data=(BOOKSUM,),
)


# --- Table 9 / Fig. 9: LongBench -------------------------------------------------------------------
SUBSETS = {"narrativeqa": "Narrative QA", "hotpotqa": "HotPot QA", "qasper": "Qasper", "multi_news": "Multi News",
           "2wikimqa": "2 Wiki MQA", "gov_report": "Gov. Report"}
LB_MODELS = {"paper": (["llama31_8b", "qwen2_7b"], 65536), "embedded": (["smollm2"], 2048)}
LB_LABEL = {"llama31_8b": "LLaMA3.1-8B Instruct", "qwen2_7b": "Qwen2-7B", "smollm2": "SmolLM2-135M"}


# MInference + Cascade (appendix C.1): the cascade's LongBench cache rule with the paper's ~100K stride, each chunk's
# self-attention MInference's (methods/minference_cascade.py; the model's pattern file), LLaMA3.1-8B only as the
# paper. In-cache positions reach sink + cache + stride: within Llama-3.1's 131072 the quarter rule's largest cache
# under 128K prompts (32768) leaves a 98240 stride (it differs from 100K only for prompts over 98K tokens); the
# embedded model's 8K positions take a 4096 stride under its 2048 cache.
MC = {"paper": (32768, 98240), "embedded": (2048, 4096)}      # profile -> (cache_size cap, stride)


def minference_cascade(profile: str) -> list[str]:
    cap, stride = MC[profile]
    return ["method=minference_cascade", "method.sink=64", "method.cache_rule=quarter", f"method.cache_size={cap}",
            f"method.stride={stride}"]


def _lb_sweeps(profile: str) -> list[list[str]]:
    models, cap = LB_MODELS[profile]
    subsets = ",".join(SUBSETS)
    return [["task=longbench", f"task.subsets={subsets}", *model_args(m), *cascade("quarter", cap)] for m in models] + \
        [["task=longbench", f"task.subsets={subsets}", *model_args(m), "method=bigbird"] for m in models] + \
        [["task=longbench", f"task.subsets={subsets}", *model_args(models[0]), *minference_cascade(profile)]]


def with_means(df: pd.DataFrame, n_cols: int, paper: list[dict]) -> pd.DataFrame:
    """The frame plus a Mean column per (block, row): the mean of its task cells once all n_cols have
    a value (no interval: tasks differ in n), beside the paper's printed mean."""
    means = []
    for (block, row), g in df.groupby(["block", "row"], sort=False):
        ours = g["ours"].dropna()
        means.append({"block": block, "row": row, "col": "Mean", "ours": ours.mean() if len(ours) == n_cols else None,
                      "ci_lo": float("nan"), "ci_hi": float("nan"), "n": 0, "status": "done" if len(ours) == n_cols
                      else "missing", "run": "", "paper": None})
    full = pd.concat([df[df["col"] != "Mean"], pd.DataFrame(means)], ignore_index=True)
    paper_mean = {(r["block"], r["row"]): r["paper"] for r in paper if r["col"] == "Mean"}
    full.loc[full["col"] == "Mean", "paper"] = [paper_mean.get((b, r)) for b, r in
                                                zip(full.loc[full["col"] == "Mean", "block"],
                                                    full.loc[full["col"] == "Mean", "row"])]
    return full


def _lb_render(item, impl, df, profile, out):
    full = with_means(df, len(SUBSETS), impl.paper)
    md = (header(item, impl, profile, full, "LongBench score x100 per task (official metrics) and their mean")
          + tables(full, 2, row_title="Method") + facts_note(item.key))
    return render.write(out, item.key, md, full, bars_figure(full[full["col"] != "Mean"], item.key, "score"))


def _lb_impl(title: str, paper_key: str) -> Impl:
    return Impl(
        title=title, sweeps={p: _lb_sweeps(p) for p in LB_MODELS},
        label=lambda v: (LB_LABEL.get(v["model"], v["model"]), method_row(v, "Cascade (Ours)"),
                         SUBSETS[str(v["task.subsets"])]),
        render=_lb_render, paper=paper_rows("cascade.table9"),
        setup={"paper": "llama31_8b, qwen2_7b; longbench cascade6 (task.data_dir where the data is); cache "
                        "2^floor(log2(L/4)) up to 65536, stride 512, 64 sinks.",
               "embedded": "SmolLM2-135M-Instruct (prompts middle-truncated to its 7500 tokens as LongBench does); "
                           "cache 2^floor(log2(L/4)) up to 2048, stride 512."},
        paper_setup="LLaMA3.1-8B/70B Instruct, Qwen2-7B/72B; cache 2^floor(log2(L/4)); stride 512.",
        metric="score", data=(longbench(SUBSETS),))


register("cascade.table9", _lb_impl("LongBench, cache 2^floor(log2(L/4)) (Cascading Table 9)", "cascade.table9"))
register("cascade.fig9", _lb_impl("LongBench radar of Table 9 (Cascading Fig. 9)", "cascade.fig9"))
register("cascade.table2", TABLE2)


# --- Table 10: InfiniteBench -----------------------------------------------------------------------
IB = {"longbook_choice_eng": "en.MC", "longbook_qa_eng": "en.QA", "longbook_sum_eng": "en.Sum"}
# the paper's 32768 cache for Llama-3.1-8B; the embedded model's 8K positions take 2048 (as its LongBench
# cells). Prompts stream whole through the cache up to OpenBMB's 128K truncation (the embedded model:
# its 7500-token task limit, where the data-bound prompts would be cut in the middle).
IB_MODELS = {"paper": ("llama31_8b", 32768, ["task.max_length=128000"]), "embedded": ("smollm2", 2048, [])}
IB_BLOCK = {"llama31_8b": "32768 / LLaMA3.1-8B Instruct", "smollm2": "2048 / SmolLM2-135M"}


def _ib_sweeps(profile: str) -> list[list[str]]:
    model, cap, extra = IB_MODELS[profile]
    task = ["task=infinitebench", "task.protocol=official", "task.subsets=" + ",".join(IB), *extra, *model_args(model)]
    return [[*task, *cascade("fixed", cap)], [*task, "method=minference"]]


def _ib_render(item, impl, df, profile, out):
    full = with_means(df, len(IB), impl.paper)
    md = (header(item, impl, profile, full, "InfiniteBench score x100 per task (OpenBMB compute_scores) and their "
                 "mean") + tables(full, 2, row_title="Method")
          + "\nNotes. The three tasks are data-bound (the hub's xinrongzhang2022/InfiniteBench, or task.data_dir): "
            "no rows on machines without them. MInference: method=minference with the model's pattern file "
            "(methods/patterns/: the reference's own for Llama-3.1-8B, searched here for SmolLM2), prompts cut to "
            "task.max_length as the paper's truncation.\n")
    return render.write(out, item.key, md, full, bars_figure(full[full["col"] != "Mean"], item.key, "score"))


register("cascade.table10", Impl(
    title="InfiniteBench en.MC / en.QA / en.Sum (Cascading Table 10)",
    sweeps={p: _ib_sweeps(p) for p in IB_MODELS},
    label=lambda v: (IB_BLOCK.get(v["model"], v["model"]),
                     "MInference (truncated)" if v["method"] == "minference" else method_row(v, "Cascade (Ours)"),
                     IB[str(v["task.subsets"])]),
    render=_ib_render, paper=paper_rows("cascade.table10"),
    setup={"paper": "llama31_8b; infinitebench cascade3 (official protocol; the hub or task.data_dir), prompts to "
                    "128K; cascade 64 sinks + 32768, 1 (StreamingLLM) and 4 cascades, stride 512.",
           "embedded": "SmolLM2-135M-Instruct; the same tasks cut to its 7500 tokens; cache 2048, stride 512."},
    paper_setup="LLaMA3.1-8B Instruct, total cache 32768; MInference truncates the middle of the prompt.",
    metric="score", data=(infinitebench(IB),)))
