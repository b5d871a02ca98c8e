"""Cascading KV Cache Figs. 10 and 17: attention matrices of StreamingLLM and the cascade cache with the
same total cache, reconstructed on the first tokens of the first PG-19 test book (bench/cascade_attnmap.py
writes them; no numbers in the paper to compare: the figure shows patterns). Each panel is the mean
attention probability per block of queries x keys (log scale): StreamingLLM's band of recent tokens
beside the cascade's strata, sparser the deeper the cascade, that keep tokens far behind the window."""
from __future__ import annotations

import math

from analysis import latency, provenance, render
from analysis.catalogue import Bench, BenchFile, Impl, register

FILE = BenchFile("cascade_attnmap_smollm2.json", "python -m bench.cascade_attnmap --model smollm2",
                 ("bench/cascade_attnmap.py", "methods/cascade.py", "methods/parts/stores_cascade.py",
                  "methods/parts/cascade_plan.py", "kernels/cascade_update.py", "kernels/cascade_attention.py"), gpu=False)


def render_maps(item, impl, sources, out):
    src = sources[0]
    maps = (src.data or {}).get("maps") or []
    plt = render._plt()
    layers = sorted({m["layer"] for m in maps}) or [0]
    fig, axes = plt.subplots(len(layers), 2, figsize=(8, 4 * len(layers)), squeeze=False)
    rows = []
    for i, layer in enumerate(layers):
        for j, name in enumerate(("streaming", "cascade")):
            ax = axes[i][j]
            m = next((x for x in maps if x["layer"] == layer and x["method"] == name), None)
            if m is None:
                ax.set_axis_off()
                continue
            grid = [[math.log10(v) if v > 0 else float("nan") for v in row] for row in m["mean_prob"]]
            ax.imshow(grid, cmap="magma", vmin=-7, vmax=0, interpolation="nearest")
            ax.set_title(f"{'StreamingLLM (1 cascade)' if name == 'streaming' else 'Cascade'}: layer {layer}, "
                         f"head {m['head']}", fontsize=8)
            ax.set_xlabel("key position (blocks)", fontsize=7)
            ax.set_ylabel("query position (blocks)", fontsize=7)
            n = len(m["mean_prob"])
            # how far back the attention reaches: keys seen per query block, as a share of the causal triangle
            seen = sum(1 for r, row in enumerate(m["mean_prob"]) for c, v in enumerate(row) if v > 0 and c <= r)
            rows.append(latency.row("key blocks with attention, % of the causal triangle", name, f"layer {layer}",
                                    100 * seen / (n * (n + 1) / 2), None, "%"))
    s = (src.data or {}).get("settings", {})
    md = (f"# {item.key}: {impl.title}\n\nOurs: {src.data.get('model') if src.data else '?'}, first "
          f"{(src.data or {}).get('tokens', '?')} tokens of the first PG-19 test book, cache {s.get('cache')} "
          f"(+64 sinks), {s.get('cascades')} cascades vs 1, stride {s.get('stride')}; panels: log10 of the mean "
          f"attention probability per block ({s.get('grid')}x{s.get('grid')} blocks).\nPaper: {impl.paper_setup}\n"
          + (latency.md_tables(latency.frame(rows), "Method", col_name=str) if rows else "\nNo maps yet.\n")
          + provenance.markdown(sources))
    fig.suptitle(f"{item.key}: reconstructed attention (log10 mean probability per block)", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.97))  # panel titles clear the axis labels above them
    return render.write(out, item.key, md, latency.frame(rows), fig)


def _impl(title: str) -> Impl:
    return Impl(title=title, sweeps={}, label=lambda v: ("", "", ""), render=None, metric="prob",
                setup={"paper": "bench/cascade_attnmap.py, SmolLM2-135M-Instruct (CPU or GPU)"},
                paper_setup="LLaMA3.1-8B, first 8K tokens of the first PG-19 test book, cache 2048, 4 cascades, "
                            "stride 256 (Figs. 10, 17; images only).",
                bench=Bench([FILE], render_maps))


register("cascade.fig10", _impl("Attention matrix reconstructions, StreamingLLM vs Cascade (Cascading Fig. 10)"))
register("cascade.fig17", _impl("More attention matrix reconstructions (Cascading Fig. 17)"))
