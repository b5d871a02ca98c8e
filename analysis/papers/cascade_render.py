"""Shared pieces of the Cascading KV Cache items (analysis/papers/cascade*.py): the statistics of a
cell that is not a per-sample mean (token-weighted perplexity over books), tables with decimals
(perplexities, ROUGE), line and bar figures, and the paper's numbers and facts as rows and notes.

Some items show more than one number per run (ROUGE-1/2/L; a perplexity curve along the book): their
`aggregate` returns the cell's main statistic to analysis.render.frame and keeps the rest per run
id in RUN_EXTRA, which their renderer reads in the same process (render always follows frame).
"""
from __future__ import annotations

import math

import pandas as pd

from analysis import papers_data, render
from analysis.runs import book_rows
from analysis.runs import ppl_stats as run_ppl
from analysis.stats import interval

RUN_EXTRA: dict[str, dict] = {}
MODEL_LABEL = {"llama31_8b": "LLaMA3.1-8B", "qwen2_7b": "Qwen2-7B", "smollm2": "SmolLM2-135M"}
# Qwen2-7B has 32768 positions; the reference ran it with caches whose in-cache positions pass them
# (32K cache + 64 sinks + stride; 65K caches of the half/quarter rules), RoPE computed past the trained
# length. Its cells say so: model.max_position lets a method use positions up to 131072.
MODEL_EXTRA = {"qwen2_7b": ["model.max_position=131072"]}


def model_args(model: str) -> list[str]:
    """A cell's model overrides: the model group and, for Qwen2-7B, the reference's positions."""
    return [f"model={model}", *MODEL_EXTRA.get(model, [])]


def ppl_stats(run) -> dict | None:
    """Token-weighted perplexity over the run's books (analysis.stats.token_ppl: the reference's
    nll-total / count-total, books as clusters). Keeps the books' NLL curves (metrics.nll_curve) in
    RUN_EXTRA."""
    st = run_ppl(run)
    if st is None:
        return None
    rows = [r["metrics"] for r in book_rows(run)]
    RUN_EXTRA[run.run_id] = {"curves": [m["nll_curve"] for m in rows if isinstance(m.get("nll_curve"), list)],
                             "tokens": sum(int(m["tokens"]) for m in rows)}
    return st


def multi_stats(metrics: list[str], scale: float = 1.0):
    """An aggregate: the mean [95% interval] of the first metric for the table cell; every metric's
    in RUN_EXTRA[run id]."""
    def agg(run):
        out = {}
        for m in metrics:
            vals = [r["metrics"][m] for r in run.rows() if isinstance((r.get("metrics") or {}).get(m), (int, float))]
            if vals:
                lo, hi, how = interval(vals)
                out[m] = {"ours": sum(vals) / len(vals) * scale, "ci_lo": lo * scale, "ci_hi": hi * scale,
                          "ci": how, "n": len(vals)}
        RUN_EXTRA[run.run_id] = out
        return out.get(metrics[0])
    return agg


def paper_rows(key: str, skip_cols=lambda c: False, block_of=lambda b: b, row_of=lambda r: r) -> list[dict]:
    return [{"block": block_of(r["block"]), "row": row_of(r["row"]), "col": r["col"], "paper": r["paper"]}
            for r in papers_data.rows(key) if not skip_cols(r["col"])]


def facts_note(key: str) -> str:
    facts = papers_data.facts(key)
    if not facts:
        return ""
    # a table prints its numbers (they are the cells' paper values); a figure's facts are all the numbers it has
    where = "quoted from the paper's text" if ".table" in key else "quoted; the figure itself prints no numbers"
    lines = ["", f"Paper facts ({where}):", ""]
    lines += [f"- {f['name']}: {f.get('printed', f['value'])}{' ' + f['unit'] if f.get('unit') else ''} — "
              f"\"{f['quote']}\"" for f in facts]
    return "\n".join(lines) + "\n"


def header(item, impl, profile: str, df: pd.DataFrame, what: str) -> str:
    """As analysis.render.header, for cells that are not percentages: `what` says what they hold."""
    done = int((df["status"] == "done").sum())
    todo = int(df["status"].isin(["missing", "partial"]).sum())
    ni = int((df["status"] == "not implemented").sum())
    lines = [f"# {item.key}: {impl.title}", "", f"Profile `{profile}`. Ours: {impl.setup.get(profile, '')}",
             f"Paper: {impl.paper_setup}", "",
             (f"Cells read `ours [lo–hi] (paper)`: {what}; {render.DASH} = no result yet; * = partial; n/i = the "
             f"method is not implemented on this branch; n = samples per cell. {done} cells done, {todo} missing or partial, {ni} not implemented (their methods live "
             f"on another branch or do not exist here; the paper's numbers stay).")]
    runs = df[df["run"].fillna("") != ""]
    if len(runs):
        commits = ", ".join(sorted(set(runs["commit"].fillna("?").replace("", "?"))))
        devices = ", ".join(sorted(set(runs["device"].fillna("?"))))
        lines.append(f"Rendered from the committed compact rows of {runs['run'].nunique()} runs (results/rows/) at "
                     f"commit(s) {commits}; device and dtype: {devices}.")
    if todo:
        lines.append(f"Fill the missing cells: `make {item.target()} PROFILE={profile}`.")
    return "\n".join(lines) + "\n"


