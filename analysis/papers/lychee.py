"""LycheeDecode items from run rows: Table 2 (math reasoning), Table 4 (RULER), Table 1 (LongBench).

Table 2 protocol, decided from the paper (there is no public script):
  * greedy (temperature 0, k = 1): appendix F, "For all experiments, we employ the greedy decoding
    strategy";
  * 128 problems of Gaokao2023En, Minerva and OlympiadBench (the first 128 in dataset order; which
    ones is not stated) and all 30 of AIME24: every printed accuracy is a multiple of 1/128
    (68.8 = 88/128, 39.1 = 50/128, 10.2 = 13/128, ...) or, for AIME24, of 1/30 (23.3 = 7/30);
  * the R1-distill prompt and scorer of tasks/aime.py, max_new_tokens 32768 (R1's limit; not stated);
  * LycheeDecode: "the number of tokens for sparse attention calculation is set to half of the
    sequence length, increasing linearly during decoding" = mode=ratio, ratio=0.5 (128 sinks + 256
    recent as the reference); "w/ Cache Correction" = correction_interval=32 (a dense re-prefill of
    the last 32 decoded tokens every 32 tokens, the paper's words);
  * TidalDecode: our tidal has a fixed budget only, so its rows run K=4096 (paper: half the sequence);
    its cache correction is the same correction_interval=32.
Embedded profile: SmolLM2-135M cannot solve these sets at all, so the rows run MATH-500 level 1 (the
easiest 43 problems; data/math500) with the protocol unchanged. Measured: full attention solves
none of them either (0/43, one output boxed), nor 6 one-step sums (notes/lychee_math.md), so the embedded
rows are all zero and compare nothing; the paper profile is the reproduction. Settings: max_new_tokens
512, sinks/recent scaled to the short sequences (16 + 32) and TidalDecode K = 256; the table says so.
"""
from __future__ import annotations

import math

from analysis import render
from analysis.catalogue import Impl, register
from analysis.nodata import longbench
from analysis.papers_data import rows as paper_rows
from analysis.papers_data import setup_text
from analysis.shared_data import EMBEDDED_RULER, MATH500_DATA
from methods.parts import headfile

T2_SETS = {"gaokao2023en": "Gaokao2023En", "minerva_math": "Minerva", "aime": "AIME24", "olympiadbench": "OlympiadBench"}
T2_MODELS = {"r1_llama_8b": "DeepSeek-R1-Distill-Llama-8B", "r1_qwen_7b": "DeepSeek-R1-Distill-Qwen-7B",
             "smollm2": "SmolLM2-135M-Instruct (embedded: MATH-500 level 1)"}
EMBEDDED_COL = "MATH-500 L1"
GREEDY = ["task.temperature=0", "task.k=1"]


def _t2_rows(model: str, task: list[str], lychee: list[str], tidal_budget: int) -> list[list[str]]:
    base = [*task, f"model={model}", *GREEDY]
    ly = [*base, "method=lychee", "method.mode=ratio", "method.ratio=0.5", *lychee]
    td = [*base, "method=tidal", f"method.budget={tidal_budget}"]
    return [[*base, "method=full"], td, [*td, "method.correction_interval=32"],
            ly, [*ly, "method.correction_interval=32"]]


def _t2_paper() -> list[list[str]]:
    out = []
    for model in ("r1_llama_8b", "r1_qwen_7b"):
        for t in T2_SETS:
            task = [f"task={t}"] + ([] if t == "aime" else ["task.num_problems=128"])
            out += _t2_rows(model, task, [], 4096)
    return out


T2_EMBEDDED = _t2_rows("smollm2", ["task=math500", "task.levels=[1]", f"task.data_dir={MATH500_DATA}",
                                   "task.max_new_tokens=512"], ["method.sink=16", "method.recent=32"], 256)


def t2_label(v: dict) -> tuple[str, str, str]:
    name = {"full": "Full Attention", "tidal": "TidalDecode", "lychee": "LycheeDecode"}[v["method"]]
    if v.get("method.correction_interval"):
        name += " w/ Cache Correction"
    col = EMBEDDED_COL if v["task"] == "math500" else T2_SETS[v["task"]]
    return T2_MODELS[v["model"]], name, col


