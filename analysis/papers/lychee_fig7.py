"""LycheeDecode Fig. 7: head-specialisation dynamics. Heatmaps of the per-head probability of being a
retrieval head over training steps, DuoAttention's direct gates (the gate value itself) beside
LycheeDecode's HardKuma gates (the value the final set is cut from: the Kumaraswamy mean by default),
and the Kumaraswamy PDFs of two heads at a few steps. From bench/train_curves.py's JSON (the curves
offline/train_heads.py records).

The paper trains Llama-3-8B-Instruct-1048k for 1000 steps (lr 0.01) and plots layer 8 head 0 and layer
10 head 0. Ours is a short CPU recipe on SmolLM2 (60 steps, lr 0.03, contexts 250-500 tokens; the
committed SmolLM2 head files come from 1000 GPU steps at 1K-7K, methods/heads/README.md): the PDF
panels show the head whose final probability is highest and the one whose is lowest outside layer 0
(forced retrieval). The numbers the text states are facts about the
paper's run; ours are the share of heads still "grey" (0.4-0.6) at the last step, for both gates.
"""
from __future__ import annotations

import math

from analysis import latency, provenance, render
from analysis.catalogue import Bench, BenchFile, Impl, register

RECIPE = ("steps=60 steps_per_sample=4 lr=0.03 data.context_min=250 data.context_max=500 data.num_passkeys=2 "
          "data.passkey_length=6 data.buffer=30 student.sink=8 student.recent=16 log.every=1 "
          "log.wandb.mode=disabled log.progress=false log.pdf_steps=[0,10,20,30,40,50]")
CODE = ("bench/train_curves.py", "offline/train_heads.py", "offline/gates.py", "offline/student.py",
        "offline/heads_data.py", "conf/train_heads.yaml")
FILES = [BenchFile("train_curves_smollm2_duo_cpu.json", f"python -m bench.train_curves recipe=passkey-duo {RECIPE}",
                   CODE, gpu=False),
         BenchFile("train_curves_smollm2_hardkuma_cpu.json",
                   f"python -m bench.train_curves recipe=passkey-hardkuma {RECIPE}", CODE, gpu=False)]
NAME = {"passkey-duo": "DuoAttention (direct gates)", "passkey-hardkuma": "LycheeDecode (HardKuma)"}


def kuma_pdf(x: float, a: float, b: float) -> float:
    """Kumaraswamy density a b x^(a-1) (1 - x^a)^(b-1) on (0, 1)."""
    return a * b * x ** (a - 1) * (1 - x ** a) ** (b - 1)


def _grey(probs) -> float:
    flat = [p for row in probs for p in row]
    return 100 * sum(0.4 <= p <= 0.6 for p in flat) / max(1, len(flat))


def _pdf_heads(final) -> list[tuple[int, int]]:
    """(layer, head) of the highest final probability and of the lowest outside layer 0."""
    cells = [(p, li, h) for li, row in enumerate(final) for h, p in enumerate(row)]
    top = max(cells)
    low = min(c for c in cells if c[1] > 0) if any(c[1] > 0 for c in cells) else min(cells)
    return [(top[1], top[2]), (low[1], low[2])]


