"""TidalDecode Tables 3 and 4: LongBench, 8 tasks, Full, Quest and TidalDecode (re-selection layer 13) at
K=1024 and 4096, on Llama-3-8B-Instruct-Gradient-1048k (Table 3) and Llama-3.1-8B-Instruct (Table 4).

Protocol: the reference's experiments/LongBench/pred.py (Quest's, copied; shared reference/methods.md
1.1): LongBench's prompts and max lengths, middle truncation, raw prompts (the script's Llama-3 chat
branch tests for "Llam3" and never fires, so Llama-3.1 gets none either), the last <= 100 characters of
the prompt fed token by token through the sparse decode path (task.decode_tail=quest), narrativeqa cut to
28000 tokens; run_longbench.sh: tidal top_k 1024/4096, sparse_layer_start 2, correction_layer 13 (our
method defaults: dense_layers 2, reselect_layer 13). One run per (model, method, K, task).

Data-bound: LongBench is not on these machines (no hub access), so with no rows the tables render the
paper's numbers beside empty cells and the command that fills them where the data is (analysis/nodata.py).
No embedded profile: without the data SmolLM2 has nothing to run either.
"""
from __future__ import annotations

from analysis import render
from analysis.catalogue import Impl, paper_numbers, register
from analysis.nodata import longbench

NUMBERS = paper_numbers("tidal")
# LongBench subset -> the papers' column label (the same 8 tasks and order as LycheeDecode Table 1)
SUBSETS = {"multifieldqa_en": "MFQA", "narrativeqa": "NrtQA", "qasper": "Qasp", "2wikimqa": "2Wiki",
           "hotpotqa": "HotQA", "qmsum": "QMSm", "triviaqa": "TrQA", "passage_retrieval_en": "PRe"}
TASK = ["task=longbench", "task.chat_template=never", "task.decode_tail=quest",
        "task.max_length_overrides={narrativeqa: 28000}", "task.subsets=" + ",".join(SUBSETS)]
KS = "1024,4096"
RESELECT = 13
MODELS = {"table3": ("llama3", "Llama-3-8B-Instruct-Gradient-1048k"), "table4": ("llama31_8b", "Llama-3.1-8B-Instruct")}


def sweeps(model: str) -> list[list[str]]:
    base = [*TASK, f"model={model}"]
    return [[*base, "method=full"], [*base, "method=quest", f"method.budget={KS}"],
            [*base, "method=tidal", f"method.reselect_layer={RESELECT}", f"method.budget={KS}"]]


def label(v: dict) -> tuple[str, str, str]:
    if v["method"] == "full":
        row = "Full"
    else:
        name = "Quest" if v["method"] == "quest" else f"TD+L{v.get('method.reselect_layer', RESELECT)}"
        row = f"{name} ({v['method.budget']})"
    return "", row, SUBSETS[v["task.subsets"]]


def paper_rows(table: str) -> list[dict]:
    t = NUMBERS[table]
    return [{"block": "", "row": r, "col": c, "paper": x} for r, vals in t["rows"].items()
            for c, x in zip(t["columns"], vals) if x is not None]


NOTES = """
Notes. Cells are LongBench scores x100 (the official metric of each task: F1 for the QA tasks, ROUGE-L for
QMSum, classification/retrieval accuracy for PRe); Avg. is the paper's mean of the 8 tasks (ours has
none: its cells may carry different n). TD+L13 = TidalDecode with re-selection layer 13 (Table 4 prints
"TD+13" and "QSm" for QMSm). Protocol and its sources: analysis/papers/tidal_longbench.py.
"""


def _render(item, impl, df, profile, out):
    md = (render.header(item, impl, profile, df)
          + render.markdown_tables(df, col_name=str, row_title="Method (K) / Task", paper_digits=2) + NOTES)
    plt = render._plt()
    cols = list(dict.fromkeys(df["col"]))
    rows = list(dict.fromkeys(df["row"]))
    fig, ax = plt.subplots(figsize=(10, 3.6))
    width = 0.8 / max(1, len(rows))
    for i, r in enumerate(rows):
        s = df[df["row"] == r].set_index("col").reindex(cols)
        xs = [j + i * width for j in range(len(cols))]
        ax.bar(xs, s["paper"].fillna(0), width, color=f"C{i}", alpha=0.45, label=f"{r} (paper)")
        if s["ours"].notna().any():
            ax.errorbar(xs, s["ours"], yerr=render._yerr(s),
                        fmt="o", color=f"C{i}", ms=3, capsize=2, label=f"{r} (ours)")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cols))], cols, fontsize=7)
    ax.set_ylabel("LongBench score")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=6, ncol=2, loc="upper left")
    ours = "no rows yet" if df["ours"].isna().all() else "dots = ours (95% interval)"
    fig.suptitle(f"{item.key} ({profile}): bars = paper; {ours}", fontsize=9)
    fig.tight_layout()
    return render.write(out, item.key, md, df, fig)


def _impl(table: str, number: int) -> Impl:
    model, name = MODELS[table]
    return Impl(
        title=f"LongBench, 8 tasks, K=1024/4096 (TidalDecode Table {number})",
        sweeps={"paper": sweeps(model)},
        label=label,
        render=_render,
        paper=paper_rows(table),
        setup={"paper": f"{name} ({model}), Full, Quest and TD+L13 at K=1024/4096, LongBench's 8 tasks with the "
                        "reference pred.py protocol (raw prompts, last <= 100 characters decoded)."},
        paper_setup=f"{name}; K=1024/4096; TidalDecode re-selection layer 13; the 8 LongBench tasks "
                    "(full task sets, not stated otherwise).",
        metric="score", data=(longbench(SUBSETS),),
    )


register("tidal.table3", _impl("table3", 3))
register("tidal.table4", _impl("table4", 4))