T2_NOTES = """
Notes. Ours: pass@1 with one greedy sample per problem (= accuracy). Grader: the last \\boxed{} of the
output compared with the gold by math-verify (task.grader=math_verify; runs since issue 36 also normalise a
Unicode minus and \\left/\\right before brackets, the embedded rows here were graded before). LycheeDecode
names no grader; a Qwen2.5-Math-style grader (its extract_answer, strip_string, math_equal:
task.grader=qwen25_math) disagrees with this one on about 30% of real outputs, so our cells and the paper's
compare only as far as the two graders agree. The paper's Avg. column is the
mean of its four sets; ours has no Avg. (the cells carry different n). Protocol choices and why:
analysis/papers/lychee.py (greedy: appendix F; 128 problems: every printed value is k/128, AIME k/30).
TidalDecode rows run a fixed K (4096 paper profile, 256 embedded) where the paper gives TidalDecode half
of the sequence: our tidal has no length-proportional budget. LycheeDecode uses the committed head file
of the model (methods/heads/<model>-passkey-hardkuma.json; the R1 models have none yet: train one with
`python -m offline.train_heads model=r1_llama_8b`).
Embedded profile: MATH-500 level 1 (43 problems) stands in for the four sets, which SmolLM2-135M
cannot solve at all. It cannot solve these either: Full is 0/43 with 1 output boxed, and 0/6 on one-step
sums such as "What is $2+3$?" (notes/lychee_math.md), so every embedded cell is 0 and the rows compare
nothing. Protocol unchanged (R1 prompt, greedy, last boxed + math-verify), max_new_tokens
512, LycheeDecode ratio 0.5 with 16 sinks + 32 recent (the reference's 128 + 256 would cover most of
these ~600-token sequences), TidalDecode K=256.
"""


