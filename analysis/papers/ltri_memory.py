"""Ltri-LLM Table 4: GPU memory held for evicted tokens at 100K-800K, from bench/memory_offload.py's
measured device memory (torch.cuda.memory_allocated around setup + prefill), not from a formula: a
method's bytes at a length minus its bytes at the baseline length 4224 (InfLLM's 128 sinks + 4096
window: nothing evicted yet). Full attention keeps every evicted token's K and V on the GPU; InfLLM
keeps its blocks in host memory and, on the GPU, a representative key per (block, query head) plus a
fixed cache; Ltri-LLM keeps span index vectors (grown to fit, so they follow what it stores).

The benchmark builds Llama-3-8B's shape with random weights and `--layers` of its 32 layers (a full
32-layer prefill of 800K tokens per method does not fit the device machine's 10-minute calls); the
table states the layers measured and shows the 32-layer figure as measured x 32 / layers (every layer
holds the same structures). Random weights also mean Ltri-LLM's dynamic index-vector counts come from
random attention maps, not the model's. The paper's InfLLM row is "reprTopk12" (12 representative
keys per block and head kept separately); ours is InfLLM's default (repr_topk 4, averaged: one key).
StreamingLLM (not in the paper's table) drops evicted tokens: its ring of 128 + 4096 slots is fixed at
setup, so its row should read 0 at every length; it is measured, beside the others, with its decode
cost (the last block: ms per token for the layers each file builds, embedding and LM head included).

Ltri-LLM's λ rows: the paper sets λ=20 for the first four layers and λ (3, 10) for the rest, so its
32-layer figure is 4 layers at λ=20 + 28 at λ. A 1-layer file built without `first_layers=0` measures
layer 0, a λ=20 layer, whatever `lam` says (so an earlier λ=10 file matched the λ=3 file byte for
byte, and was dropped); that file is now the `layers 0-3 (λ=20)` row, and each λ row is composed as
4 x that + 28 x its own 1-layer file (`first_layers=0`). With random weights λ matters little: on the
CPU, one random layer of this shape at 8,448 tokens keeps 396, 383 and 361 index vectors for λ=3, 10,
20 (the cap is 396: 12 per block), because random maps have few spans and the per-span floor and the
gap fills dominate; the paper's 2x between λ=3 and λ=10 comes from the trained model's area ratios.
On the H100 at 819K the same holds: 76,404, 75,123 and 71,991 index vectors for λ=3, 10 and 20, and
the λ=3 and λ=10 files allocate the same bytes at every length (the store grows in steps, larger
than the 2% between their counts).

Why our Ltri-LLM rows are far above the paper's: they run without retrieval heads (random weights
have none to find; `retrieval_heads: []`), so every layer indexes in the all-heads space, 32 heads x
128 = 4096 values per index vector, where the paper's retrieval head keeps 128 (1/32). Arithmetic,
not a measurement: the λ=20 layer holds 0.60 GiB at 800K, 32 such layers 19.2 GiB; with one head's
128 values, 1/32 of that, 0.60 GiB for the model, vs the paper's 0.24 (its trained maps and λ=3
layers set its vector counts). Prefill to 819K on 1 layer (a λ=20 layer): Ltri-LLM 52 s and 39 s in
two runs, InfLLM 6.6 s per layer (13.3 s on 2), H100 2026-11-25.

StreamingLLM's rows read slightly below 0: its first measurement (the 4224-token baseline) holds
~28 MiB that later ones do not (a one-off allocation of the first prefill), and the rest grows by
~16 bytes per token, the harness's token ids and positions, which every method's numbers include.
Its ring itself (128 + 4096 slots, 33.5 MiB for 2 layers) is allocated at setup and never grows.
"""
from __future__ import annotations

import pandas as pd

from analysis import latency, papers_data, render
from analysis.catalogue import Bench, BenchFile, Impl, register

# the full + InfLLM file runs no Ltri-LLM code: an Ltri change does not stale it
CODE = ("bench/memory_offload.py", "methods/infllm.py", "methods/parts/stores_blocks.py", "methods/full.py",
        "methods/parts/stores.py", "runners/engine.py")
LTRI_CODE = CODE + ("methods/ltri.py", "methods/parts/ltri_spans.py")
STREAMING_CODE = ("bench/memory_offload.py", "methods/streaming_llm.py", "methods/parts/stores.py", "runners/engine.py",
                  "kernels/prefill.py")
LENGTHS = [4224, 102400, 204800, 307200, 409600, 512000, 614400, 716800, 819200]
_CMD = "python -m bench.memory_offload --model llama3 --weights random --lengths " + " ".join(map(str, LENGTHS))
# One file per call of the device machine (10 minutes). Ltri-LLM's prefill takes ~4x InfLLM's per layer
# (H100: 22 s to 410K on 1 layer after the host-side span detection was vectorised, from ~34 s), so each
# Ltri setting has its own file with 1 layer; each file is scaled by its own layers.
FILES = [BenchFile("memory_evicted_llama3_h100.json", f"{_CMD} --layers 2 --methods full infllm --steps 2 "
                   "--setup-only full", CODE),
         # 1 layer = layer 0, one of the first four that use lam_first=20 (the paper's section 4)
         BenchFile("memory_evicted_ltri_llama3_h100.json", f"{_CMD} --layers 1 --methods ltri --steps 2", LTRI_CODE),
         # first_layers=0: the one layer measured uses `lam`, the setting of the other 28 layers
         BenchFile("memory_evicted_ltri3_llama3_h100.json", f"{_CMD} --layers 1 --methods ltri:first_layers=0 "
                   "--steps 2", LTRI_CODE),
         BenchFile("memory_evicted_ltri10_llama3_h100.json", f"{_CMD} --layers 1 --methods "
                   "ltri:lam=10,first_layers=0 --steps 2", LTRI_CODE),
         # the side-by-side: a bounded cache holds nothing for evicted tokens (they are gone)
         BenchFile("memory_evicted_streaming_llama3_h100.json", f"{_CMD} --layers 2 --methods "
                   "streaming_llm:sink=128,window=4096 --steps 8", STREAMING_CODE)]
