"""Tactic Fig. 11: LongBench (six tasks) at attention-weight targets 50/70/90 %, with Quest and
StreamingLLM at the token budget Tactic selected: "For each dataset, we first evaluate Tactic using
weight percent thresholds of 50%, 70%, and 90%. The average number of tokens selected at each threshold
serves as the token budget for evaluating Quest and StreamingLLM" (sec. 4.2.3).

Two stages. The first runs Tactic per task and target (tasks/longbench.py, the official prompts and
scorers). Its rows carry `method_attended`, the mean tokens Tactic attended per KV head and decode step
in the sample; the task's budget at a target is the mean of that over the task's samples, rounded. The
second stage (Impl.derive) runs Quest (page 32; 8 embedded) and StreamingLLM (4 sinks + K-4 recent) at
those budgets, once the first stage has rows: `python -m analysis run tactic.fig11` runs both when the
launcher waits (local), Slurm needs the command twice. Two targets that give the same budget share one
baseline run (shown under the first). The paper shows bars only (no numbers to compare).
"""
from __future__ import annotations

import pandas as pd

from analysis import render
from analysis.catalogue import Impl, register
from analysis.nodata import longbench
from analysis.papers.tactic import NAMES, PROFILES, TARGETS, csv_list

SUBSETS = ["narrativeqa", "hotpotqa", "qasper", "triviaqa", "multifieldqa_en", "passage_retrieval_en"]
# (profile, subset, method, budget) -> the target whose mean budget it is (filled by _derive; the label
# of a baseline cell); a budget no Tactic cell gave is labelled by itself
_MATCHED: dict[tuple, str] = {}


def _task(subset: str) -> list[str]:
    return ["task=longbench", f"task.subsets={subset}"]


def _sweeps(profile: str) -> list[list[str]]:
    model = PROFILES[profile][0]
    return [[*_task(s), f"model={model}", "method=tactic", f"method.target={csv_list(TARGETS)}"] for s in SUBSETS]


def _target(v: dict) -> str:
    return f"{float(v['method.target']) * 100:g}%"


def matched_budget(run) -> int | None:
    """Tactic's mean attended tokens over a run's samples (each sample: its mean per head and step)."""
    vals = [r["metrics"]["method_attended"] for r in run.rows()
            if r.get("metrics", {}).get("method_attended") is not None]
    return max(1, round(sum(vals) / len(vals))) if vals else None


def _derive(profile: str, cells: list) -> list[list[str]]:
    model, _, _, page, _ = PROFILES[profile]
    for key in [k for k in _MATCHED if k[0] == profile]:     # planned afresh from these cells' rows
        del _MATCHED[key]
    out = []
    for c in cells:
        if c.values["method"] != "tactic" or c.status != "done":
            continue
        k = matched_budget(c.run)
        if k is None:
            continue
        subset = c.values["task.subsets"]
        for method, opts in (("quest", [f"method.page_size={page}"]), ("streaming_llm", ["method.sink=4"])):
            _MATCHED.setdefault((profile, subset, method, k), _target(c.values))
            out.append([*_task(subset), f"model={model}", f"method={method}", *opts, f"method.budget={k}"])
    return out


def _label(v: dict):
    if v["method"] == "tactic":
        return v["task.subsets"], NAMES["tactic"], _target(v)
    k = int(v["method.budget"])
    model = v["model"]
    profile = next((p for p, spec in PROFILES.items() if spec[0] == model), "")
    col = _MATCHED.get((profile, v["task.subsets"], v["method"], k), f"K={k}")
    return v["task.subsets"], NAMES[v["method"]], col


def render_fig11(item, impl, df: pd.DataFrame, profile: str, out) -> list:
    """Per task: rows Tactic / Quest / StreamingLLM, columns the targets (`mean [interval]`), the
    budgets beside; one bar panel per task."""
    budgets = {(r["block"], r["col"]): r["overrides"].split("method.budget=")[1].split()[0]
               for _, r in df.iterrows() if "method.budget=" in r["overrides"]}
    md = (render.header(item, impl, profile, df) + render.markdown_tables(df, col_name=str, row_title="Method")
          + "\nBudgets (tokens per KV head, matched to Tactic's mean at each target):\n\n"
          + ("\n".join(f"- {b}, {c}: {k}" for (b, c), k in sorted(budgets.items())) or "- none yet (no Tactic rows)")
          + "\n\n" + __doc__.split("\n\n", 1)[1])
    plt = render._plt()
    blocks = list(dict.fromkeys(df["block"])) or [""]
    fig, axes = plt.subplots(1, len(blocks), figsize=(3.2 * len(blocks), 3.2), squeeze=False)
    cols = [f"{t * 100:g}%" for t in TARGETS]
    for ax, block in zip(axes[0], blocks):
        b = df[df["block"] == block]
        for i, r in enumerate(dict.fromkeys(b["row"])):
            s = b[b["row"] == r].set_index("col").reindex(cols)
            ax.bar([j + 0.27 * (i - 1) for j in range(len(cols))], s["ours"].fillna(0), width=0.27, label=r,
                   color=f"C{i}")
        ax.set_xticks(range(len(cols)), [f"{c}\nK={budgets.get((block, c), '?')}" for c in cols], fontsize=6)
        ax.set_title(block, fontsize=8)
    axes[0][0].set_ylabel(f"LongBench {impl.metric}")
    axes[0][-1].legend(fontsize=6)
    fig.suptitle(f"{item.key} ({profile}): LongBench at matched budgets", fontsize=9)
    return render.write(out, item.key, md, df, fig)


register("tactic.fig11", Impl(
    title="LongBench, 6 tasks at 50/70/90 % (Quest, StreamingLLM at Tactic's budgets) (Tactic Fig. 11)",
    sweeps={p: _sweeps(p) for p in PROFILES}, label=_label, render=render_fig11, derive=_derive,
    setup={"paper": "Llama-3.1-8B-Instruct, LongBench (tasks/longbench.py; the hub's THUDM/LongBench or "
                    "task.data_dir), Tactic 50/70/90 %, Quest page 32 and StreamingLLM (4, K-4) at Tactic's "
                    "mean budget per task and target.",
           "embedded": "SmolLM2-135M-Instruct, the same tasks truncated to its 7500 tokens (the data from the "
                       "hub or task.data_dir), Quest page 8."},
    paper_setup="Llama-3.1-8B-Instruct, 6 LongBench tasks, Tactic 50/70/90 %, Quest and StreamingLLM at the "
                "average number of tokens Tactic selected (bars only).",
    metric="score", data=(longbench(SUBSETS),)))
