"""Tactic items: Tables 1-5 (RULER), Figs. 7, 9 and 10 (PG-19 side by side with full attention).

Tables 1-5 (tasks/ruler.py, metric `score`, the RULER string match): Table 1 averages the 10 tasks
the paper keeps (NIAH without the three single-needle tasks, QA, VT, CWE/FWE), Tables 2-5 their
groups. A cell is one run, so each group is its own run over its tasks (task.tasks=[...]) and Table 1
a run over all ten: every sample runs twice (once in Table 1, once in its group); Table 1's cell is
the mean over its samples, the mean of task means when every task has as many samples (100 per task in
the paper profile: this harness's choice, the paper states no count).
Budgets as the paper: Tactic weight percentage 50/70/90 %, Quest 448/1024/3328 (page 32, as Tactic's
cluster size), StreamingLLM sink 4 + window K-4. The embedded profile (SmolLM2-135M, 8K positions)
runs 2K/4K/7.4K with the budgets divided by 8 (the lengths are 8x shorter): 56/128/416, Quest page 8
(7424, not 8192: SmolLM2's task limit is 7500 tokens, prompt and answer within its 8K positions).

Figs. 9-10 (tasks/pg19_compare.py): KL(full || method) over 64 teacher-forced steps after a 32K
prefix (Fig. 9) and greedy token-match length, at most 128 (Fig. 10; Tactic at 99 %); the paper plots
three unnamed configurations, read here as the three RULER budget levels. Fig. 7: Tactic's own
diagnostics (method.diagnostics=true) on the Fig. 9 protocol: obtained attention mass minus the
target, mean over heads, layers and steps (row metric `method_mass_error`). These items are plots in
the paper (no printed numbers): ours only, with the paper's stated facts in the notes.
"""
from __future__ import annotations

import math

import pandas as pd

from analysis import render
from analysis.catalogue import Impl, paper_numbers, register
from analysis.shared_data import EMBEDDED_RULER, PG19_DATA

NUMBERS = paper_numbers("tactic")
T15 = NUMBERS["table1-5"]
GROUPS = {  # block -> RULER tasks (Table 1 = all ten)
    "Table 2: NIAH": ["niah_multikey_1", "niah_multikey_2", "niah_multikey_3", "niah_multivalue", "niah_multiquery"],
    "Table 3: QA": ["qa_1", "qa_2"],
    "Table 4: VT": ["vt"],
    "Table 5: aggregation": ["cwe", "fwe"],
}
ALL10 = [t for ts in GROUPS.values() for t in ts]
TARGETS = [0.5, 0.7, 0.9]
PROFILES = {  # model, RULER lengths (label, tokens), baseline budgets, Quest page, PG-19 prefix
    "paper": ("llama31_8b", [("16K", 16384), ("32K", 32768), ("64K", 65536)], [448, 1024, 3328], 32, 32768),
    "embedded": ("smollm2", [("2K", 2048), ("4K", 4096), ("7.4K", 7424)], [56, 128, 416], 8, 4096),
}
NAMES = {"full": "Full", "tactic": "Tactic", "quest": "Quest", "streaming_llm": "StreamingLLM"}


def _list(xs) -> str:
    return "[" + ",".join(str(x) for x in xs) + "]"


def csv_list(xs) -> str:
    return ",".join(str(x) for x in xs)


def _methods(model: str, budgets, page: int, tactic_targets=TARGETS) -> list[list[str]]:
    """Override lists of the compared methods (task overrides prepended by the caller)."""
    return [[f"model={model}", "method=full"],
            [f"model={model}", "method=tactic", f"method.target={csv_list(tactic_targets)}"],
            [f"model={model}", "method=quest", f"method.page_size={page}", f"method.budget={csv_list(budgets)}"],
            [f"model={model}", "method=streaming_llm", "method.sink=4", f"method.budget={csv_list(budgets)}"]]


def row_label(v: dict) -> str:
    m = v["method"]
    if m == "tactic":
        return f"Tactic {float(v['method.target']) * 100:g}%"
    if m == "quest":
        return f"Quest {int(v['method.budget'])}"
    if m == "streaming_llm":
        return f"StreamingLLM (4,{int(v['method.budget']) - 4})"
    return NAMES.get(m, m)


# --- Tables 1-5: RULER -----------------------------------------------------------------------------

OFFLINE = [t for t in ALL10 if t not in GROUPS["Table 3: QA"]]   # QA needs SQuAD/HotpotQA: not offline
# tasks of Table 1's run, samples per task (100: ours, the paper gives no count)
RULER_RUNS = {"paper": (ALL10, 100), "embedded": (OFFLINE, 20)}


