"""Renderers (tables + figures) of the TidalDecode latency items, and their registration; the
frames are in tidal_latency."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from analysis import latency, render
from analysis.catalogue import Bench, Impl, register
from analysis.papers.tidal_latency import (
    CONTEXTS,
    K_FIG,
    KERNEL_FILES,
    MODELS,
    NUMBERS,
    PAPER,
    PAPER_DEVICE,
    TPOT_FILES,
    TPOT_KS,
    attention_totals,
    ctx,
    fig6_frame,
    fig7_frame,
    fig8_frame,
    kernel_times,
    measured,
    paper_ms,
    semantics,
    table56_frame,
    tpot,
)

COLORS = {"Full": "0.55", "Quest": "C1", "TidalDecode": "C0"}
TPOT_NOTES = """
Notes. Our contexts are 10240/32768/102400 tokens (the paper's "10K/32K/100K"); budgets K={ks} only.
Measured (full attention present, from rows each file's own command wrote): {measured}.
Methods as each row records them: {semantics}.
The Llama-3-8B shape has no paper numbers beside it (the paper measured Llama-2-7B, and says GQA "does
not affect the relative efficiency comparison"). The paper's full attention is FlashInfer and its
Quest the Quest implementation; ours are one engine (runners/engine.py) with our Triton kernels for
all three, so the Full/Quest/TD ratios compare algorithms on equal kernels. Each TPOT JSON row also
holds its bandwidth floor (floor_ms).
"""
FIG7_NOTES = f"""
Notes. Composed from per-layer kernel times (kernels JSON, Llama-3-8B shapes, K={K_FIG}, the budget of
the paper's Figs. 7-8), per decode step, L = 32 or 64 layers:
- Full = L x full decode attention (our kernel);
- Quest = 2 x full (dense layers 0-1) + (L-2) x [page scores + page top-k + sparse attention over the
  selected 16-token pages (K={K_FIG}, one set per query head)]; the per-token page-bounds update
  (ms_update1, ~0.004 ms/layer) is left out;
- TidalDecode = 2 x full (layers 0-1) + 2 x token selection attention with top-k (layer 2 and the
  re-selection layer) + (L-4) x sparse attention over K={K_FIG} tokens (one set per query head).
Measured top-k sizes differ from K={K_FIG}: selection + top-k is timed with top-4096 tokens, Quest's
top-k with 4096/16 = 256 pages. bench/kernel_ops.py times Quest's scores and top-k only at its
largest context (128K); elsewhere that time is scaled by the page count (S/131072). With a kernel time
affine in the pages and a non-negative fixed cost (per-launch costs do not shrink with S), the scaled
time is a lower bound on Quest's: its ms cells read ≥, Full/Quest (Quest below the line) ≤, and
Quest/TidalDecode ≥; a maximum over lower bounds is a lower bound (≥). Launch gaps, GEMMs and norms
are not in these sums (see tidal.fig6 for end to end).
The paper gives no per-bar values in its text, only the maxima compared in the last block.
"""
FIG8_NOTES = f"""
Notes. Per-layer kernel times (ms, CUDA-graph medians) at Llama-3-8B shapes, K={K_FIG}, one set per
query head; ratios are relative to our full decode kernel. "TD token selection" is full attention that
also keeps the scores; "+ top-k" adds the top-4096 selection (the layer TidalDecode runs twice). Quest's
page scores and top-k are timed at 128K only (256 pages selected); elsewhere they are scaled by the
page count: lower bounds (≥), as is every Quest total and ratio with Quest above the line (see
tidal.fig7). The paper states the Quest kernel / TD sparse kernel ratio reaches 3.36x, and that the token selection layer is "slightly" slower than full attention (no number).
"""


def _plt():
    return render._plt()


def _bars(ax, groups, series, ylabel, title, hatch_est=None, annotate=None):
    """Grouped bars: series = [(name, values per group)]; annotate(i_series, i_group, value) -> str."""
    n, w = len(series), 0.8 / max(1, len(series))
    x = np.arange(len(groups))
    for i, (name, vals) in enumerate(series):
        v = np.array([np.nan if a is None else a for a in vals], dtype=float)
        bars = ax.bar(x + (i - (n - 1) / 2) * w, np.nan_to_num(v), w, color=COLORS.get(name, f"C{i + 2}"),
                      label=name, edgecolor="white")
        for j, b in enumerate(bars):
            if hatch_est and hatch_est(name, j):
                b.set_hatch("//")
            if np.isnan(v[j]):
                ax.text(b.get_x() + w / 2, 0, "n/m", ha="center", va="bottom", fontsize=5, rotation=90)
            elif annotate and (t := annotate(i, j, v[j])):
                ax.text(b.get_x() + w / 2, v[j], t, ha="center", va="bottom", fontsize=5.5, rotation=90)
    ax.set_xticks(x, [str(g) for g in groups], fontsize=7)
    ax.set_ylabel(ylabel, fontsize=7)
    ax.set_title(title, fontsize=8)
    ax.tick_params(axis="y", labelsize=6)
    ax.grid(axis="y", alpha=0.3)
    ax.margins(y=0.18)


def _tpot_notes(sources) -> str:
    return TPOT_NOTES.format(measured=measured(sources), ks="/".join(map(str, TPOT_KS)), semantics=semantics(sources))


def render_fig6(item, impl, sources, out_root: Path) -> list[Path]:
    df = fig6_frame(sources)
    md = (latency.header(item, impl, sources, "ms per decoded token (batch 1) and speedups", PAPER_DEVICE)
          + latency.md_tables(df, "Method / Budget") + _tpot_notes(sources))
    t = {k: v[0] for k, v in tpot(sources).items()}
    ks, device = TPOT_KS, latency.devices(sources)
    who = [(m, f"ours: {MODELS[m].split(' (')[0]}") for m in MODELS] + [("paper", "paper: Llama-2-7B, A100")]
    plt = _plt()
    fig, axes = plt.subplots(len(who), len(CONTEXTS), figsize=(11, 2.7 * len(who)), squeeze=False)
    for (src, label), row in zip(who, axes):
        for c, ax in zip(CONTEXTS, row):
            def ms(meth, k, c=c, src=src):
                return paper_ms(meth, c, k) if src == "paper" else t.get((src, c, meth, k))
            full = ms("full", None)
            if full is None:
                ax.set_axis_off()
                ax.set_title(f"{label} @ {c}", fontsize=8)
                ax.text(0.5, 0.5, "not measured", ha="center", va="center", fontsize=9, color="0.4",
                        transform=ax.transAxes)
                continue
            series = [("Full", [full] * len(ks))] + [(n, [ms(m, k) for k in ks]) for m, n in
                                                       (("quest", "Quest"), ("tidal", "TidalDecode"))]
            ann = (lambda i, j, v, full=full: f"{full / v:.2f}x" if i else "")
            _bars(ax, [f"K={k}" for k in ks], series, "ms / token", f"{label} @ {c}", annotate=ann)
    h, lab = axes[-1][-1].get_legend_handles_labels()
    fig.legend(h, lab, fontsize=7, loc="lower center", ncol=3, bbox_to_anchor=(0.5, -0.02))
    fig.suptitle(f"{item.key}: end-to-end decode latency (labels: speedup over Full). Rows 1-2 ours "
                 f"({device}), row 3 the paper (A100, Tables 5-6 at our budgets); absolute ms are not "
                 f"comparable across GPUs", fontsize=8)
    fig.tight_layout()
    return latency.write(item, df, md, fig, sources, PAPER_DEVICE, out_root)


def render_table56(item, impl, sources, out_root: Path) -> list[Path]:
    df = table56_frame(sources)
    md = (latency.header(item, impl, sources, "ms per decoded token (batch 1) and speedups", PAPER_DEVICE)
          + latency.md_tables(df, "Context / Budget") + _tpot_notes(sources)
          + "Table 6's header in the paper reads \"TidalDecode(ms)\"; its caption (Quest) is what it holds.\n")
    t = {k: v[0] for k, v in tpot(sources).items()}
    device = latency.devices(sources)
    plt = _plt()
    fig, axes = plt.subplots(1, len(CONTEXTS), figsize=(12, 3.4), squeeze=False)
    ks = PAPER["columns"]
    for c, ax in zip(CONTEXTS, axes[0]):
        for meth, color in (("tidal", "C0"), ("quest", "C1")):
            for model, style in (("llama2_7b", "o-"), ("llama3", "s:")):
                full = t.get((model, c, "full", None))
                pts = [(k, full / t[(model, c, meth, k)]) for k in ks if full and (model, c, meth, k) in t]
                if pts:
                    ax.plot(*zip(*pts), style, color=color, label=f"{meth} ours {model}")
            pf = paper_ms("full", c, None)
            ax.plot(ks, [pf / paper_ms(meth, c, k) for k in ks], "x--", color=color, alpha=0.7,
                    label=f"{meth} paper llama2_7b (A100)")
        ax.axhline(1, color="0.5", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xticks(ks, [str(k) for k in ks], fontsize=6)
        ax.set_xlabel("token budget K", fontsize=7)
        ax.set_ylabel("speedup over Full (Full ms / method ms)", fontsize=7)
        ax.set_title(f"{c}", fontsize=9)
        ax.grid(alpha=0.3)
    h, lab = axes[0][0].get_legend_handles_labels()
    fig.legend(h, lab, fontsize=7, loc="lower center", ncol=6, bbox_to_anchor=(0.5, -0.06))
    fig.suptitle(f"{item.key}: end-to-end speedup over full attention; ours {device} (solid: Llama-2-7B "
                 f"shape, dotted: Llama-3-8B shape), paper A100 (dashed)", fontsize=8)
    fig.tight_layout()
    return latency.write(item, df, md, fig, sources, PAPER_DEVICE, out_root)


def render_fig7(item, impl, sources, out_root: Path) -> list[Path]:
    df = fig7_frame(sources)
    md = (latency.header(item, impl, sources, "attention ms per decode step and speedups", PAPER_DEVICE)
          + latency.md_tables(df, "Method / Context", col_name=str) + FIG7_NOTES)
    kt, device = kernel_times(sources), latency.devices(sources)
    Bs = sorted({b for b, _ in kt})
    plt = _plt()
    fig, axes = plt.subplots(len(Bs), 2, figsize=(10, 3.0 * len(Bs)), squeeze=False)
    for B, row in zip(Bs, axes):
        Ss = sorted(s for b, s in kt if b == B)
        for L, ax in zip((32, 64), row):
            tots = [attention_totals(kt[(B, S)], L) for S in Ss]
            series = [(m, [_ratio(tt[m], tt["Full"]) for tt in tots]) for m in ("Full", "Quest", "TidalDecode")]
            _bars(ax, [ctx(S) for S in Ss], series, "attention latency / Full", f"{L} layers, B={B}",
                  hatch_est=lambda name, j, Ss=Ss, B=B: name == "Quest" and kt[(B, Ss[j])]["est"],
                  annotate=lambda i, j, v: f"{1 / v:.2f}x" if i and v else "")
    axes[0][-1].legend(fontsize=6, loc="upper right")
    c = NUMBERS["fig7"]
    fig.suptitle(f"{item.key}: attention latency relative to Full (labels: speedup), K={K_FIG}, ours "
                 f"{device}; hatched = Quest estimated from its 128K time (bar: a lower bound; its speedup "
                 f"label: an upper bound). Paper (A100): up to "
                 f"{c['max_speedup_vs_full']}x vs Full, {c['max_speedup_vs_quest']}x vs Quest", fontsize=8)
    fig.tight_layout()
    return latency.write(item, df, md, fig, sources, PAPER_DEVICE, out_root)


def _ratio(a, b):
    return None if a is None or b is None else a / b


def render_fig8(item, impl, sources, out_root: Path) -> list[Path]:
    df = fig8_frame(sources)
    md = (latency.header(item, impl, sources, "per-layer kernel ms and ratios", PAPER_DEVICE)
          + latency.md_tables(df, "Kernel / Context", col_name=str) + FIG8_NOTES)
    kt, device = kernel_times(sources), latency.devices(sources)
    Bs = sorted({b for b, _ in kt})
    plt = _plt()
    fig, axes = plt.subplots(1, len(Bs), figsize=(7 * len(Bs), 3.8), squeeze=False)
    parts = [("full", "Full", "0.55"), ("selection", "TD selection attention", "C8"),
             ("selection_topk", "TD selection + top-4096", "C2"), ("tokens", f"TD sparse K={K_FIG}", "C0")]
    quest = [("pages", "Quest sparse pages", "C1"), ("q_scores", "Quest page scores", "C3"),
             ("q_topk", "Quest top-k", "C5")]
    for B, ax in zip(Bs, axes[0]):
        Ss = sorted(s for b, s in kt if b == B)
        x, w = np.arange(len(Ss)), 0.16
        for i, (key, name, color) in enumerate(parts):
            v = [kt[(B, S)][key] / kt[(B, S)]["full"] for S in Ss]
            ax.bar(x + (i - 2) * w, v, w, color=color, label=name)
            for xx, vv in zip(x, v):
                ax.text(xx + (i - 2) * w, vv, f"{vv:.2f}", ha="center", va="bottom", fontsize=5.5, rotation=90)
        bottom = np.zeros(len(Ss))
        for key, name, color in quest:
            v = np.array([kt[(B, S)][key] / kt[(B, S)]["full"] for S in Ss])
            bars = ax.bar(x + 2 * w, v, w, bottom=bottom, color=color, label=name)
            for b, S in zip(bars, Ss):
                if kt[(B, S)]["est"] and key != "pages":
                    b.set_hatch("//")
            bottom += v
        for xx, tot, S in zip(x, bottom, Ss):
            r = (kt[(B, S)]["q_scores"] + kt[(B, S)]["q_topk"] + kt[(B, S)]["pages"]) / kt[(B, S)]["tokens"]
            ax.text(xx + 2 * w, tot, f"{tot:.2f} ({r:.1f}x TD)", ha="center", va="bottom", fontsize=5.5,
                    rotation=90)
        ax.set_xticks(x, [ctx(S) for S in Ss], fontsize=7)
        ax.set_ylabel("kernel latency / full attention", fontsize=7)
        ax.set_title(f"B={B}, K={K_FIG}", fontsize=8)
        ax.grid(axis="y", alpha=0.3)
        ax.margins(y=0.25)
    axes[0][-1].legend(fontsize=6, loc="upper right")
    fig.suptitle(f"{item.key}: per-layer kernels relative to full attention, ours {device}; hatched = "
                 f"Quest selection scaled from 128K (lower bounds). Paper (A100): Quest / TD sparse up to "
                 f"{NUMBERS['fig8']['max_sparse_speedup_vs_quest']}x", fontsize=8)
    fig.tight_layout()
    return latency.write(item, df, md, fig, sources, PAPER_DEVICE, out_root)



# --- registration ------------------------------------------------------------------------------------
TPOT_SETUP = ("bench/tpot.py: end-to-end decode ms/token (TPOT) of our engine, random weights, bf16, "
              "CUDA graphs, batch 1, 32 steps, at 10240/32768/102400 tokens.")
KERNEL_SETUP = ("bench/kernel_ops.py: per-layer kernel times (CUDA-graph medians) at Llama-3-8B decode "
                "shapes (Hq 32, Hkv 8, D 128, bf16), B=1 and 8, 10K/32K/100K/128K.")


def _latency(title, setup, paper_setup, files, render_fn) -> Impl:
    return Impl(title=title, sweeps={}, label=lambda v: ("", "", ""), render=None, metric="ms",
                setup={"paper": setup}, paper_setup=paper_setup, bench=Bench(files, render_fn))


register("tidal.fig6", _latency(
    "End-to-end decode latency, Full vs Quest vs TidalDecode (TidalDecode Fig. 6)", TPOT_SETUP,
    "Llama-2-7B, 10K/32K/100K (Fig. 6; values from Tables 5-6).", TPOT_FILES, render_fig6))
register("tidal.table5-6", _latency(
    "End-to-end latency, K=32..4096 x 10K/32K/100K (TidalDecode Tables 5-6)", TPOT_SETUP,
    "Llama-2-7B, 10K/32K/100K, K=32..4096 (Tables 5-6).", TPOT_FILES, render_table56))
register("tidal.fig7", _latency(
    "Attention latency of 32- and 64-layer models, Full vs Quest vs TidalDecode (TidalDecode Fig. 7)",
    KERNEL_SETUP, "LLaMA with 32 and 64 layers, 10K/32K/100K, K=512.", KERNEL_FILES, render_fig7))
register("tidal.fig8", _latency(
    "Kernel breakdown at K=512: full, selection, sparse, Quest (TidalDecode Fig. 8)", KERNEL_SETUP,
    "attention kernels at 10K/32K/100K, K=512.", KERNEL_FILES, render_fig8))
