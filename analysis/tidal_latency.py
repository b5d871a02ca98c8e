"""TidalDecode latency items: Fig. 6 and Tables 5-6 (end-to-end decode ms/token), Fig. 7 (attention
latency of 32/64 layers) and Fig. 8 (kernel breakdown at K=512), rendered from the GPU benchmark
JSON under results/bench/ (bench/tpot.py, bench/kernel_ops.py), not from run rows.

Ours run on an H100 (the JSON names the device), the paper's on an A100 80GB SXM4: absolute times
are not comparable across the two GPUs (nor engines), so every table shows speedups (Full ms / method
ms) beside the paper's. Our TPOT budgets are K=32/256/1024/4096; the paper's 32..4096 in powers of 2.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis import render
from analysis.catalogue import Bench, Impl
from analysis.tidal import NUMBERS

PAPER = NUMBERS["table5-6"]
PAPER_DEVICE = "NVIDIA A100 80GB SXM4 (CUDA 12.2)"
TPOT = {"llama2_7b": "tpot_llama2_7b_h100.json", "llama3": "tpot_llama3_h100.json"}
SHAPE = {"llama2_7b": "Llama-2-7B shape (MHA 32 heads, 32 layers)",
         "llama3": "Llama-3-8B shape (GQA 32/8 heads, 32 layers)"}
KERNELS = "kernels_llama3_h100.json"
TPOT_CMD = "bash bench/gpu_session.sh tpot   # both tpot_*_h100.json; OUT=<dir> writes elsewhere"
KERNELS_CMD = f"python3 -m bench.kernel_ops --sweep --out results/bench/{KERNELS}"
CONTEXTS = ["10K", "32K", "100K"]
NAME = {"full": "Full", "quest": "Quest", "tidal": "TidalDecode"}
K_FIG = 512          # Figs. 7-8: "a token budget of K=512 for TidalDecode and Quest across all evaluations"
NOT_COMPARABLE = ("Absolute times are not comparable across GPUs (ours: {ours}; paper: " + PAPER_DEVICE +
                  ") nor across engines; compare the speedups (Full / method), shown beside the paper's.")


def ctx(s: int) -> str:
    return f"{round(s / 1024)}K"                       # 10240 -> 10K, 102400 -> 100K, 131072 -> 128K


def _row(block, row, col, ours, paper=None, unit="ms", est=False) -> dict:
    return {"block": block, "row": row, "col": col, "ours": ours, "paper": paper, "unit": unit, "est": est}


def _div(a, b):
    return None if a is None or b is None else a / b


# --- end-to-end TPOT (Fig. 6, Tables 5-6) ----------------------------------------------------------

def tpot(data: dict) -> tuple[dict, str]:
    """(model, context label, method, budget) -> ms/token (batch 1), and the device."""
    out, device = {}, ""
    for model, name in TPOT.items():
        d = data[name]
        device = d.get("device", device)
        for r in d["rows"]:
            if r.get("batch", 1) == 1:
                out[(model, ctx(r["context"]), r["method"], r["budget"])] = r["tpot_ms"]
    return out, device


def paper_ms(method: str, c: str, k: int | None):
    if method == "full":
        return PAPER["full"].get(c)
    vals = PAPER[method].get(c)
    return vals[PAPER["columns"].index(k)] if vals and k in PAPER["columns"] else None


def fig6_frame(data: dict) -> tuple[pd.DataFrame, str]:
    t, device = tpot(data)
    rows = []
    for model in TPOT:
        ks = sorted({k for (m, _, meth, k) in t if m == model and k is not None})
        for c in CONTEXTS:
            block, mine = f"{model} @ {c}", model == PAPER["model"]
            pf = paper_ms("full", c, None) if mine else None
            full = t.get((model, c, "full", None))
            rows.append(_row(block, "Full (ms)", "Full", full, pf))
            for meth in ("quest", "tidal"):
                rows += [_row(block, f"{NAME[meth]} (ms)", k, t.get((model, c, meth, k)),
                              paper_ms(meth, c, k) if mine else None) for k in ks]
            for meth in ("quest", "tidal"):
                rows += [_row(block, f"speedup Full/{NAME[meth]}", k, _div(full, t.get((model, c, meth, k))),
                              _div(pf, paper_ms(meth, c, k)) if mine else None, "x") for k in ks]
            rows += [_row(block, "speedup Quest/TidalDecode", k,
                          _div(t.get((model, c, "quest", k)), t.get((model, c, "tidal", k))),
                          _div(paper_ms("quest", c, k), paper_ms("tidal", c, k)) if mine else None, "x")
                     for k in ks]
    return pd.DataFrame(rows), device


def table56_frame(data: dict) -> tuple[pd.DataFrame, str]:
    t, device = tpot(data)
    rows, ks = [], PAPER["columns"]
    for model in TPOT:
        mine = model == PAPER["model"]
        for table, meth in ((5, "tidal"), (6, "quest")):
            block = f"Table {table}: {NAME[meth]}, {model}, ms/token"
            for c in CONTEXTS:
                rows.append(_row(block, c, "Full", t.get((model, c, "full", None)),
                                 paper_ms("full", c, None) if mine else None))
                rows += [_row(block, c, k, t.get((model, c, meth, k)), paper_ms(meth, c, k) if mine else None)
                         for k in ks]
        for num, den in (("full", "tidal"), ("full", "quest"), ("quest", "tidal")):
            block = f"speedup {NAME[num]}/{NAME[den]}, {model}"
            for c in CONTEXTS:
                rows += [_row(block, c, k, _div(t.get((model, c, num, None if num == "full" else k)),
                                                t.get((model, c, den, k))),
                              _div(paper_ms(num, c, k), paper_ms(den, c, k)) if mine else None, "x")
                         for k in ks]
    return pd.DataFrame(rows), device


# --- kernels (Figs. 7, 8) --------------------------------------------------------------------------

def kernel_times(data: dict, k: int = K_FIG) -> tuple[dict, str]:
    """(B, S) -> per-layer ms of each kernel at budget k; Quest's selection is timed only at the
    largest context, elsewhere scaled by the page count (est=True: a lower bound)."""
    d = data[KERNELS]
    rows = d["rows"]
    quest = {(r["B"], r["S"]): r for r in rows if r["op"] == "quest"}
    sparse = {(r["op"], r["B"], r["S"]): r["ms"] for r in rows
              if r["op"] in ("tokens", "pages16") and r.get("budget") == k and r.get("sets") == "Hq"}
    out = {}
    for r in rows:
        if r["op"] != "full":
            continue
        B, S = r["B"], r["S"]
        q = quest.get((B, S))
        est = q is None
        if est:
            S0 = max((s for b, s in quest if b == B), default=None)
            if S0 is None:
                continue
            q = {key: v * S / S0 for key, v in quest[(B, S0)].items() if key.startswith("ms_")}
        out[(B, S)] = {"full": r["ms_ours"], "sdpa": r["ms_sdpa"], "selection": r["ms_selection"],
                       "selection_topk": r["ms_selection_topk"], "tokens": sparse.get(("tokens", B, S)),
                       "pages": sparse.get(("pages16", B, S)), "q_scores": q["ms_scores"],
                       "q_topk": q["ms_scores_topk"] - q["ms_scores"], "q_update": q["ms_update1"], "est": est}
    return out, d["meta"]["device"]


def attention_totals(kt: dict, layers: int) -> dict:
    """Per-step attention ms of a `layers`-layer model (the composition in FIG7_NOTES)."""
    full, pages, tok = kt["full"], kt["pages"], kt["tokens"]
    quest = None if pages is None else 2 * full + (layers - 2) * (kt["q_scores"] + kt["q_topk"] + pages)
    td = None if tok is None else 2 * full + 2 * kt["selection_topk"] + (layers - 4) * tok
    return {"Full": layers * full, "Quest": quest, "TidalDecode": td}


def _maxima(vals: list) -> float | None:
    vals = [v for v in vals if v is not None]
    return max(vals) if vals else None


def fig7_frame(data: dict) -> tuple[pd.DataFrame, str]:
    kt, device = kernel_times(data)
    rows, best = [], {}
    for B in sorted({b for b, _ in kt}):
        for L in (32, 64):
            block = f"{L} layers, B={B}"
            for S in sorted(s for b, s in kt if b == B):
                c, tot, est = ctx(S), attention_totals(kt[(B, S)], L), kt[(B, S)]["est"]
                for m, v in tot.items():
                    rows.append(_row(block, f"{m} (ms)", c, v, est=est and m == "Quest"))
                sp = {"Full/Quest": _div(tot["Full"], tot["Quest"]), "Full/TidalDecode": _div(tot["Full"], tot["TidalDecode"]),
                      "Quest/TidalDecode": _div(tot["Quest"], tot["TidalDecode"])}
                for name, v in sp.items():
                    rows.append(_row(block, f"speedup {name}", c, v, unit="x", est=est and "Quest" in name))
                    if c in CONTEXTS:
                        best.setdefault((B, name), []).append(v)
    claims = NUMBERS["fig7"]
    for B in sorted({b for b, _ in best}):
        for name, p in (("Full/TidalDecode", claims["max_speedup_vs_full"]),
                        ("Quest/TidalDecode", claims["max_speedup_vs_quest"])):
            rows.append(_row("maxima over 10K/32K/100K and 32/64 layers (the paper states only these)",
                             f"max speedup {name}", f"B={B}", _maxima(best[(B, name)]),
                             p if B == 1 else None, "x", est="Quest" in name))
    return pd.DataFrame(rows), device


FIG8_PARTS = [("full", "Full attention (ours)"), ("sdpa", "Full attention (torch SDPA flash, reference)"),
              ("selection", "TD token selection attention"), ("selection_topk", "TD token selection + top-k"),
              ("tokens", f"TD sparse attention (K={K_FIG} tokens)"), ("q_scores", "Quest page scores"),
              ("q_topk", "Quest page top-k"), ("pages", f"Quest sparse attention (K={K_FIG}, 16-token pages)"),
              ("quest", "Quest attention total (scores + top-k + pages)")]


def fig8_frame(data: dict) -> tuple[pd.DataFrame, str]:
    kt, device = kernel_times(data)
    rows, best = [], {}
    for B in sorted({b for b, _ in kt}):
        block = f"K={K_FIG}, B={B}: per-layer kernel ms, and relative to Full"
        for S in sorted(s for b, s in kt if b == B):
            t, c = dict(kt[(B, S)]), ctx(S)
            t["quest"] = None if t["pages"] is None else t["q_scores"] + t["q_topk"] + t["pages"]
            for key, name in FIG8_PARTS:
                rows.append(_row(block, name, c, t[key], est=t["est"] and key.startswith("q")))
            for key, name in (("selection_topk", "TD selection + top-k / Full"), ("tokens", "TD sparse / Full"),
                              ("quest", "Quest total / Full")):
                rows.append(_row(block, name, c, _div(t[key], t["full"]), unit="x",
                                 est=t["est"] and key == "quest"))
            v = _div(t["quest"], t["tokens"])
            rows.append(_row(block, "speedup Quest total / TD sparse", c, v, unit="x", est=t["est"]))
            if c in CONTEXTS:
                best.setdefault(B, []).append(v)
    for B, vals in best.items():
        rows.append(_row("maxima over 10K/32K/100K (the paper states only this)", "max Quest / TD sparse",
                         f"B={B}", _maxima(vals), NUMBERS["fig8"]["max_sparse_speedup_vs_quest"] if B == 1 else None,
                         "x", est=True))
    return pd.DataFrame(rows), device


# --- markdown ----------------------------------------------------------------------------------------

def _cell(v, unit: str) -> str:
    if v is None or pd.isna(v):
        return render.DASH
    return f"{v:.2f}x" if unit == "x" else f"{v:.3f}" if v < 1 else f"{v:.2f}"


def md_tables(df: pd.DataFrame, row_title: str, col_name=lambda c: f"K={c}" if isinstance(c, int) else str(c)) -> str:
    out = []
    for block in df["block"].unique():
        b = df[df["block"] == block]
        cols = list(dict.fromkeys(b["col"]))
        out += [f"\n### {block}\n", "| " + " | ".join([row_title] + [col_name(c) for c in cols]) + " |",
                "|" + "---|" * (len(cols) + 1)]
        for r in b["row"].unique():
            sub = b[b["row"] == r].set_index("col")
            cells = []
            for c in cols:
                if c not in sub.index:
                    cells.append("")
                    continue
                x = sub.loc[c]
                text = _cell(x["ours"], x["unit"]) + ("~" if x["est"] and not pd.isna(x["ours"]) else "")
                if x["paper"] is not None and not pd.isna(x["paper"]):
                    text += f" ({_cell(x['paper'], x['unit'])})"
                cells.append(text)
            out.append("| " + " | ".join([str(r)] + cells) + " |")
    return "\n".join(out) + "\n"


def _header(item, impl, device: str, files: list[str], what: str) -> str:
    return (f"# {item.key}: {impl.title}\n\n"
            f"Ours: {impl.setup['paper']} Device: **{device}** (H100). From {', '.join(files)} "
            f"(results/bench/; rewrite with `python -m analysis run {item.key}` for the command).\n"
            f"Paper: {impl.paper_setup} Device: **{PAPER_DEVICE}**.\n\n"
            f"Cells read `ours (paper)`; {what}; {render.DASH} = not measured. "
            + NOT_COMPARABLE.format(ours=device) + "\n")


def _write(item, df: pd.DataFrame, md: str, fig, device: str, out_root: Path) -> list[Path]:
    df = df.assign(device_ours=device, device_paper=PAPER_DEVICE)
    return render.write(out_root, item.key, md, df, fig)


# the renderers and figures live in tidal_latency_plots (kept apart to stay short)
from analysis import tidal_latency_plots as plots

TPOT_SETUP = ("bench/tpot.py: end-to-end decode ms/token (TPOT) of our engine, random weights, bf16, "
              "CUDA graphs, batch 1, 32 steps, at 10240/32768/102400 tokens (Llama-2-7B shape: 10240/32768 "
              "only); TidalDecode re-selects at layer 13, Quest 16-token pages, both keep layers 0-1 dense.")
KERNEL_SETUP = ("bench/kernel_ops.py: per-layer kernel times (CUDA-graph medians) at Llama-3-8B decode "
                "shapes (Hq 32, Hkv 8, D 128, bf16), B=1 and 8, 10K/32K/100K/128K.")
IMPLEMENTATIONS = {
    "tidal.fig6": Impl(
        title="End-to-end decode latency, Full vs Quest vs TidalDecode (TidalDecode Fig. 6)",
        sweeps={}, label=lambda v: ("", "", ""), render=None, metric="tpot_ms",
        setup={"paper": TPOT_SETUP}, paper_setup="Llama-2-7B, 10K/32K/100K (Fig. 6; values from Tables 5-6).",
        bench=Bench([TPOT["llama2_7b"], TPOT["llama3"]], TPOT_CMD, lambda *a: plots.render_fig6(*a))),
    "tidal.table5-6": Impl(
        title="End-to-end latency, K=32..4096 x 10K/32K/100K (TidalDecode Tables 5-6)",
        sweeps={}, label=lambda v: ("", "", ""), render=None, metric="tpot_ms",
        setup={"paper": TPOT_SETUP}, paper_setup="Llama-2-7B, 10K/32K/100K, K=32..4096 (Tables 5-6).",
        bench=Bench([TPOT["llama2_7b"], TPOT["llama3"]], TPOT_CMD, lambda *a: plots.render_table56(*a))),
    "tidal.fig7": Impl(
        title="Attention latency of 32- and 64-layer models, Full vs Quest vs TidalDecode (TidalDecode Fig. 7)",
        sweeps={}, label=lambda v: ("", "", ""), render=None, metric="ms",
        setup={"paper": KERNEL_SETUP}, paper_setup="LLaMA with 32 and 64 layers, 10K/32K/100K, K=512.",
        bench=Bench([KERNELS], KERNELS_CMD, lambda *a: plots.render_fig7(*a))),
    "tidal.fig8": Impl(
        title="Kernel breakdown at K=512: full, selection, sparse, Quest (TidalDecode Fig. 8)",
        sweeps={}, label=lambda v: ("", "", ""), render=None, metric="ms",
        setup={"paper": KERNEL_SETUP}, paper_setup="attention kernels at 10K/32K/100K, K=512.",
        bench=Bench([KERNELS], KERNELS_CMD, lambda *a: plots.render_fig8(*a))),
}
