"""LycheeDecode latency items from GPU benchmark JSON (results/bench/): Fig. 3 (end-to-end TPOT,
bench/lychee_tpot.py) and Fig. 4 (the hybrid-head kernel vs SDPA flash decode, bench/lychee_kernels.py).

The paper ran an A800 (kernel) and an unstated GPU (end to end); ours run on the device the JSON
names. Absolute times are not comparable across GPUs: the tables show speedups beside the paper's
stated ones (Fig. 3: 2.7x over full and 1.73x over TidalDecode at 128K, batch 1; Fig. 4: up to 7x at
128K, batch 8, 8/8 sparse heads) and, for the kernel, the ratio to its HBM floor (issue 10's target:
within 1.3x).
"""
from __future__ import annotations

import math
from pathlib import Path

from analysis import latency
from analysis.catalogue import Bench, BenchFile, Impl, register

# what bench.lychee_tpot runs: full, tidal and lychee with what they import (not every method of the kit)
E2E_CODE = ("bench/engine.py", "bench/lychee_tpot.py", "runners/engine.py", "runners/graphs.py", "runners/models.py",
            "runners/layer_ops.py",
            *(f"methods/{m}.py" for m in ("__init__", "base", "config", "full", "lychee", "tidal")),
            *(f"methods/parts/{m}.py" for m in ("headfile", "lychee_sets", "selection", "stores", "rope")),
            # the kernel files those import (kernels/__init__ pulls in attention, prefill and quest_pages), not
            # every kernel: another method's new kernel does not change these numbers
            *(f"kernels/{k}.py" for k in ("__init__", "_common", "attention", "prefill", "quest_pages", "fused", "hybrid",
                                          "hybrid_triton", "topk")),
            *(f"conf/method/{m}.yaml" for m in ("full", "tidal", "lychee")), "conf/model")
KERNEL_CODE = ("bench/lychee_kernels.py", "bench/kernel_ops.py", "kernels/hybrid.py", "kernels/hybrid_triton.py",
               "kernels/topk.py", "kernels/attention.py", "kernels/_common.py")
# the sweeps bench/gpu_lychee.sh runs in its ~2-minute GPU slot (the scripts' defaults cover the paper's
# full grids: 16K-128K, batch 1-8, 4..8 sparse heads; declare those here once a longer slot ran them)
TPOT_FILES = [BenchFile("lychee_tpot_llama3_h100.json", "python -m bench.lychee_tpot --model llama3 --weights random "
                        "--contexts 32768 131072 --steps 16", E2E_CODE),
              # batch 2 at 128K: the KV cache outweighs the weights (34 GB against 16), as at the paper's batches
              BenchFile("lychee_tpot_llama3_b2_h100.json", "python -m bench.lychee_tpot --model llama3 --weights random "
                        "--contexts 131072 --batch 2 --steps 16", E2E_CODE)]
GRID_CODE = E2E_CODE + ("bench/lychee_grid.py",)
GRID_FILES = [BenchFile("lychee_grid_llama3_h100.json", "python -m bench.lychee_grid --model llama3 --weights random "
                        "--context 131072", GRID_CODE)]
KERNEL_FILES = [BenchFile("lychee_kernels_h100.json", "python -m bench.lychee_kernels --quick --sparse-heads 4 6 8",
                          KERNEL_CODE)]
NAMES = {"full": "Full", "tidal": "TidalDecode (K=4096)", "lychee": "LycheeDecode (K=4096, tokens)",
         "lychee_block": "LycheeDecode (K=4096, 64-blocks)"}
PAPER_FIG3 = {("lychee_block", "vs full"): 2.7, ("lychee_block", "vs tidal"): 1.73}


