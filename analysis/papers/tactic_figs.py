"""Tactic items: the motivation and estimation figures 1, 3-4, 5, 6 and 8 (plots in the paper, no
printed numbers: ours only, the paper's stated facts in the notes).

All but Fig. 6 read the exact attention through Tactic's probe (`method.diagnostics=true`,
methods/parts/tactic_probe.py) on the PG-19 side-by-side task (tasks/pg19_compare.py) or RULER:
- Fig. 1 (CDF of sorted attention weights of one layer and head, along decoding and across
  contexts): Tactic at P = 100 % (every token: full attention) with the probe on one layer and head
  (the paper does not say which: the middle layer, head 0). The paper's contexts are LongBench
  prompts; ours are PG-19 windows (LongBench needs the hub), so (b) shows each window's first step.
- Figs. 3-4 (KL and five RULER task scores vs weight percentage, the "optimal selection"): Tactic's
  oracle_global mode, exact top-p by true weight. The paper names NIAH, VT and FWE among its five
  tasks; ours: niah_multikey_1, niah_multiquery, vt, cwe, fwe at 32K (embedded 4K).
- Fig. 5 (minimal budget for 90 % at the first decoding step vs context length, mean over heads and
  layers): the probe's `budget_global_first` after a prefix of each length.
- Fig. 6 (PG-19 perplexity, budget 1024, token by token): the decode protocol of tasks/pg19.py on 4
  books (the paper: "sequences of 32k tokens"), Tactic's top-K mode (the paper's "top-K version").
- Fig. 8 (budgets: global optimal, clustering optimal, Tactic's estimate): the runs of Fig. 7 (the
  same sweep, the same results), three probe metrics per run.
Fig. 11 (LongBench at budgets matched to Tactic's mean selection per dataset) is not implemented: its
baseline budgets come from Tactic's own runs (a two-stage sweep) and LongBench's data is on the hub.
"""
from __future__ import annotations

import pandas as pd

from analysis import render
from analysis.catalogue import Impl, register
from analysis.papers.tactic import (
    COMPARE_SETUP,
    FIG7,
    PROFILES,
    csv_list,
    pg19_task,
    value_table,
)
from analysis.runs import metric_stats, ppl_stats
from analysis.shared_data import EMBEDDED_RULER, PG19_DATA

PROBE = {"paper": (16, 0), "embedded": (15, 0)}          # (layer, query head) of Fig. 1's CDFs
WEIGHTS = [0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99]         # Figs. 3-4 x axis (the paper's is not printed)
FIG4_TASKS = ["niah_multikey_1", "niah_multiquery", "vt", "cwe", "fwe"]
FIG4_LENGTH = {"paper": 32768, "embedded": 4096}
FIG5_LENGTHS = {"paper": [4096, 8192, 16384, 32768, 65536, 126976], "embedded": [1024, 2048, 4096, 6144, 8000]}
FIG6 = {"paper": (1024, 32000, 32, 1024), "embedded": (128, 8000, 8, 512)}  # budget, tokens, Quest page, curve


def _tactic(profile: str, *extra: str) -> list[str]:
    return [f"model={PROFILES[profile][0]}", "method=tactic", "method.diagnostics=true", *extra]


def _pct(v) -> str:
    return f"{float(v) * 100:g}%"


def _stats_frame(df: pd.DataFrame, rows: list[tuple[str, str, float]]) -> pd.DataFrame:
    """One line per (run cell, (row name, metric, scale)): a run's other per-sample metrics as cells."""
    out = []
    for _, x in df.iterrows():
        run = df.attrs.get("runs", {}).get(x["run"]) if isinstance(x["run"], str) and x["run"] else None
        for name, metric, scale in rows:
            st = metric_stats(run, metric, scale) if run is not None else None
            out.append({**x.to_dict(), "row": name, **(st or {"ours": float("nan"), "ci_lo": float("nan"),
                                                              "ci_hi": float("nan"), "n": 0})})
    new = pd.DataFrame(out)
    new.attrs = df.attrs
    return new


# --- Fig. 1 ----------------------------------------------------------------------------------------