def _ruler_sweeps(profile: str) -> list[list[str]]:
    """One run per method and length over every task (Table 1); the group tables read its rows."""
    model, lengths, budgets, page, _ = PROFILES[profile]
    tasks, n = RULER_RUNS[profile]
    lens = ",".join(f"[{n}]" for _, n in lengths)
    task = ["task=ruler", f"task.lengths={lens}", f"task.samples_per_task={n}", f"task.tasks={_list(tasks)}",
            *(EMBEDDED_RULER if profile == "embedded" else ())]     # essay tasks offline: data/
    return [[*task, *m] for m in _methods(model, budgets, page)]


def _ruler_groups(profile: str, cells) -> list[list[str]]:
    """Tables 2-5: each finished Table 1 run read per task group (analysis.runs fills a cell over some of a
    run's RULER tasks from that run: the samples are the same), not run again."""
    tasks = set(RULER_RUNS[profile][0])
    out = []
    for c in cells:
        if c.status != "done" or c.block != "Table 1: average":
            continue
        for ts in GROUPS.values():
            if set(ts) <= tasks:
                out.append([o for o in c.overrides if not o.startswith("task.tasks=")] + [f"task.tasks={_list(ts)}"])
    return out


def _ruler_label(v: dict):
    tasks = [str(t) for t in v["task.tasks"]]
    block = next((b for b, ts in GROUPS.items() if ts == tasks), "Table 1: average")
    n = int(v["task.lengths"][0])
    col = next((lab for p in PROFILES.values() for lab, tok in p[1] if tok == n), str(n))
    return block, row_label(v), col


def _paper_rows() -> list[dict]:
    out = []
    for block, b in T15["blocks"].items():
        for r, vals in b["rows"].items():
            out += [{"block": block, "row": r, "col": c, "paper": x} for c, x in zip(T15["columns"], vals)
                    if x is not None]
    return out


TABLE1_5 = Impl(
    title="RULER at 16K/32K/64K: average, NIAH, QA, VT, aggregation (Tactic Tables 1-5)",
    sweeps={p: _ruler_sweeps(p) for p in PROFILES},
    label=_ruler_label,
    derive=_ruler_groups,
    render=lambda item, impl, df, profile, out: ruler_tables(item, impl, df, profile, out),
    paper=_paper_rows(),
    setup={"paper": "Llama-3.1-8B-Instruct, RULER (tasks/ruler.py) at 16K/32K/64K, 100 samples per task (ours: the "
                    "paper states no count); "
                    "Tactic 50/70/90 %, Quest 448/1024/3328 (page 32), StreamingLLM (4, K-4).",
           "embedded": "SmolLM2-135M-Instruct, RULER at 2K/4K/7.4K (standing in for 16K/32K/64K), its 8 synthetic "
                       "tasks (QA needs SQuAD/HotpotQA: not offline), 20 samples per task; Table 1 averages those 8; "
                       "budgets / 8: Quest 56/128/416 (page 8), StreamingLLM (4, K-4)."},
    paper_setup="Llama-3.1-8B-Instruct, 10 RULER tasks (samples per task not stated), 16K/32K/64K; Avg. = mean of "
                "the lengths.",
    metric="score",
)
def ruler_tables(item, impl, df: pd.DataFrame, profile: str, out) -> list:
    """The five tables (rows = methods, columns = lengths, `ours [interval] (paper)`) and one panel
    per table: score vs length, ours solid, the paper dashed (its own lengths, the same positions)."""
    md = (render.header(item, impl, profile, df) + render.markdown_tables(df, col_name=str, row_title="Method")
          + TABLE_NOTES)
    plt = render._plt()
    blocks = list(df["block"].unique())
    fig, axes = plt.subplots(1, len(blocks), figsize=(4 * len(blocks), 3.4), squeeze=False)
    for ax, block in zip(axes[0], blocks):
        b = df[(df["block"] == block) & (df["col"] != "Avg.")]
        for i, r in enumerate(b["row"].unique()):
            s = b[b["row"] == r]
            pos = s["col"].map(lambda c: next((j for p in PROFILES.values() for j, (lab, _) in enumerate(p[1])
                                               if lab == c), None))
            s = s.assign(x=pos).dropna(subset=["x"]).sort_values("x")
            if s["ours"].notna().any():
                ax.errorbar(s["x"], s["ours"], yerr=render._yerr(s), fmt="o-", color=f"C{i % 10}", capsize=2,
                            label=f"{r} (ours)")
            if s["paper"].notna().any():
                ax.plot(s["x"], s["paper"], "x--", color=f"C{i % 10}", alpha=0.6, label=f"{r} (paper)")
        labels = [" / ".join(p[1][j][0] for p in PROFILES.values()) for j in range(3)]
        ax.set_xticks(range(3), labels, fontsize=7)
        ax.set_ylim(-3, 103)
        ax.set_title(block, fontsize=9)
        ax.set_ylabel("RULER score (%)")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=5, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.suptitle(f"{item.key} ({profile}): solid = ours (bars: 95% interval), dashed = paper; x: paper / embedded "
                 f"length", fontsize=9)
    return render.write(out, item.key, md, df, fig)


