"""Cascading KV Cache Table 4: MMLU accuracy per category and overall (tasks/mmlu.py, run mode choice).

The paper states neither the prompt nor the cache. Its code (cascade/main/jobs/mmlu.py) used 20 shots
in its own format (task.protocol=cascade here) and a cache of 2^floor(log2(mean prompt / 2)) tokens
per subject, at most 16384, split over the cascades. The issue asks for MMLU's official 5-shot protocol,
so these cells run task.protocol=official: the paper's 5-shot prompt, " A".." D", micro averages, and
Hendrycks' categories. The cache follows the reference's rule per prompt (method.cache_rule=half:
2^floor(log2(L/2)) for a sequence of L tokens, at most 16384), stride 512, 64 sinks; StreamingLLM is
the cascade kernel with one cascade. "Vanilla (Truncated)" needs a truncation length per prompt
(method truncate has a fixed budget): the paper's row only. The embedded profile runs SmolLM2-135M
on the first 20 test questions of each subject (MMLU's data: the hub's cais/mmlu, or task.data_dir;
not on these machines, so no rows here).
"""
from __future__ import annotations

import pandas as pd

from analysis import render
from analysis.catalogue import Impl, register
from analysis.nodata import MMLU
from analysis.papers.cascade_render import (
    RUN_EXTRA,
    bars_figure,
    header,
    paper_rows,
    tables,
)
from analysis.papers.cascade_tasks import cascade
from analysis.stats import interval

COLS = {"humanities": "Humanities", "social sciences": "Soc. Science", "other": "Other", "STEM": "STEM"}
MODELS = {"paper": (["llama31_8b", "qwen2_7b"], 16384, []), "embedded": (["smollm2"], 2048, ["task.limit=20"])}
BLOCK = {"llama31_8b": "Llama 3.1-8B", "qwen2_7b": "Qwen 2-7B", "smollm2": "SmolLM2-135M"}


def _sweeps(profile: str) -> list[list[str]]:
    models, cap, extra = MODELS[profile]
    task = ["task=mmlu", "task.protocol=official", *extra]
    return [x for m in models for x in ([*task, f"model={m}", "method=full"],
                                         [*task, f"model={m}", *cascade("half", cap)])]


def _row(v: dict) -> str:
    if v["method"] == "full":
        return "Flash Attention 2 (Full Context)"
    return "Streaming LLM" if int(v.get("method.cascades", 4)) == 1 else "Cascade (Ours)"


def category_stats(run) -> dict | None:
    """Accuracy (%) per category and overall, micro over questions, with 95% intervals; kept in
    RUN_EXTRA for the renderer, Overall returned for the cell."""
    rows = [r for r in run.rows() if isinstance((r.get("metrics") or {}).get("acc"), (int, float))]
    if not rows:
        return None
    groups = {col: [r["metrics"]["acc"] for r in rows if (r.get("params") or {}).get("category") == cat]
              for cat, col in COLS.items()}
    groups["Overall"] = [r["metrics"]["acc"] for r in rows]
    out = {}
    for col, vals in groups.items():
        if vals:
            lo, hi, how = interval(vals)
            out[col] = {"ours": 100 * sum(vals) / len(vals), "ci_lo": 100 * lo, "ci_hi": 100 * hi, "ci": how,
                        "n": len(vals)}
    RUN_EXTRA[run.run_id] = out
    return out["Overall"]


def _render(item, impl, df, profile, out):
    rows = []
    for _, x in df.iterrows():
        extra = RUN_EXTRA.get(x["run"], {}) if isinstance(x["run"], str) and x["run"] else {}
        for col in [*COLS.values(), "Overall"]:
            st = extra.get(col, {})
            rows.append({**x.to_dict(), "col": col, "ours": st.get("ours"), "ci_lo": st.get("ci_lo", float("nan")),
                         "ci_hi": st.get("ci_hi", float("nan")), "n": st.get("n", x["n"]),
                         "paper": _paper(impl, x["block"], x["row"], col)})
    full = pd.DataFrame(rows)
    paper_only = [{"block": p["block"], "row": p["row"], "col": p["col"], "ours": None, "ci_lo": float("nan"),
                   "ci_hi": float("nan"), "n": 0, "status": "paper only", "run": "", "paper": p["paper"]}
                  for p in impl.paper if p["row"] == "Vanilla (Truncated)" and p["block"] in set(full["block"])]
    full = pd.concat([full, pd.DataFrame(paper_only)], ignore_index=True).drop_duplicates(["block", "row", "col"])
    md = (header(item, impl, profile, full, "MMLU accuracy (%) per category and overall (micro over questions)")
          + tables(full, 2, row_title="Method") + "\n" + __doc__.split("\n\n", 1)[1])
    return render.write(out, item.key, md, full, bars_figure(full, item.key, "accuracy (%)"))


def _paper(impl, block, row, col):
    for p in impl.paper:
        if (p["block"], p["row"], p["col"]) == (block, row, col):
            return p["paper"]
    return float("nan")


register("cascade.table4", Impl(
    title="MMLU per category (Cascading Table 4)", sweeps={p: _sweeps(p) for p in MODELS},
    label=lambda v: (BLOCK.get(v["model"], v["model"]), _row(v), "Overall"),
    render=_render, paper=paper_rows("cascade.table4"),
    setup={"paper": "llama31_8b, qwen2_7b; mmlu protocol=official (5-shot, all 14,042 test questions); "
                    "cascade/StreamingLLM cache 2^floor(log2(L/2)) up to 16384, stride 512, 64 sinks.",
           "embedded": "SmolLM2-135M-Instruct; mmlu protocol=official, first 20 test questions per subject "
                       "(1,140); cache 2^floor(log2(L/2)) up to 2048, stride 512, 64 sinks."},
    paper_setup="Llama 3.1-8B, Qwen 2-7B; shots, prompt and cache not stated (the code: 20 shots, cache "
                "2^floor(log2(mean prompt/2)) <= 16384 per subject).",
    metric="acc", aggregate=category_stats, data=(MMLU,)))
