"""harness.pareto: every registered method as one point, accuracy against decode speed-up over full
attention, at one budget ratio, with the Pareto front drawn (issue 34). No paper or harness has it.

  accuracy  the embedded rows of one shared cell: NIAH, SmolLM2-135M-Instruct, 4096 tokens, the noise
            haystack, 10 depths x 10 rounds (tidal.table1's embedded grid, whose rows several methods
            already have), every method with its budget option at K = 512 = 1/8 of the context
            (methods/parts/budget.py BUDGET_KNOB), mean with its 95% Wilson interval;
  speed     harness.tpot's file: Llama-3-8B shape, random weights, 32K tokens, batch 1, budget 4096 =
            the same 1/8 of the context, decode ms of full attention / the method's, same process.
The two axes come from different models on purpose: accuracy needs trained weights (the embedded model
runs anywhere), speed the paper models' shape (random weights time the same). The sweep comes from the
registry; three methods need a setting to run on SmolLM2 at all, stated in the table: TidalDecode at
re-selection layer 14 (SmolLM2's best, tidal.table1's embedded row; the layer does not change its
cost), DuoAttention with random heads (no trained SmolLM2 head file of its recipe), MInference+Cascade
with a 4096-token stride (its 100K default exceeds SmolLM2's 8192 positions).
"""
from __future__ import annotations

import math
import textwrap
from pathlib import Path

import pandas as pd

from analysis import provenance, render
from analysis.catalogue import Impl, register
from analysis.papers.harness import FILE, cell_name
from methods import REGISTRY
from methods.parts.budget import BUDGET_KNOB

ROOT = Path(__file__).resolve().parents[2]
BENCH_DIR = ROOT / "results" / "bench"           # the committed benchmark files (tests point it elsewhere)
K_ACC, CONTEXT_ACC = 512, 4096                   # accuracy: K / context = 1/8
SPEED_CELL = (32768, 1)                          # speed: harness.tpot's 32K batch 1, K = 4096 = 1/8
DEPTHS10 = "[0,11,22,33,44,56,67,78,89,100]"     # tidal.table1's embedded grid (its rows match by value)
TASK = ["task=niah", "task.haystack=noise", f"task.lengths=[{CONTEXT_ACC}]", f"task.depths={DEPTHS10}",
        "task.rounds=10"]
EXTRA = {"tidal": ["method.reselect_layer=14"], "duo": ["method.heads=random:0"],
         "minference_cascade": ["method.stride=4096"]}


def sweeps() -> list[list[str]]:
    out = []
    for m in REGISTRY.names():
        knob = [f"method.{k}={v}" for k, v in BUDGET_KNOB[m](K_ACC).items()]
        out.append([*TASK, "model=smollm2", f"method={m}", *knob, *EXTRA.get(m, [])])
    return out


def speedups(sources) -> dict:
    """method -> (speed-up over full, decode ms, status or error) at SPEED_CELL."""
    out = {}
    for s in sources:
        for r in s.rows:
            if (r["context"], r["batch"]) == SPEED_CELL:
                out[r["method"]] = (r.get("speedup_vs_full"), r.get("decode_ms"),
                                    "ok" if r.get("status", "ok") == "ok" else r.get("error") or r.get("status"))
    return out


def front(points: list[tuple[str, float, float]]) -> list[str]:
    """Names of the points no other point beats on both axes (higher speed-up, higher accuracy)."""
    keep = []
    for n, x, y in points:
        if not any((x2 >= x and y2 >= y) and (x2 > x or y2 > y) for _, x2, y2 in points):
            keep.append(n)
    return keep


def _pct(v) -> str:
    return render.DASH if v is None or pd.isna(v) else f"{v:.0f}"


def frame(df: pd.DataFrame, sources) -> pd.DataFrame:
    sp = speedups(sources)
    acc = df[df["status"].isin(["done", "partial"])].set_index("row")
    rows = []
    for m in ["full"] + [n for n in REGISTRY.names() if n != "full"]:
        a = acc.loc[m] if m in acc.index else None
        x, ms, state = sp.get(m, (None, None, "not in the speed file"))
        rows.append({"method": m, "accuracy": None if a is None else a["ours"],
                     "ci_lo": None if a is None else a["ci_lo"], "ci_hi": None if a is None else a["ci_hi"],
                     "n": 0 if a is None else int(a["n"]), "acc_status": "missing" if a is None else a["status"],
                     "speedup_vs_full": x, "decode_ms": ms, "speed_status": state,
                     "run": "" if a is None else a["run"]})
    out = pd.DataFrame(rows)
    pts = [(r.method, r.speedup_vs_full, r.accuracy) for r in out.itertuples()
           if pd.notna(r.speedup_vs_full) and pd.notna(r.accuracy)]
    on = set(front(pts))
    out["pareto"] = out["method"].isin(on)
    return out


X_LABEL = ("decode speed-up over full attention (x): Llama-3-8B shape, random weights, bf16, 32K tokens, batch 1, "
           "budget 4096 = 1/8 of the context; harness.tpot")
Y_LABEL = ("NIAH accuracy (%): SmolLM2-135M-Instruct, 4096 tokens, budget 512 = 1/8 of the context, "
           "95% Wilson interval")