TABLE_NOTES = """
Notes. Avg. is the paper's mean over the three lengths (ours: read it off the length columns). One run
per method and length over all the tasks (Table 1); each group table (2-5) reads that run's rows of its
tasks (RULER derives each sample from task.seed and its task, so a group run would repeat them). QA
needs SQuAD/HotpotQA (task.data_dir or the hub): the embedded profile runs the 8 synthetic tasks and its
Table 1 averages those. Embedded: Tactic falls well under Full although it attends about as many tokens
as Quest 416; the same selection cut by exact mass along Tactic's cluster order gives Full's answers,
so the loss is the fitted per-head budget (a heavy token deep in the list, or a curve that reaches zero
and drops a long tail): notes/tactic_ruler.md.
"""


# --- Figs. 7, 9, 10: PG-19 beside full attention ----------------------------------------------------

def pg19_task(profile: str, protocol: str, steps: int, prefix: int | None = None) -> list[str]:
    prefix = prefix or PROFILES[profile][4]
    task = ["task=pg19_compare", f"task.protocol={protocol}", f"task.prefix={prefix}", f"task.steps={steps}"]
    if profile == "embedded":  # offline: the 4 test books of data/pg19_books, 4 disjoint windows each (n = 16)
        task += [f"task.data_dir={PG19_DATA}", "task.only_split=test", "task.windows=4"]
    return task


def _config_label(v: dict) -> str:
    """The configuration level (column): Tactic's target or the baselines' budget level."""
    if v["method"] == "tactic":
        return f"{float(v['method.target']) * 100:g}%"
    budget = int(v["method.budget"])
    for p in PROFILES.values():
        if budget in p[2]:
            return f"{float(TARGETS[p[2].index(budget)]) * 100:g}%"
    return str(budget)


def _compare_sweeps(profile: str, protocol: str, steps: int, targets) -> list[list[str]]:
    model, _, budgets, page, _ = PROFILES[profile]
    levels = [budgets[TARGETS.index(t)] for t in targets if t in TARGETS]
    methods = [m for m in _methods(model, levels or budgets, page, targets) if "method=full" not in m]
    return [[*pg19_task(profile, protocol, steps), *m] for m in methods]


def value_table(item, impl, df: pd.DataFrame, profile: str, out, notes: str = "", digits: int = 3,
                ylabel: str = "") -> list:
    """Rows x configuration levels, each cell `mean [95% interval]` with `digits` decimals (KL and
    mass errors are not percentages), and a grouped bar chart with the intervals."""
    lines = [f"# {item.key}: {impl.title}", "", f"Profile `{profile}`. Ours: {impl.setup.get(profile, '')}",
             f"Paper: {impl.paper_setup}", "",
             (f"Cells read `mean [95% interval]` of the per-sample `{impl.metric}` (normal interval over the "
              f"cell's n samples); — = no result yet; n = samples per cell."), ""]
    cols = list(dict.fromkeys(df["col"]))
    lines.append("| Method | " + " | ".join(str(c) for c in cols) + " | n |")
    lines.append("|" + "---|" * (len(cols) + 2))
    for r in dict.fromkeys(df["row"]):
        sub = df[df["row"] == r].set_index("col")
        cells, ns = [], []
        for c in cols:
            if c not in sub.index or pd.isna(sub.loc[c, "ours"]):
                cells.append("—" if c in sub.index else "")
                continue
            x = sub.loc[c]
            text = f"{x['ours']:.{digits}f}"
            if all(math.isfinite(float(x[k])) for k in ("ci_lo", "ci_hi")):
                text += f" [{x['ci_lo']:.{digits}f}–{x['ci_hi']:.{digits}f}]"
            cells.append(text)
            ns.append(int(x["n"]))
        lines.append(f"| {r} | " + " | ".join(cells) + f" | {max(ns) if ns else 0} |")
    md = "\n".join(lines) + "\n" + notes
    plt = render._plt()
    fig, ax = plt.subplots(figsize=(6, 3.4))
    rows = list(dict.fromkeys(df["row"]))
    width = 0.8 / max(1, len(rows))
    for i, r in enumerate(rows):
        s = df[df["row"] == r].set_index("col").reindex(cols)
        xs = [j + i * width for j in range(len(cols))]
        ax.bar(xs, s["ours"].fillna(0).to_numpy(float), width, yerr=render._yerr(s.reset_index()), capsize=2,
               label=r, color=f"C{i % 10}")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cols))], [str(c) for c in cols])
    ax.set_ylabel(ylabel or impl.metric)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=7)
    ax.set_title(f"{item.key} ({profile}): ours (bars: 95% interval); the paper's figure is not transcribed", fontsize=8)
    return render.write(out, item.key, md, df, fig)


