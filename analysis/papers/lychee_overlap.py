"""LycheeDecode Fig. 1 and Figs. 9-13: per-head top-5 overlap between adjacent layers for the final
answer token of the paper's reasoning prompts (bench/lychee_overlap.py). The paper's point (sec. 1):
heads of one layer differ ("the overlap rate of the 14th head of the last two layers is 0%, while the
24th head is 100%"), so a layer-wise sharing of the selected tokens (TidalDecode) is too coarse and
LycheeDecode shares per head. Ours: the same prompts and answers on the embedded model; the table
gives, per prompt, the mean overlap and the share of (layer pair, head) cells at 0% and at 100%, and
the spread within a layer pair (the mean over pairs of max - min across its heads: 0 would mean the
heads of a layer agree). Fig. 9 (attention of retrieval vs sparse heads on a noisy prompt) needs a
trained head set on Llama-3 and is not drawn here.
"""
from __future__ import annotations

from analysis import latency, provenance, render
from analysis.catalogue import Bench, BenchFile, Impl, register

FILE = BenchFile("lychee_overlap_smollm2.json", "python -m bench.lychee_overlap --model smollm2",
                 ("bench/lychee_overlap.py",), gpu=False)
FIGS = {"lychee.fig1": ["fig1"], "lychee.fig9-13": ["fig10", "fig11", "fig12", "fig13"]}


def summary(ov: list[list[float]]) -> dict:
    flat = [x for row in ov for x in row]
    return {"mean overlap": 100 * sum(flat) / len(flat), "heads at 0%": 100 * sum(x == 0 for x in flat) / len(flat),
            "heads at 100%": 100 * sum(x == 1 for x in flat) / len(flat),
            "spread within a layer pair": 100 * sum(max(r) - min(r) for r in ov) / len(ov)}


def render_overlap(item, impl, sources, out):
    src = sources[0]
    cases = [c for c in (src.data or {}).get("cases", []) if c["figure"] in FIGS[item.key]]
    plt = render._plt()
    fig, axes = plt.subplots(1, max(1, len(cases)), figsize=(4.2 * max(1, len(cases)), 5), squeeze=False)
    rows = []
    for ax, c in zip(axes[0], cases):
        ov = c["overlap"]
        im = ax.imshow(ov, aspect="auto", cmap="viridis", vmin=0, vmax=1, interpolation="nearest")
        ax.set_title(f"{c['figure']}: answer '{c['answer']}'", fontsize=8)
        ax.set_xlabel("query head", fontsize=7)
        ax.set_ylabel("layer pair (l, l+1)", fontsize=7)
        for k, v in summary(ov).items():
            rows.append(latency.row("per prompt", c["figure"], k, v, None, "%", file=src.name))
    if cases:
        fig.colorbar(im, ax=axes[0][-1])
    else:
        axes[0][0].set_axis_off()
    d = src.data or {}
    md = (f"# {item.key}: {impl.title}\n\nOurs: {impl.setup['embedded']} Model {d.get('model', '?')}, "
          f"{d.get('dtype', '?')}, k = {d.get('k', '?')}, device {src.device}.\nPaper: {impl.paper_setup}\n\n"
          + (latency.md_tables(latency.frame(rows), "Prompt", col_name=str) if rows else "\nNot measured yet.\n")
          + "\n" + "\n".join(f"- {c['figure']}: {c['tokens']} tokens, query token {c['query_token']!r}; the model's "
                             f"own greedy answer: {c['model_answer']!r}" for c in cases)
          + "\n\n" + __doc__ + provenance.markdown(sources))
    fig.suptitle(f"{item.key}: top-{d.get('k', 5)} overlap between adjacent layers, per head", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    return render.write(out, item.key, md, latency.frame(rows), fig)


def _impl(title: str, paper: str) -> Impl:
    return Impl(title=title, sweeps={}, label=lambda v: ("", "", ""), render=None, metric="overlap",
                setup={"embedded": "bench/lychee_overlap.py: the paper's prompts and Llama-3's answers, raw text, "
                                   "full attention (eager), the answer's last token as the query.",
                       "paper": "bench/lychee_overlap.py --model llama3 (weights needed)."},
                paper_setup=paper, bench=Bench([FILE], render_overlap))


register("lychee.fig1", _impl("Per-head top-5 overlap between adjacent layers (LycheeDecode Fig. 1)",
                              "Llama-3 (size not stated), the 'circle' prompt, k = 5 (heatmap only; text: head 14 of the last "
                              "two layers 0%, head 24 100%)."))
register("lychee.fig9-13", _impl("Top-5 overlap between adjacent layers, more prompts (LycheeDecode Figs. 10-13; "
                                 "Fig. 9 not drawn)", "Llama-3 (size not stated), four reasoning prompts, k = 5 (heatmaps only)."))