def _t2_render(item, impl, df, profile, out):
    md = render.header(item, impl, profile, df) + render.markdown_tables(df, col_name=str, row_title="Method / Task")
    md += T2_NOTES
    plt = render._plt()
    blocks = list(df["block"].unique())
    fig, axes = plt.subplots(1, len(blocks), figsize=(5 * len(blocks), 3.4), squeeze=False)
    for ax, block in zip(axes[0], blocks):
        b = df[df["block"] == block]
        cols = [c for c in dict.fromkeys(b["col"]) if c != "Avg."]
        rows = list(dict.fromkeys(b["row"]))
        width = 0.8 / max(1, len(rows))
        for i, r in enumerate(rows):
            s = b[b["row"] == r].set_index("col").reindex(cols)
            xs = [j + i * width for j in range(len(cols))]
            if s["ours"].notna().any():
                ax.bar(xs, s["ours"].fillna(0), width, color=f"C{i}", label=f"{r} (ours)",
                       yerr=render._yerr(s.fillna({"ours": 0, "ci_lo": 0, "ci_hi": 0})), capsize=2)
            if s["paper"].notna().any():
                ax.scatter(xs, s["paper"], marker="x", color=f"C{i}", zorder=3, label=f"{r} (paper)")
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cols))], cols, fontsize=7)
        ax.set_ylabel("accuracy (%)")
        ax.set_title(block, fontsize=8)
        ax.grid(alpha=0.3, axis="y")
    axes[0][-1].legend(fontsize=6, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.suptitle(f"{item.key} ({profile}): bars = ours (95% interval), x = paper", fontsize=9)
    return render.write(out, item.key, md, df, fig)


TABLE2 = Impl(
    title="Math reasoning: Gaokao2023En, Minerva, AIME24, OlympiadBench, +/- cache correction (LycheeDecode Table 2)",
    sweeps={"paper": _t2_paper(), "embedded": T2_EMBEDDED},
    label=t2_label,
    render=_t2_render,
    paper=paper_rows("lychee.table2"),
    setup={"paper": "R1-Distill-Llama-8B and -Qwen-7B, greedy, 128 problems (AIME24: 30), max_new_tokens 32768; "
                    "LycheeDecode ratio 0.5, TidalDecode K=4096, cache correction every 32 tokens.",
           "embedded": "SmolLM2-135M-Instruct on MATH-500 level 1 (43 problems; stands in for the "
                       "paper's four sets, yet full attention solves none: notes/lychee_math.md), greedy, "
                       "max_new_tokens 512; LycheeDecode ratio 0.5 with 16 sinks + 32 recent and its committed head "
                       "file, TidalDecode K=256, cache correction every 32."},
    paper_setup=setup_text("lychee.table2"),
    metric="correct",
)

register("lychee.table2", TABLE2)


# --- Table 4: RULER -------------------------------------------------------------------------------
T4_TASKS = {"niah_single_1": "single", "niah_multikey_1": "multikey", "niah_multivalue": "multivalue",
            "niah_multiquery": "multiquery", "vt": "vt", "fwe": "fwe", "qa_1": "qa1", "qa_2": "qa2"}
T4_NAMES = {"full": "Full Attention", "lychee": "LycheeDecode"}


# the embedded head files (methods/heads/smollm2-<recipe>.json, trained on the GPU: methods/heads/README.md)
# always hold layer 0's 3 KV heads (forced); the random controls draw the rest of the HardKuma file's count
# outside layer 0 (`random:SEED:N`), same count, same budget
SMOL_FIRST_LAYER = 3


def smol_heads(recipe: str = "passkey-hardkuma") -> int | None:
    """Retrieval KV heads of the embedded head file of a recipe (layer 0's included); None if it is missing."""
    path = headfile.head_path("smollm2", recipe)
    return headfile.load(path).count if path.exists() else None


def smol_random(seed: int) -> str:
    """`random:SEED:N`: as many retrieval heads as the HardKuma file, layer 0 forced, the rest at random."""
    return f"random:{seed}:{max(0, (smol_heads() or 0) - SMOL_FIRST_LAYER)}"


SMOL_RANDOM_HEADS = f"method.heads={smol_random(0)}"


def _t4_sweeps(model: str, lengths: list[int], tasks: list[str], n: int, lychee: list[str],
               extra: tuple[str, ...] = (), random_heads: str | None = None) -> list[list[str]]:
    base = ["task=ruler", f"model={model}", f"task.samples_per_task={n}", *extra,
            "task.tasks=" + ",".join(f"[{t}]" for t in tasks), "task.lengths=" + ",".join(f"[{x}]" for x in lengths)]
    rows = [[*base, "method=full"], [*base, "method=lychee", *lychee]]
    return rows + ([[*base, "method=lychee", *lychee, random_heads]] if random_heads else [])


def t4_label(v: dict) -> tuple[str, str, str]:
    name = T4_NAMES[v["method"]]
    if str(v.get("method.heads", "auto")).startswith("random:"):
        name += " (random heads, same count)"
    return name, f"{int(v['task.lengths'][0]) // 1024}k", T4_TASKS[v["task.tasks"][0]]


T4_NOTES = f"""
Notes. One run per (method, length, task): the cell is that task's RULER score (string_match_all /
_part per sample, x100). The paper's Avg. column has no counterpart here (cells may differ in n).
LycheeDecode: budget 4096 (paper profile; embedded 512), 128 sinks + 256 recent counted in it, the
model's committed head file. Samples per task: not stated in the paper; 100 here (RULER's default is
500). Embedded profile: SmolLM2-135M (8K context) at 1K/2K/4K, RULER's synthetic tasks only (qa_1 /
qa_2 need SQuAD / HotpotQA, not available offline: their cells stay empty), 20 samples per task, the
essay haystack from data/paul_graham_essays and nltk's untrained punkt splitter (no punkt_tab data offline).
The embedded profile adds a control row: LycheeDecode with as many retrieval heads as the trained file
({smol_heads()} of 90: layer 0's 3 + the rest drawn at random, `{SMOL_RANDOM_HEADS}`), to show what the
trained roles are worth at the same cost.
"""

TABLE4 = Impl(
    title="RULER 4K-64K, 8 tasks, LycheeDecode (K=4096) vs full attention (LycheeDecode Table 4)",
    sweeps={"paper": _t4_sweeps("llama3", [4096, 8192, 16384, 32768, 65536], list(T4_TASKS), 100,
                                ["method.budget=4096"]),
            "embedded": _t4_sweeps("smollm2", [1024, 2048, 4096], [t for t in T4_TASKS if not t.startswith("qa")],
                                   20, ["method.budget=512"], EMBEDDED_RULER, SMOL_RANDOM_HEADS)},
    label=t4_label,
    render=lambda item, impl, df, profile, out: table_render(item, impl, df, profile, out, T4_NOTES,
                                                             "Length / Task"),
    paper=paper_rows("lychee.table4"),
    setup={"paper": "Llama-3-8B-Instruct-Gradient-1048k, RULER 8 tasks at 4K-64K, 100 samples per task; "
                    "LycheeDecode K=4096.",
           "embedded": "SmolLM2-135M-Instruct, RULER's 6 synthetic tasks of the 8 at 1K/2K/4K, 20 samples per "
                       "task; LycheeDecode K=512 with its committed head file, and with as many random heads."},
    paper_setup=setup_text("lychee.table4"),
    metric="score",
)


def table_render(item, impl, df, profile, out, notes: str, row_title: str):
    """Rows x named columns per block, and one heat map per block (ours | paper)."""
    md = render.header(item, impl, profile, df) + render.markdown_tables(df, col_name=str, row_title=row_title) + notes
    plt = render._plt()
    blocks = list(df["block"].unique())
    fig, axes = plt.subplots(len(blocks), 2, figsize=(9, 2.6 * len(blocks) + 0.6), squeeze=False)
    for (a_ours, a_paper), block in zip(axes, blocks):
        b = df[df["block"] == block]
        cols, rows = list(dict.fromkeys(b["col"])), list(dict.fromkeys(b["row"]))
        for ax, what in ((a_ours, "ours"), (a_paper, "paper")):
            grid = b.pivot_table(index="row", columns="col", values=what, aggfunc="first").reindex(index=rows,
                                                                                                  columns=cols)
            ax.imshow(grid.values.astype(float), aspect="auto", cmap="viridis", vmin=0, vmax=100)
            ax.set_xticks(range(len(cols)), cols, fontsize=6, rotation=30)
            ax.set_yticks(range(len(rows)), rows, fontsize=6)
            ax.set_title(f"{block}: {what}", fontsize=8)
            for i in range(len(rows)):
                for j in range(len(cols)):
                    v = grid.values[i, j]
                    if v == v:  # noqa: PLR0124 (false for NaN: an empty cell)
                        ax.text(j, i, f"{v:.0f}", ha="center", va="center", fontsize=5, color="w")
    fig.suptitle(f"{item.key} ({profile})", fontsize=9)
    fig.tight_layout()
    return render.write(out, item.key, md, df, fig)


register("lychee.table4", TABLE4)


# --- Table 1: LongBench -----------------------------------------------------------------------------
T1_SUBSETS = {"multifieldqa_en": "MFQA", "narrativeqa": "NrtQA", "qasper": "Qasp", "2wikimqa": "2Wiki",
              "hotpotqa": "HotQA", "qmsum": "QMSm", "triviaqa": "TrQA", "passage_retrieval_en": "PRe"}
T1_MODELS = {"llama3": "Llama-3-8B-Instruct-Gradient-1048k", "qwen3_8b": "Qwen3-8B"}
# the Quest/TidalDecode/LycheeDecode pred.py protocol (reference/methods.md 1.1): raw prompts for these
# models, the last <=100 characters decoded, narrativeqa cut to 28000 tokens
T1_TASK = ["task=longbench", "task.chat_template=never", "task.decode_tail=quest",
           "task.max_length_overrides={narrativeqa: 28000}"]


def _t1_sweeps() -> list[list[str]]:
    subsets = "task.subsets=" + ",".join(T1_SUBSETS)
    out = []
    for model, methods in (("llama3", ("quest", "duo", "duo*", "tidal", "lychee")),
                           ("qwen3_8b", ("seer", "tidal", "lychee"))):
        base = [*T1_TASK, subsets, f"model={model}"]
        out.append([*base, "method=full"])
        for m in methods:
            extra = ["method=duo", "method.head_scale=2"] if m == "duo*" else [f"method={m}"]
            out.append([*base, *extra, "method.budget=1024,4096"])
    return out


def t1_label(v: dict) -> tuple[str, str, str]:
    names = {"full": "Full Attention", "quest": "Quest", "duo": "DuoAttention", "tidal": "TidalDecode",
             "lychee": "LycheeDecode", "seer": "SeerAttention-R"}
    name = names.get(v["method"], v["method"])
    if v["method"] == "duo" and float(v.get("method.head_scale", 1)) == 2:
        name += "*"
    row = name if v["method"] == "full" else f"{name} ({v['method.budget']})"
    return T1_MODELS[v["model"]], row, T1_SUBSETS[v["task.subsets"]]


T1_NOTES = """
Notes. One run per (model, method, budget, subset); cells are LongBench scores (official metrics, x100).
Protocol of the reference pred.py (reference/methods.md 1.1): raw prompts for Llama-3 and Qwen3 (no
chat template), the last <= 100 characters of the prompt decoded token by token (decode_tail=quest),
narrativeqa truncated to 28000 tokens. DuoAttention: streaming heads hold `budget` tokens (64 sinks);
DuoAttention* doubles its retrieval-head set (head_scale=2: the top 2N heads by the trained gates).
LycheeDecode and DuoAttention read the model's committed head files (train: offline/train_heads.py).
SeerAttention-R is not implemented here. No embedded profile: the LongBench data is not available
offline (the repository holds only its configs, tasks/longbench_config/).
"""

TABLE1 = Impl(
    title="LongBench, 8 tasks, budgets 1024/4096 (LycheeDecode Table 1)",
    sweeps={"paper": _t1_sweeps()},
    label=t1_label,
    render=lambda item, impl, df, profile, out: table_render(item, impl, df, profile, out, T1_NOTES,
                                                             "Method (Budget) / Task"),
    paper=paper_rows("lychee.table1"),
    setup={"paper": "the paper's models and budgets, LongBench's 8 tasks with the reference pred.py protocol."},
    paper_setup=setup_text("lychee.table1"),
    metric="score", data=(longbench(T1_SUBSETS),),
)

register("lychee.table1", TABLE1)


# --- Tables 5-6 / Fig. 5: selection strategies (Table 3: lychee_table3.py) ----------------------

T5_MODES = [("topk", "budget", [1024, 2048, 4096]), ("topp", "top_p", [0.99, 0.995, 0.999]),
            ("threshold", "threshold", ["1e-4", "1e-5", "1e-6"]), ("ratio", "ratio", [0.7, 0.8, 0.9])]


def t5_label(v: dict) -> tuple[str, str, str]:
    """The paper's row labels: Top-k (k=1024), Top-p (p=0.99), Threshold (tau=1e-4), Ratio (theta=70%)."""
    mode = v["method.mode"]
    if mode == "topk":
        row = f"Top-k (k={v['method.budget']})"
    elif mode == "topp":
        row = f"Top-p (p={v['method.top_p']:g})"
    elif mode == "threshold":
        row = f"Threshold (tau=1e{round(math.log10(float(v['method.threshold'])))})"
    else:
        row = f"Ratio (theta={round(float(v['method.ratio']) * 100)}%)"
    return "Table 5: score", row, T1_SUBSETS[v["task.subsets"]]


def _t5_sweeps() -> list[list[str]]:
    base = [*T1_TASK, "task.subsets=" + ",".join(T1_SUBSETS), "model=llama3", "method=lychee"]
    return [[*base, f"method.mode={m}", f"method.{k}=" + ",".join(map(str, vals))] for m, k, vals in T5_MODES]


T56_NOTES = """
Notes. LycheeDecode with each selection rule on the 8 LongBench tasks (one run per rule, value and
task). topp/threshold use the reference's hard-coded softmax scale 128^-0.5 (prob_scale=reference).
Table 6 (sparsity) is the paper's only: ours would come from the attended-token statistics of the rows
(recorded per sample under `attended`), not rendered yet.
"""

TABLE56 = Impl(
    title="Selection strategies: top-k, top-p, threshold, ratio on LongBench (LycheeDecode Tables 5-6, Fig. 5)",
    sweeps={"paper": _t5_sweeps()},
    label=t5_label,
    render=lambda item, impl, df, profile, out: table_render(item, impl, df, profile, out, T56_NOTES,
                                                             "Strategy / Task"),
    paper=[r for r in paper_rows("lychee.table5-6") if r["block"].startswith("Table 5")],
    setup={"paper": "Llama-3-8B-Instruct-Gradient-1048k, LycheeDecode with each rule, the 8 LongBench tasks."},
    paper_setup=setup_text("lychee.table5-6"),
    metric="score", data=(longbench(T1_SUBSETS),),
)
register("lychee.table5-6", TABLE56)
register("lychee.fig5", TABLE56)   # the same runs: Fig. 5 plots Table 5's scores (the figure written beside it)