COMPARE_SETUP = {
    "paper": "Llama-3.1-8B-Instruct, PG-19 texts longer than prefix + steps (tasks/pg19_compare.py), 32K prefix.",
    "embedded": "SmolLM2-135M-Instruct, the 4 PG-19 test books of data/pg19_books (task.data_dir), 4 disjoint "
                "windows per book (n = 16), 4K prefix; budgets / 8 as in Tables 1-5.",
}
FIG9 = Impl(
    title="KL(full || method) of next-token distributions, PG-19, 64 decode steps (Tactic Fig. 9)",
    # Tactic's cells record diagnostics: Fig. 7's runs (the same protocol) serve both figures, and the
    # option only records (test_diagnostics_only_record: same output with it on or off)
    sweeps={p: [[*s, "method.diagnostics=true"] if "method=tactic" in s else s
                for s in _compare_sweeps(p, "kl", 64, TARGETS)] for p in PROFILES},
    label=lambda v: ("", row_label(v).split(" ")[0], _config_label(v)),
    render=lambda item, impl, df, profile, out: value_table(item, impl, df, profile, out, digits=4,
                                                            ylabel="KL divergence (nats)", notes=FIG9_NOTES),
    setup=COMPARE_SETUP,
    paper_setup="Llama-3.1-8B-Instruct, PG-19 texts > 32K tokens, 32K prefill, 64 decode steps; plot only.",
    metric="kl", scale=1.0,
)
FIG9_NOTES = """
Notes. Columns are configuration levels: Tactic's weight percentage, and the Quest/StreamingLLM budget
the paper pairs with it in Tables 1-5 (448/1024/3328; embedded 56/128/416). The paper's three
configurations are not named in its text. KL in nats, the mean over the 64 steps of a sample. Tactic
runs with method.diagnostics=true (its statistics recorded, its output unchanged), the runs of Fig. 7.
"""
FIG10 = Impl(
    title="Greedy token-match length against full attention, at most 128 (Tactic Fig. 10)",
    sweeps={p: [[*pg19_task(p, "match", 128), *m] for m in _methods(PROFILES[p][0], PROFILES[p][2][-1:],
                                                                     PROFILES[p][3], [0.99])[1:]]
            for p in PROFILES},
    label=lambda v: ("", row_label(v), "matched tokens"),
    render=lambda item, impl, df, profile, out: value_table(item, impl, df, profile, out, digits=1,
                                                            ylabel="matched tokens", notes=FIG10_NOTES),
    setup=COMPARE_SETUP,
    paper_setup="Llama-3.1-8B-Instruct, PG-19 texts > 32K tokens, 32K prefill, at most 128 tokens, Tactic at 99%.",
    metric="match_len", scale=1.0,
)
FIG10_NOTES = """
Notes. Tactic at 99 % (the paper's only configuration); the baselines at the largest budget of
Tables 1-5 (3328; embedded 416), the paper does not state theirs.
"""
FIG7 = Impl(
    title="Obtained minus target attention mass, Tactic on PG-19 (Tactic Fig. 7)",
    sweeps={p: [[*pg19_task(p, "kl", 64), f"model={PROFILES[p][0]}", "method=tactic", "method.diagnostics=true",
                 f"method.target={csv_list([0.5, 0.7, 0.9, 0.99])}"]] for p in PROFILES},
    label=lambda v: ("", "Tactic", f"{float(v['method.target']) * 100:g}%"),
    render=lambda item, impl, df, profile, out: value_table(item, impl, df, profile, out, digits=4,
                                                            ylabel="obtained - target mass", notes=FIG7_NOTES),
    setup=COMPARE_SETUP,
    paper_setup="Llama-3.1-8B-Instruct, PG-19; the paper: relative error well below 0.01 at 90% and 99%.",
    metric="method_mass_error", scale=1.0,
)
FIG7_NOTES = """
Notes. Per sample: the exact attention probability of the tokens Tactic attended (the exact set
included), minus the target, averaged over query heads, layers and the 64 steps (Tactic's probe,
method.diagnostics=true). The row also carries `method_mass_abs_error` (|obtained - target|) and
`method_mass_rel_error`; the paper's bound is on the relative error (< 0.01 at 90 % and 99 %).
"""

for _key, _impl in {"tactic.table1-5": TABLE1_5, "tactic.fig9": FIG9, "tactic.fig10": FIG10,
                    "tactic.fig7": FIG7}.items():
    register(_key, _impl)