def ctx(s: int) -> str:
    return f"{round(s / 1024)}K"


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def fig3_frame(sources):
    rows = []
    for src in sources:
        t = {(r["variant"], r["context"]): r for r in src.rows}
        contexts = sorted({c for _, c in t})
        batch = src.rows[0].get("batch", 1) if src.rows else 1
        pre = "" if batch == 1 else f"batch {batch}: "
        for (v, c), r in sorted(t.items(), key=lambda x: (list(NAMES).index(x[0][0]), x[0][1])):
            rows.append(latency.row(f"{pre}TPOT (ms / token)", NAMES[v], ctx(c), r["tpot_ms"], file=src.name))
            rows.append(latency.row(f"{pre}over the bandwidth floor", NAMES[v], ctx(c), r["over_floor"], unit="x",
                                    file=src.name))
        for v in ("lychee", "lychee_block"):
            for c in contexts:
                if (v, c) not in t:
                    continue
                for ref, label in (("full", "vs full"), ("tidal", "vs tidal")):
                    if (ref, c) in t:
                        paper = PAPER_FIG3.get((v, label)) if c == 131072 and batch == 1 else None
                        rows.append(latency.row(f"{pre}speedup {label}", NAMES[v], ctx(c),
                                                t[(ref, c)]["tpot_ms"] / t[(v, c)]["tpot_ms"], paper, unit="x",
                                                file=src.name))
    return latency.frame(rows)


FIG3_NOTES = """
Notes. Engine decode steps replayed from CUDA graphs, batch 1 (and batch 2 at 128K, the "batch 2" blocks: there
the KV cache, 34 GB, outweighs the 16 GB of weights), 16 steps after a prefill of the context,
Llama-3-8B shape with random weights (latency does not depend on the weights). LycheeDecode: 32
retrieval KV heads of 256 (layer 0's 8 + 24 at random: `heads=random:0:24`; no trained heads for
random weights), K=4096; token sets (the accuracy path: top-k kernel over q̄·K) and 64-slot block sets
(the reference's e2e path: max-pooled block scores). The paper's 2.7x / 1.73x (batch 1, 128K) are set
beside the block path, the one its e2e benchmark ran (benchmark_e2e.sh: block 64 x 64 blocks).
Issue 10's targets: >= 1.7x over full at 128K and faster than TidalDecode. At batch 1 the floors bound the
first: (weights + the full cache) / (weights + what LycheeDecode reads) is about 1.78x at 128K (16 GB of weights
against 17 GB / 2.6 GB of KV), so 1.7x needs LycheeDecode within 1.10x of its floor while full attention runs at
1.05x of its own. Full attention's decode kernel alone reads at 1.01x of its floor at 128K; LycheeDecode's
hybrid kernel and combine, over 32 small layers (floors of 5.6-179 us each), take 1.13 ms against 0.87; with the
hybrid kernel exactly at its floor the step would give 1.69x (per-kernel profile, variants tried: notes/kernels.md).
The engine-wide levers, measured in the engine for both methods (`python -m bench.lever_ceiling`: weights stored
[K, N], the RoPE and K/V-append launches removed), reach 1.70-1.71x with the fusion itself free: no margin.
At batch 2 the KV cache dominates and the bound rises to about 2.4x.
"""


def render_fig3(item, impl, sources, out_root: Path):
    df = fig3_frame(sources)
    md = (latency.header(item, impl, sources, "ms per token, x over the floor, speedups", "not stated")
          + latency.md_tables(df, "Method / Context") + FIG3_NOTES)
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.4))
    tp = df[df["block"] == "TPOT (ms / token)"]
    for i, (name, s) in enumerate(tp.groupby("row", sort=False)):
        ax.plot(s["col"], s["ours"], "o-", color=f"C{i}", label=name)
    ax.set_ylabel("TPOT (ms)")
    ax.set_xlabel("context")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(f"{item.key}: end-to-end decode latency, batch 1 ({latency.devices(sources)})", fontsize=8)
    return latency.write(item, df, md, fig, sources, "not stated (kernel figure: A800)", out_root)


def fig4_frame(sources):
    rows = []
    for src in sources:
        for r in src.rows:
            if r.get("op") != "hybrid":
                continue
            block = f"batch {r['batch']}"
            name = f"{r['sparse_heads']}/8 sparse"
            paper = 7.0 if (r["context"] == 131072 and r["batch"] == 8 and r["sparse_heads"] == 8) else None
            rows.append(latency.row(f"{block}: speedup vs SDPA", name, ctx(r["context"]), r["speedup_vs_sdpa"], paper,
                                    unit="x", file=src.name))
            rows.append(latency.row(f"{block}: over the HBM floor", name, ctx(r["context"]), r["over_floor"],
                                    unit="x", file=src.name))
    return latency.frame(rows)