def _num(v, d: int) -> str:
    return render.DASH if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{d}f}"


def tables(df: pd.DataFrame, decimals: int = 2, col_name=str, row_title: str = "") -> str:
    """One markdown table per block: `ours [lo–hi] (paper)` with `decimals`, n per row."""
    out = []
    for block in df["block"].unique():
        b = df[df["block"] == block]
        cols = list(dict.fromkeys(b["col"]))
        out += [f"\n### {block}\n" if block else "", "| " + " | ".join([row_title] + [col_name(c) for c in cols]
                                                                           + ["n"]) + " |",
                "|" + "---|" * (len(cols) + 2)]
        for r in b["row"].unique():
            sub = b[b["row"] == r].drop_duplicates("col").set_index("col")
            cells, ns = [], [int(x) for x in sub["n"] if x]
            for c in cols:
                if c not in sub.index:
                    cells.append("")
                    continue
                x = sub.loc[c]
                text = "n/i" if x["status"] == "not implemented" else _num(x["ours"], decimals)
                text += "*" if x["status"] == "partial" else ""
                if not pd.isna(x["ours"]) and all(math.isfinite(float(x[k])) for k in ("ci_lo", "ci_hi")):
                    text += f" [{_num(x['ci_lo'], decimals)}–{_num(x['ci_hi'], decimals)}]"
                if not pd.isna(x["paper"]):
                    text += f" ({_num(x['paper'], decimals)})"
                cells.append(text)
            label = f"{r} — not implemented" if set(sub["status"]) == {"not implemented"} else r
            out.append("| " + " | ".join([str(label)] + cells + [str(max(ns) if ns else 0)]) + " |")
    return "\n".join(out) + "\n"


def lines_figure(df: pd.DataFrame, title: str, xlabel: str, ylabel: str, logx: bool = True, ylim=None,
                 extra=None):
    """One panel per block, one line per row over numeric columns: ours solid (bars: interval),
    paper dashed. `extra(ax, block)` may draw more."""
    plt = render._plt()
    blocks = list(df["block"].unique())
    fig, axes = plt.subplots(1, len(blocks), figsize=(4.4 * len(blocks), 3.4), squeeze=False)
    for ax, block in zip(axes[0], blocks):
        b = df[df["block"] == block]
        for i, r in enumerate(b["row"].unique()):
            s = b[b["row"] == r].assign(x=lambda d: pd.to_numeric(d["col"], errors="coerce")).dropna(subset=["x"])
            s = s.sort_values("x")
            if s["ours"].notna().any():
                ax.errorbar(s["x"], s["ours"], yerr=render._yerr(s), fmt="o-", color=f"C{i % 10}", capsize=2,
                            label=f"{r} (ours)")
            if s["paper"].notna().any():
                ax.plot(s["x"], s["paper"], "x--", color=f"C{i % 10}", alpha=0.6, label=f"{r} (paper)")
        if extra:
            extra(ax, block)
        if logx:
            ax.set_xscale("log", base=2)
        if ylim:
            ax.set_ylim(*ylim)
        ax.set_title(block or title, fontsize=9)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.suptitle(title, fontsize=9)
    return fig


def bars_figure(df: pd.DataFrame, title: str, ylabel: str):
    """One panel per block: ours as bars per (row, col), the paper's as black ticks."""
    plt = render._plt()
    blocks = list(df["block"].unique())
    fig, axes = plt.subplots(1, len(blocks), figsize=(5 * len(blocks), 3.4), squeeze=False)
    for ax, block in zip(axes[0], blocks):
        b = df[df["block"] == block]
        cols, rows = list(dict.fromkeys(b["col"])), list(dict.fromkeys(b["row"]))
        w = 0.8 / max(1, len(rows))
        for i, r in enumerate(rows):
            s = b[b["row"] == r].drop_duplicates("col").set_index("col").reindex(cols)
            xs = [k + i * w for k in range(len(cols))]
            ax.bar(xs, s["ours"].fillna(0), width=w, color=f"C{i % 10}", label=str(r))
            ax.plot(xs, s["paper"], "k_", markersize=12)
        ax.set_xticks([k + 0.4 - w / 2 for k in range(len(cols))], [str(c) for c in cols], fontsize=6, rotation=20)
        ax.set_title(block or title, fontsize=9)
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=6)
    fig.suptitle(f"{title} (bars: ours; black ticks: paper)", fontsize=9)
    return fig