def _fig1_render(item, impl, df, profile, out):
    runs = [df.attrs["runs"][r] for r in df["run"] if isinstance(r, str) and r in df.attrs.get("runs", {})]
    rows = [r for run in runs for r in run.rows() if isinstance(r.get("metrics"), dict)]
    keys = sorted({k for r in rows for k in r["metrics"] if k.startswith("method_cdf_t")},
                  key=lambda k: (int(k.split("@")[0][len("method_cdf_t"):]), int(k.split("@")[1])))
    steps = sorted({int(k.split("@")[0][len("method_cdf_t"):]) for k in keys})
    ks = sorted({int(k.split("@")[1]) for k in keys})
    head = [ln for ln in render.header(item, impl, profile, df).splitlines() if not ln.startswith("Cells read")]
    lines = ["\n".join(head) + "\n", ("(a) Mean CDF over the contexts (n per cell), by decoding "
                                       "step: attention probability of the k most attended tokens, %."), ""]
    lines += ["| step | " + " | ".join(f"k={k}" for k in ks) + " | n |", "|" + "---|" * (len(ks) + 2)]
    plt = render._plt()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    for i, s in enumerate(steps):
        vals = [[r["metrics"][f"method_cdf_t{s}@{k}"] for r in rows if f"method_cdf_t{s}@{k}" in r["metrics"]]
                for k in ks]
        means = [100 * sum(v) / len(v) if v else float("nan") for v in vals]
        lines.append(f"| {s} | " + " | ".join(f"{m:.1f}" for m in means) + f" | {max(map(len, vals))} |")
        axes[0].plot(ks, means, "o-", ms=3, color=f"C{i % 10}", label=f"step {s}")
    lines += ["", "(b) Each context's CDF at the first decoding step, % (one line per sample).", "",
              "| context | " + " | ".join(f"k={k}" for k in ks) + " |", "|" + "---|" * (len(ks) + 1)]
    for i, r in enumerate(rows):
        vals = [100 * r["metrics"].get(f"method_cdf_t1@{k}", float("nan")) for k in ks]
        lines.append(f"| {r.get('id', i)} | " + " | ".join(f"{v:.1f}" for v in vals) + " |")
        axes[1].plot(ks, vals, "-", color=f"C{i % 10}", alpha=0.7)
    for ax, title in zip(axes, ("(a) along decoding", "(b) across contexts, step 1")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("k most attended tokens")
        ax.set_ylabel("cumulative attention (%)")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=6)
    fig.suptitle(f"{item.key} ({profile}): ours; the paper's figure is not transcribed", fontsize=8)
    return render.write(out, item.key, "\n".join(lines) + "\n" + FIG1_NOTES, df, fig)


FIG1_NOTES = """
Notes. Full attention (Tactic at P = 100 %, which attends every token), the probe on one layer and
query head (the middle layer, head 0; the paper: "a specific layer and head"). Steps 1, 2, 4, ... of
the 64 teacher-forced steps. The paper's point: the curves differ along decoding and across contexts,
so no fixed budget fits them all.
"""
FIG1 = Impl(
    title="CDF of sorted attention weights along decoding and across contexts (Tactic Fig. 1)",
    sweeps={p: [[*pg19_task(p, "kl", 64), *_tactic(p, "method.mode=oracle_global", "method.target=1.0",
                                                    f"method.probe_layer={PROBE[p][0]}",
                                                    f"method.probe_head={PROBE[p][1]}")]] for p in PROFILES},
    label=lambda v: ("", "Full attention (probe)", "CDF"),
    render=_fig1_render, setup=COMPARE_SETUP, metric="method_cdf@1", scale=100.0,
    paper_setup="model not stated (Llama-3.1-8B-Instruct, section 4.1's, inferred), LongBench inputs, one layer and "
                "head; plot only.",
)


# --- Figs. 3-4 -------------------------------------------------------------------------------------

FIG4_SAMPLES = {"paper": 100, "embedded": 20}
FIG4_ALL = "mean of the 5 tasks"


def _fig34_sweeps(profile: str) -> list[list[str]]:
    """KL per target; RULER: one run per target over the 5 tasks (each task's row reads its rows, _fig4_tasks)."""
    w = csv_list(WEIGHTS)
    kl = [[*pg19_task(profile, "kl", 64), *_tactic(profile, "method.mode=oracle_global", f"method.target={w}")]]
    ruler = [["task=ruler", f"task.lengths=[{FIG4_LENGTH[profile]}]", f"task.samples_per_task={FIG4_SAMPLES[profile]}",
              f"task.tasks=[{','.join(FIG4_TASKS)}]", *(EMBEDDED_RULER if profile == "embedded" else ()),
              *_tactic(profile, "method.mode=oracle_global",
                                                                f"method.target={w}")]]
    return kl + ruler


def _fig4_tasks(profile: str, cells) -> list[list[str]]:
    """Each finished 5-task run read per task (analysis.runs fills a cell over some of a run's RULER tasks)."""
    return [[o for o in c.overrides if not o.startswith("task.tasks=")] + [f"task.tasks=[{t}]"]
            for c in cells if c.status == "done" and c.row == FIG4_ALL for t in FIG4_TASKS]


def _fig34_label(v: dict):
    if v["task"] == "ruler":
        tasks = list(v["task.tasks"])
        return "Fig. 4: RULER score (%)", tasks[0] if len(tasks) == 1 else FIG4_ALL, _pct(v["method.target"])
    return "Fig. 3: KL(full || oracle) (nats)", "KL", _pct(v["method.target"])