FIG4_NOTES = """
Notes. Hybrid-head decode kernel (kernels/hybrid_triton.py) at the Llama-3-8B shape (Hq 32, Hkv 8,
D 128, bf16), sparse heads reading 10% of the 64-slot blocks (90% sparsity), retrieval heads the whole
cache; baseline: torch SDPA with the flash backend (FlashAttention-2 in the paper). Floor = K/V bytes
the kernel must read / the measured copy bandwidth; issue 10's target: within 1.3x of it. The JSON
also holds the selection ops (retrieval scores per token and max-pooled, the top-k kernel vs
torch.topk + sort).
"""


def fig4_bar(sources, bar: float = 1.3) -> str:
    """Issue 10's kernel bar over the measured cells, from the data: which cells meet it, and for those
    that miss, their floor and the time above it (a fixed cost per call dominates small floors)."""
    cells = [r for src in sources for r in src.rows if r.get("op") == "hybrid"]
    if not cells:
        return ""
    miss = sorted((r for r in cells if r["over_floor"] > bar), key=lambda r: r["floor_ms"])
    met = [r for r in cells if r["over_floor"] <= bar]
    lines = [f"\nThe {bar}x bar: met in {len(met)} of {len(cells)} cells"]
    if met:
        def span(vals, fmt):
            lo, hi = format(min(vals), fmt), format(max(vals), fmt)
            return lo if lo == hi else f"{lo}-{hi}"
        lines[0] += (f" (floors {span([r['floor_ms'] * 1e3 for r in met], '.0f')} us, "
                     f"{span([r['over_floor'] for r in met], '.2f')}x)")
    lines[0] += "." if not miss else "; missed in:"
    for r in miss:
        lines.append(f"- {ctx(r['context'])}, batch {r['batch']}, {r['sparse_heads']}/8 sparse: floor "
                     f"{r['floor_ms'] * 1e3:.1f} us, ours {r['ms'] * 1e3:.1f} us ({r['over_floor']:.2f}x, "
                     f"+{(r['ms'] - r['floor_ms']) * 1e3:.1f} us)")
    if miss:
        top = math.ceil(max(r["floor_ms"] for r in miss) * 1e3)
        lines.append(f"\nWhere it misses, the floor is under {top} us and the "
                     "time above it is a fixed cost of a few microseconds a call: the launch, the ramp-up and tail "
                     "of the grid, the combine's launch. (SDPA flash decode in those cells: "
                     + ", ".join(sorted({f"{r['sdpa_ms'] * 1e3:.1f}" for r in miss}, key=float)) + " us.)")
    return "\n".join(lines) + "\n"


def render_fig4(item, impl, sources, out_root: Path):
    df = fig4_frame(sources)
    md = (latency.header(item, impl, sources, "speedup over SDPA flash decode and x over the HBM floor",
                         "NVIDIA A800") + latency.md_tables(df, "Sparse heads / Context") + FIG4_NOTES
          + fig4_bar(sources))
    plt = _plt()
    sp = df[df["block"].str.endswith("speedup vs SDPA")]
    blocks = list(dict.fromkeys(sp["block"]))
    fig, axes = plt.subplots(1, max(1, len(blocks)), figsize=(3.4 * max(1, len(blocks)), 3.2), squeeze=False)
    for ax, block in zip(axes[0], blocks):
        b = sp[sp["block"] == block]
        cols = list(dict.fromkeys(b["col"]))
        names = list(dict.fromkeys(b["row"]))
        w = 0.8 / max(1, len(names))
        for i, n in enumerate(names):
            s = b[b["row"] == n].set_index("col").reindex(cols)
            ax.bar([j + i * w for j in range(len(cols))], s["ours"], w, color=f"C{i}", label=n)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks([j + 0.4 - w / 2 for j in range(len(cols))], cols, fontsize=7)
        ax.set_title(block.split(":")[0], fontsize=8)
        ax.set_ylabel("speedup vs SDPA")
    axes[0][-1].legend(fontsize=6)
    fig.suptitle(f"{item.key}: hybrid-head kernel ({latency.devices(sources)})", fontsize=8)
    fig.tight_layout()
    return latency.write(item, df, md, fig, sources, "NVIDIA A800", out_root)