PAPER = papers_data.item("ltri.table4")
COLS = PAPER["columns"]
NAMES = {"full": "LLAMA3-8B-Instruct-262K", "infllm": "InfLLM-reprTopk12",
         "streaming_llm": "StreamingLLM (128 sinks + 4096 window)"}
PAPER_DEVICE = "not stated (the paper's GPU)"


FIRST = "Ltri-LLM, layers 0-3 (λ=20)"
LAMBDA_ROWS = ("Ltri-LLM M=12,λ=3", "Ltri-LLM M=12,λ=10")


def _label(spec: dict) -> str:
    if spec["name"] == "ltri":
        if spec.get("first_layers", 4) > 0:      # the bench's 1-2 layers are all below first_layers
            return FIRST
        return f"Ltri-LLM M=12,λ={spec.get('lam', 3):g}"
    return NAMES.get(spec["name"], spec["name"])


def _per_model(lab: str, col: str, per_layer: dict) -> float | None:
    """32 layers from per-layer GiB: Ltri-LLM's λ rows are 4 layers at λ=20 + 28 at λ (section 4)."""
    got = per_layer.get((lab, col))
    if got is None or not lab.startswith("Ltri-LLM M="):
        return None if got is None else got * 32
    first = per_layer.get((FIRST, col))
    return None if first is None else 4 * first + 28 * got


def frame(sources) -> tuple[pd.DataFrame, str]:
    rows, measured, per_layer, files, decode = [], [], {}, {}, []
    for src in sources:
        layers = int((src.data or {}).get("layers") or 32)
        if src.data is not None:
            measured.append(f"{layers} in {src.name}")
        base = {}
        for r in src.rows:
            if "error" not in r and r["context"] == min(x["context"] for x in src.rows):
                base[_label(r["spec"])] = r["device_bytes_allocated"]
        for r in src.rows:
            lab = _label(r["spec"])
            if r["context"] == min(x["context"] for x in src.rows):
                continue
            col = f"{round(r['context'] / 1024)}K"
            got = None if "error" in r or lab not in base else (r["device_bytes_allocated"] - base[lab]) / 2**30
            rows.append(latency.row("measured", lab, col, got, unit="GiB", file=src.name))
            per_layer[(lab, col)] = None if got is None else got / layers
            files[(lab, col)] = src.name
            # decode cost at that context, with the file's layers (embedding and LM head included: not per
            # layer); setup-only rows (full: its store is allocated, never prefilled) have none
            if r.get("decode_ms_median") is not None:
                decode.append(latency.row("decode ms/token (layers measured)", f"{lab}, {layers} layer(s)", col,
                                        r["decode_ms_median"], file=src.name))
    for (lab, col), name in files.items():
        if lab == FIRST:                          # a part of the λ rows' totals, not a model of its own
            continue
        rows.append(latency.row("x 32 layers", lab, col, _per_model(lab, col, per_layer), paper=_paper(lab, col),
                                unit="GiB", file=name))
    for lab in LAMBDA_ROWS:                       # the λ files not measured yet: the paper's cells, ours empty
        if not any(k[0] == lab for k in files):
            rows += [latency.row("x 32 layers", lab, c, None, paper=_paper(lab, c), unit="GiB") for c in COLS]
    return latency.frame(rows + decode), "; ".join(measured)


def _paper(label: str, col: str):
    vals = PAPER["rows"].get(label)
    return vals[COLS.index(col)] if vals and col in COLS else None


def render_table4(item, impl, sources, out):
    df, layers = frame(sources)
    md = (latency.header(item, impl, sources, f"GiB of GPU memory for evicted tokens, measured with few layers "
                                              f"({layers}); block `x 32 layers` scales each file to the model", PAPER_DEVICE)
          + latency.md_tables(df, "Method", col_name=str) + "\n" + __doc__.split("\n\n", 1)[1])
    plt = render._plt()
    fig, ax = plt.subplots(figsize=(6, 3.4))
    sc = df[df["block"] == "x 32 layers"]
    for i, r in enumerate(sc["row"].unique()):
        s = sc[sc["row"] == r]
        ax.plot(s["col"], s["ours"], "o-", color=f"C{i}", label=f"{r} (ours)")
        if s["paper"].notna().any():
            ax.plot(s["col"], s["paper"], "x--", color=f"C{i}", alpha=0.6, label=f"{r} (paper)")
    ax.set_yscale("log")
    ax.set_ylabel("GiB")
    ax.legend(fontsize=5)
    return latency.write(item, df, md, fig, sources, PAPER_DEVICE, out)


register("ltri.table4", Impl(
    title="GPU memory of evicted tokens, 100K-800K (Ltri-LLM Table 4)", sweeps={}, label=lambda v: ("", "", ""),
    render=None, metric="GiB", setup={"paper": "bench/memory_offload.py on Llama-3-8B's shape (random weights)."},
    paper_setup="Llama-3-8B-Instruct-262K.", bench=Bench(FILES, render_table4)))