def _fig34_stats(run):
    return metric_stats(run, "kl", 1.0) or metric_stats(run, "score", 100.0)


def _fig34_render(item, impl, df, profile, out):
    md = render.header(item, impl, profile, df)
    plt = render._plt()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    for ax, block in zip(axes, ("Fig. 3: KL(full || oracle) (nats)", "Fig. 4: RULER score (%)")):
        b = df[df["block"] == block]
        md += "\n" + _cells(b, 4 if block.startswith("Fig. 3") else 1, block)
        for i, r in enumerate(dict.fromkeys(b["row"])):
            s = b[b["row"] == r]
            x = [float(c.rstrip("%")) for c in s["col"]]
            ax.errorbar(x, s["ours"], yerr=render._yerr(s), fmt="o-", ms=3, capsize=2, color=f"C{i}", label=r)
        ax.set_xlabel("weight percentage (%)")
        ax.set_title(block, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.suptitle(f"{item.key} ({profile}): ours (bars: 95% interval); the paper's figure is not transcribed", fontsize=8)
    return render.write(out, item.key, md + FIG34_NOTES, df, fig)


def _cells(b: pd.DataFrame, digits: int, title: str) -> str:
    cols = list(dict.fromkeys(b["col"]))
    lines = [f"{title}:", "", "| | " + " | ".join(cols) + " | n |", "|" + "---|" * (len(cols) + 2)]
    for r in dict.fromkeys(b["row"]):
        s = b[b["row"] == r].set_index("col")
        cells = [render.DASH if c not in s.index or pd.isna(s.loc[c, "ours"]) else   # (a task row: done runs only)
                 f"{s.loc[c, 'ours']:.{digits}f} [{s.loc[c, 'ci_lo']:.{digits}f}–{s.loc[c, 'ci_hi']:.{digits}f}]"
                 for c in cols]
        lines.append(f"| {r} | " + " | ".join(cells) + f" | {int(s['n'].max())} |")
    return "\n".join(lines) + "\n"


FIG34_NOTES = """
Notes. The optimal selection: each query head attends the fewest tokens whose exact attention weight
reaches the weight percentage (Tactic's oracle_global mode, no forced sinks or window). KL over 64
teacher-forced PG-19 steps (as Fig. 9); RULER at one length (the paper's is not stated), one run per
weight percentage over the five tasks, each task's row read from its rows. The paper names NIAH, VT
and FWE among its five tasks; the other two are our choice.
"""
FIG3_4 = Impl(
    title="KL divergence and RULER scores vs weight percentage, optimal selection (Tactic Figs. 3-4)",
    sweeps={p: _fig34_sweeps(p) for p in PROFILES}, label=_fig34_label, render=_fig34_render, derive=_fig4_tasks,
    setup={p: f"{COMPARE_SETUP[p]} RULER at {FIG4_LENGTH[p]} tokens, {FIG4_SAMPLES[p]} samples per task."
           for p in PROFILES},
    paper_setup="Llama-3.1-8B-Instruct, PG-19 KL and 5 RULER tasks, optimal selection; plot only.",
    metric="kl | score", aggregate=_fig34_stats,
)


# --- Fig. 5 ----------------------------------------------------------------------------------------

def _fig5_sweeps(profile: str) -> list[list[str]]:
    return [[*pg19_task(profile, "kl", 1, prefix=n), *_tactic(profile, "method.mode=oracle_global", "method.target=0.9")]
            for n in FIG5_LENGTHS[profile]]


FIG5 = Impl(
    title="Minimal token budget for 90% attention at the first decoding step vs context (Tactic Fig. 5)",
    sweeps={p: _fig5_sweeps(p) for p in PROFILES},
    label=lambda v: ("", "minimal budget (tokens)", str(v["task.prefix"])),
    render=lambda item, impl, df, profile, out: value_table(item, impl, df, profile, out, digits=1,
                                                            ylabel="tokens for 90% of the weight", notes=FIG5_NOTES),
    setup={p: f"{COMPARE_SETUP[p].split(',')[0]}, PG-19 windows, prefixes {FIG5_LENGTHS[p]} tokens." for p in PROFILES},
    paper_setup="model not stated (Llama-3.1-8B-Instruct, section 4.1's, inferred); the paper: the minimal budget "
                "scales linearly with the context; plot only.",
    metric="method_budget_global_first", scale=1.0,
)
FIG5_NOTES = """
Notes. Columns are prefix lengths (tokens). Per sample: at the first decoding step, for every layer
and query head, the fewest tokens by descending exact weight reaching 90 %, averaged over heads and
layers (the paper's definition); then the mean over samples.
"""


# --- Fig. 6 ----------------------------------------------------------------------------------------

def _fig6_sweeps(profile: str) -> list[list[str]]:
    budget, tokens, page, curve = FIG6[profile]
    task = ["task=pg19", "task.protocol=decode", f"task.num_eval_tokens={tokens}", "task.books=4",
            f"task.curve_window={curve}"]
    if profile == "embedded":
        task += [f"task.data_dir={PG19_DATA}", "task.only_split=test"]
    model = f"model={PROFILES[profile][0]}"
    return [[*task, model, "method=full"],
            [*task, model, "method=quest", f"method.page_size={page}", f"method.budget={budget}"],
            [*task, model, "method=streaming_llm", "method.sink=4", f"method.budget={budget}"],
            # token by token nothing is prefilled: without re-clustering every decoded token stays in
            # the exact set and Tactic is full attention (methods/tactic.py). Every budget / 2 steps the
            # new tokens become clusters of Quest's page size, so |E| <= budget / 2
            [*task, model, "method=tactic", "method.mode=topk", f"method.budget={budget}",
             f"method.cluster_size={page}", f"method.recluster_every={budget // 2}"]]


FIG6_IMPL = Impl(
    title="PG-19 perplexity token by token, budget 1024 (Tactic Fig. 6)",
    sweeps={p: _fig6_sweeps(p) for p in PROFILES},
    label=lambda v: ("", {"full": "Full", "quest": "Quest", "streaming_llm": "StreamingLLM",
                          "tactic": "Tactic (top-K)"}[v["method"]], "perplexity"),
    render=lambda item, impl, df, profile, out: value_table(item, impl, df, profile, out, digits=2,
                                                            ylabel="perplexity", notes=FIG6_NOTES),
    setup={"paper": "Llama-3.1-8B-Instruct, 4 PG-19 test books (hub), 32,000 predictions each, token by token; "
                    "budget 1024 (Quest page 32, StreamingLLM 4 sinks).",
           "embedded": "SmolLM2-135M-Instruct, the 4 PG-19 test books of data/pg19_books, 8,000 predictions each, "
                       "token by token; budget 128 (1024 / 8; Quest page 8, StreamingLLM 4 sinks)."},
    paper_setup="Llama-3.1-8B-Instruct, PG-19 sequences of 32K tokens, token by token, budget 1024; plot only.",
    metric="ppl", scale=1.0, aggregate=ppl_stats,
)
FIG6_NOTES = """
Notes. Token-weighted perplexity over the books (interval: books as clusters). The runs also keep the
NLL per window of predictions (metrics.nll_curve), the paper's x axis. Tactic runs its top-K mode
with the same budget, as the paper does for this figure ("without simulating the number of tokens").
Token by token nothing is prefilled, so Tactic clusters as it goes: every budget / 2 decoded tokens
become new clusters (method.recluster_every, recluster=new) of Quest's page size (method.cluster_size:
32 in the paper profile, 8 here), and the tokens not yet clustered (at most budget / 2) are attended
exactly inside the budget. The paper does not say how it clusters on this protocol.
"""


# --- Fig. 8 ----------------------------------------------------------------------------------------

FIG8_ROWS = [("Global optimal", "method_budget_global", 1.0), ("Clustering optimal", "method_budget_cluster", 1.0),
             ("Tactic estimate", "method_budget_tactic", 1.0)]
FIG8 = Impl(
    title="Token budgets: global optimal, clustering optimal, Tactic's estimate (Tactic Fig. 8)",
    sweeps=FIG7.sweeps,   # the same runs as Fig. 7: three more of their probe metrics
    label=lambda v: ("", "Tactic", _pct(v["method.target"])),
    render=lambda item, impl, df, profile, out: value_table(item, impl, _stats_frame(df, FIG8_ROWS), profile, out,
                                                            digits=1, ylabel="tokens per head", notes=FIG8_NOTES),
    setup=COMPARE_SETUP,
    paper_setup="Llama-3.1-8B-Instruct, PG-19; the paper: the estimate closely matches the clustering optimal.",
    metric="method_budget_tactic", scale=1.0,
)
FIG8_NOTES = """
Notes. Per query head and step, mean over heads, layers, steps, then samples: the global optimal
(fewest tokens by exact weight reaching P), the clustering optimal (the exact set plus the fewest
tokens along the head's cluster-sorted list reaching P with it) and what Tactic attended (its fitted
estimate). Same runs as tactic.fig7.
"""

for _key, _impl in {"tactic.fig1": FIG1, "tactic.fig3-4": FIG3_4, "tactic.fig5": FIG5, "tactic.fig6": FIG6_IMPL,
                    "tactic.fig8": FIG8}.items():
    register(_key, _impl)