def _label_lifts(ok: pd.DataFrame, dx: float = 0.12, dy: float = 4.0) -> dict:
    """Labels of points that nearly coincide (several methods at the same accuracy and speed) are stacked,
    one line up each, so that every name stays readable."""
    lift, placed = {}, []
    for r in ok.sort_values(["accuracy", "speedup_vs_full"]).itertuples():
        near = [n for (x, y, n) in placed if abs(x - r.speedup_vs_full) < dx and abs(y - r.accuracy) < dy]
        lift[r.method] = max((lift[n] for n in near), default=-1) + 1
        placed.append((r.speedup_vs_full, r.accuracy, r.method))
    return lift


def figure(f: pd.DataFrame, device: str):
    plt = render._plt()
    fig, ax = plt.subplots(figsize=(8.5, 6))
    ok = f.dropna(subset=["speedup_vs_full", "accuracy"])
    lift = _label_lifts(ok)
    for r in ok.itertuples():
        lo, hi = r.accuracy - r.ci_lo, r.ci_hi - r.accuracy
        ax.errorbar([r.speedup_vs_full], [r.accuracy], yerr=[[max(lo, 0)], [max(hi, 0)]], fmt="o",
                    color="tab:red" if r.pareto else "tab:blue", capsize=3)
        ax.annotate(r.method, (r.speedup_vs_full, r.accuracy), textcoords="offset points",
                    xytext=(4, 4 + 9 * lift[r.method]), fontsize=8,
                    arrowprops={"arrowstyle": "-", "lw": 0.4, "color": "grey"} if lift[r.method] else None)
    fr = ok[ok["pareto"]].sort_values("speedup_vs_full")
    if len(fr):
        ax.step(fr["speedup_vs_full"], fr["accuracy"], where="post", color="tab:red", lw=1, label="Pareto front")
        ax.legend(loc="lower left", fontsize=8)
    ax.axvline(1.0, color="grey", lw=0.5, ls="--")
    ax.set_xlabel(textwrap.fill(X_LABEL + f" ({device})", 110), fontsize=8)
    ax.set_ylabel(textwrap.fill(Y_LABEL, 70), fontsize=8)
    ax.set_title("harness.pareto: accuracy vs decode speed-up, one budget ratio (1/8)")
    missing = f[f["speedup_vs_full"].isna() | f["accuracy"].isna()]["method"].tolist()
    if missing:
        ax.text(0.99, 0.01, "not shown (no speed or no accuracy): " + ", ".join(missing), transform=ax.transAxes,
                ha="right", va="bottom", fontsize=7, wrap=True)
    fig.tight_layout()
    return fig


def markdown(item, impl, f: pd.DataFrame, sources, device: str) -> str:
    lines = [f"# {item.key}: {impl.title}", "", f"Accuracy (y): {impl.setup['embedded']}",
             f"Speed (x): {X_LABEL}; device **{device}**.", "",
             "Both at budget / context = 1/8. Each method with its YAML defaults and its budget option "
             "(methods/parts/budget.py BUDGET_KNOB); settings needed on SmolLM2: "
             + "; ".join(f"{m}: {' '.join(v)}" for m, v in EXTRA.items())
             + ". Accuracy cells read `mean [95% Wilson interval]` over n samples (* = partial); Pareto = no "
               "other method is both faster and more accurate.", "",
             "| method | NIAH accuracy % [95% CI] | n | speed-up over full | decode ms | Pareto | note |",
             "|---|---|---|---|---|---|---|"]
    for r in f.itertuples():
        acc = render.DASH if r.accuracy is None or pd.isna(r.accuracy) else \
            f"{_pct(r.accuracy)} [{_pct(r.ci_lo)}–{_pct(r.ci_hi)}]" + ("*" if r.acc_status == "partial" else "")
        sp = render.DASH if r.speedup_vs_full is None or pd.isna(r.speedup_vs_full) else f"{r.speedup_vs_full:.2f}x"
        ms = render.DASH if r.decode_ms is None or pd.isna(r.decode_ms) else f"{r.decode_ms:.2f}"
        note = [] if r.speed_status == "ok" else [f"speed: {r.speed_status}"]
        if r.acc_status == "missing":
            note.append(f"accuracy: no rows (`make {item.target()} PROFILE=embedded`)")
        lines.append(f"| {r.method} | {acc} | {r.n} | {sp} | {ms} | {'yes' if r.pareto else ''} | {'; '.join(note)} |")
    return "\n".join(lines) + "\n" + provenance.markdown(sources)


def render_pareto(item, impl, df: pd.DataFrame, profile: str, out_root: Path) -> list[Path]:
    sources = [provenance.load(FILE, BENCH_DIR)]
    device = ", ".join(sorted({s.device for s in sources if s.data is not None})) or "not measured"
    f = frame(df, sources)
    md = markdown(item, impl, f, sources, device)
    f = f.assign(x_axis=X_LABEL, y_axis=Y_LABEL, device_speed=device, speed_cell=cell_name(*SPEED_CELL),
                 provenance=sources[0].short())
    f = f.replace({math.inf: None})
    return render.write(out_root, item.key, md, f, figure(f, device))


register("harness.pareto", Impl(
    title="accuracy vs decode speed-up over full attention, every method at budget 1/8 of the context",
    sweeps={"embedded": sweeps()},
    label=lambda v: ("", v["method"], f"K={K_ACC}"),
    render=render_pareto,
    setup={"embedded": "SmolLM2-135M-Instruct, niah on the built-in noise haystack, 4096 tokens, 10 depths x 10 "
                       "rounds (100 samples per cell, tidal.table1's embedded grid), budget K = 512 tokens per head."},
    paper_setup="none: no paper has this view.",
))