def render_fig7(item, impl, sources, out):
    plt = render._plt()
    have = [s for s in sources if s.data and s.data.get("retrieval_prob")]
    kuma = next((s for s in have if s.data.get("recipe") == "passkey-hardkuma"), None)
    heads = _pdf_heads(kuma.data["retrieval_prob"][-1]) if kuma else []
    fig, axes = plt.subplots(1, 2 + len(heads), figsize=(4 * (2 + len(heads)), 3.6), squeeze=False)
    rows = []
    for j, recipe in enumerate(("passkey-duo", "passkey-hardkuma")):
        ax = axes[0][j]
        src = next((s for s in have if s.data.get("recipe") == recipe), None)
        if src is None:
            ax.set_axis_off()
            ax.set_title(f"{NAME[recipe]}: not measured", fontsize=8)
            continue
        d = src.data
        grid = [[p for row in step for p in row] for step in d["retrieval_prob"]]   # steps x (layer, head)
        im = ax.imshow(list(map(list, zip(*grid))), aspect="auto", cmap="coolwarm", vmin=0, vmax=1,
                       interpolation="nearest", extent=(d["steps"][0], d["steps"][-1], len(grid[0]), 0))
        ax.set_title(NAME[recipe], fontsize=8)
        ax.set_xlabel("training step", fontsize=7)
        ax.set_ylabel("head (layer-major)", fontsize=7)
        t = d["training"]
        final = d["retrieval_prob"][-1]
        rows.append(latency.row("last step", NAME[recipe], "grey heads (0.4-0.6), %", _grey(final), None, "%",
                                file=src.name))
        rows.append(latency.row("last step", NAME[recipe], "heads > 0.5", sum(p > 0.5 for r in final for p in r),
                                None, "n", file=src.name))
        rows.append(latency.row("last step", NAME[recipe], "density", t["final_density"], None, "n", file=src.name))
        rows.append(latency.row("last step", NAME[recipe], "target density", t["target_density"], None, "n",
                                file=src.name))
    fig.colorbar(im, ax=axes[0][1]) if have else None
    xs = [i / 400 for i in range(1, 400)]
    for k, (layer, head) in enumerate(heads):
        ax = axes[0][2 + k]
        for step, state in sorted(kuma.data.get("gate_states", {}).items(), key=lambda kv: int(kv[0])):
            a, b = state["a"][layer][head], state["b"][layer][head]
            ys = [kuma_pdf(x, a, b) for x in xs]
            ax.plot(xs, [min(y, 10.0) if math.isfinite(y) else 10.0 for y in ys], label=f"step {step}")
        ax.set_title(f"Kuma PDF, layer {layer} head {head} (final P = "
                     f"{kuma.data['retrieval_prob'][-1][layer][head]:.2f})", fontsize=8)
        ax.set_ylim(0, 10)
        ax.set_xlabel("s (before the stretch)", fontsize=7)
        ax.legend(fontsize=5)
    s0 = have[0].data["training"] if have else {}
    md = (f"# {item.key}: {impl.title}\n\nOurs: {impl.setup['embedded']} "
          f"({s0.get('steps', '?')} steps, lr {s0.get('lr', '?')}, device {s0.get('device', '?')}).\n"
          f"Paper: {impl.paper_setup}\n\nHeatmaps: P(retrieval) per KV head (rows, layer-major) over training "
          f"steps; red = retrieval, blue = sparse. PDFs: the HardKuma gate's Kumaraswamy density (before the "
          f"stretch to (-0.1, 1.1) and the clamp) of the two heads named, at the logged steps.\n"
          + (latency.md_tables(latency.frame(rows), "Gates", col_name=str) if rows else "\nNo curves yet.\n")
          + "\n" + __doc__.split("\n\n", 1)[1] + provenance.markdown(sources))
    fig.suptitle(f"{item.key}: head specialisation during training", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    return render.write(out, item.key, md, latency.frame(rows), fig)


register("lychee.fig7", Impl(
    title="Training dynamics: P(retrieval) per head over steps, Kumaraswamy PDFs (LycheeDecode Fig. 7)",
    sweeps={}, label=lambda v: ("", "", ""), render=None, metric="prob",
    setup={"embedded": "bench/train_curves.py on SmolLM2-135M-Instruct, a short CPU recipe "
                       "(60 steps at 250-500 tokens), DuoAttention's direct gates and LycheeDecode's HardKuma side by "
                       "side", "paper": "bench/train_curves.py (give the model's weights and the reference recipe)"},
    paper_setup="Llama-3-8B-Instruct-1048k, 1000 steps, lr 0.01, DuoAttention vs LycheeDecode; PDFs of layer 8 "
                "head 0 and layer 10 head 0 at steps 0/100/200/500/1000 (images only).",
    bench=Bench(FILES, render_fig7)))