def fig8_frame(sources):
    rows = []
    for src in sources:
        for r in src.rows:
            if r["variant"] != "lychee":
                continue
            name = f"{100 * r['head_ratio']:g}% retrieval heads"
            for block, key, unit in (("speedup vs full (TPOT)", "speedup_vs_full", "x"), ("TPOT (ms / token)",
                                     "tpot_ms", "ms"), ("over the bandwidth floor", "over_floor", "x")):
                rows.append(latency.row(block, name, r["budget"], r[key], unit=unit, file=src.name))
        full = [r for r in src.rows if r["variant"] == "full"]
        if full:
            rows.append(latency.row("TPOT (ms / token)", "Full attention", "-", full[0]["tpot_ms"], file=src.name))
    return latency.frame(rows)


FIG8_NOTES = """
Notes. The speedup axis of the paper's Fig. 8 only: end-to-end TPOT at 128K, batch 1, Llama-3-8B shape with
random weights, LycheeDecode's 64-slot block path, token budget K x the share of KV heads that are retrieval
heads (layer 0's 8 forced and counted; the others drawn at random: latency depends on how many, not which),
full attention measured in the same run. The figure's other axis, the LongBench average score, is not here:
the LongBench data is not available offline, and choosing the top r% of a trained head file's heads by score
(the paper's ratio) is not an option of `method=lychee` yet. The paper prints no numbers for this figure.
"""


def render_fig8(item, impl, sources, out_root: Path):
    df = fig8_frame(sources)
    md = (latency.header(item, impl, sources, "speedup over full attention, ms per token, x over the floor",
                         "not stated") + latency.md_tables(df, "Retrieval heads / Budget") + FIG8_NOTES)
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 3.2))
    sp = df[df["block"] == "speedup vs full (TPOT)"]
    for i, (name, s) in enumerate(sp.groupby("row", sort=False)):
        ax.plot([str(c) for c in s["col"]], s["ours"], "o-", color=f"C{i}", label=name)
    ax.set_xlabel("token budget K")
    ax.set_ylabel("TPOT speedup vs full")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title(f"{item.key}: speedup by budget and retrieval heads, 128K ({latency.devices(sources)})", fontsize=8)
    return latency.write(item, df, md, fig, sources, "not stated", out_root)


def _latency(title, setup, paper_setup, files, render_fn) -> Impl:
    return Impl(title=title, sweeps={}, label=lambda v: ("", "", ""), render=None, metric="ms",
                setup={"paper": setup}, paper_setup=paper_setup, bench=Bench(files, render_fn))


register("lychee.fig3", _latency(
    "End-to-end decode latency (TPOT): full vs TidalDecode vs LycheeDecode, K=4096 (LycheeDecode Fig. 3)",
    "bench/lychee_tpot.py: engine TPOT, Llama-3-8B shape (random weights), batch 1 at 32K and 128K, batch 2 at "
    "128K, 16 steps.",
    "model not stated (Llama-3-8B inferred from Table 1), TPOT vs context and batch, K=4096 (GPU not stated).",
    TPOT_FILES, render_fig3))
register("lychee.fig8", _latency(
    "Budget x retrieval-head ratio: TPOT speedup over full attention (LycheeDecode Fig. 8, the speedup axis)",
    "bench/lychee_grid.py: engine TPOT at 128K, Llama-3-8B shape (random weights), batch 1, K 1024/2048/4096 x "
    "12.5/25/50% retrieval heads, 64-slot blocks, 16 steps.",
    "Llama3-8B-Instruct-Gradient-1048k, LongBench average vs TPOT speedup, K 1024/2048/4096 x 12.5/25/50% "
    "retrieval heads (GPU not stated).", GRID_FILES, render_fig8))
register("lychee.fig4", _latency(
    "Hybrid-head kernel vs FlashAttention-2 by sparse-head ratio, batch 1-8, 16K-128K (LycheeDecode Fig. 4)",
    "bench/lychee_kernels.py: kernel times (CUDA-graph medians), Llama-3-8B decode shape, 90% sparsity, block 64.",
    "A800, 16K-128K, batch 1-8, 4/8..8/8 sparse KV heads, 90% sparsity, block 64 (TileLang).",
    KERNEL_FILES, render_fig4))
