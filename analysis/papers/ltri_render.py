"""Renderers of the Ltri-LLM NIAH items (analysis/papers/ltri.py). Per-sample facts (the depth of each
needle, the recall InfLLM recorded per layer and step, the index vectors per block) come from the rows
of the runs behind the frame (df.attrs["runs"]: the committed compact rows keep them)."""
from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd

from analysis import papers_data, render


def _rows(df: pd.DataFrame, run_id: str) -> list[dict]:
    run = df.attrs.get("runs", {}).get(run_id)
    return run.rows() if run is not None else []


def _cells(df: pd.DataFrame):
    """(row label, col, rows of its run) for every cell with a run."""
    for _, x in df[df["run"].fillna("") != ""].iterrows():
        yield x["row"], x["col"], _rows(df, x["run"])


def _fact_lines(key: str) -> str:
    facts = papers_data.facts(key)
    return "".join(f"- paper: {f['name']} = {f['value']} (\"{f['quote']}\")\n" for f in facts)


# --- Figs. 1-2 ---------------------------------------------------------------------------------------
def _recall_grid(samples: list[dict]) -> np.ndarray:
    """layers x steps mean recall over the samples (a step a sample did not reach is left out)."""
    layers = sorted({int(k) for s in samples for k in s})
    steps = max((len(v) for s in samples for v in s.values()), default=0)
    grid = np.full((len(layers), steps), np.nan)
    for i, layer in enumerate(layers):
        for t in range(steps):
            vals = [s[str(layer)][t] for s in samples if str(layer) in s and t < len(s[str(layer)])]
            grid[i, t] = np.mean(vals) if vals else np.nan
    return grid


def recall_figure(item, impl, df, profile, out):
    groups = {"successful": [], "failed": []}
    for _, _, rows in _cells(df):
        for r in rows:
            rec = (r.get("attended") or {}).get("needle_recall")
            if rec and "accuracy" in (r.get("metrics") or {}):
                groups["successful" if r["metrics"]["accuracy"] >= 1 else "failed"].append(rec)
    md = render.header(item, impl, profile, df) + render.markdown_tables(df, col_name=lambda c: f"{c} tokens",
                                                                         row_title="accuracy %")
    lines = ["\n### Needle recall per layer (mean over decoding steps and samples)\n",
             "| layer | " + " | ".join(f"{g} (n={len(v)})" for g, v in groups.items()) + " |", "|---|---|---|"]
    grids = {g: _recall_grid(v) for g, v in groups.items()}
    n_layers = max((g.shape[0] for g in grids.values()), default=0)
    for layer in range(n_layers):
        cells = [f"{np.nanmean(g[layer]):.2f}" if g.shape[0] > layer and np.isfinite(g[layer]).any() else render.DASH
                 for g in grids.values()]
        lines.append(f"| {layer} | " + " | ".join(cells) + " |")
    md += "\n".join(lines) + "\n\nPaper (plot only, no printed numbers):\n" + _fact_lines(item.key)
    plt = render._plt()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), squeeze=False)
    for ax, (g, grid) in zip(axes[0], grids.items()):
        if grid.size == 0:
            ax.set_axis_off()
            ax.set_title(f"{g}: no samples", fontsize=9)
            continue
        im = ax.imshow(grid, aspect="auto", cmap="viridis", vmin=0, vmax=1, origin="lower")
        ax.set_title(f"{g} (n={len(groups[g])})", fontsize=9)
        ax.set_xlabel("decoding step")
        ax.set_ylabel("layer")
        fig.colorbar(im, ax=ax, fraction=0.05)
    fig.suptitle(f"{item.key} ({profile}): InfLLM needle recall by layer and step", fontsize=9)
    return render.write(out, item.key, md, df, fig)


# --- Table 1 -----------------------------------------------------------------------------------------
def conversion_table(item, impl, df, profile, out):
    by = {}
    for row, col, rows in _cells(df):
        by[(row.split()[-1], col)] = {r["id"]: r["metrics"].get("accuracy") for r in rows if r.get("metrics")}
    lines = ["", "| length | #Failure (InfLLM) | #Converted (injection) | samples |", "|---|---|---|---|"]
    out_rows, total = [], [0, 0, 0]
    for col in sorted({c for _, c in by}, key=render._num):
        rec, inj = by.get(("record", col), {}), by.get(("inject", col), {})
        failed = [i for i, a in rec.items() if a is not None and a < 1]
        conv = [i for i in failed if (inj.get(i) or 0) >= 1] if inj else None
        total = [total[0] + len(failed), total[1] + len(conv or []), total[2] + len(rec)]
        lines.append(f"| {col} | {len(failed)} | {render.DASH if conv is None else len(conv)} | {len(rec)} |")
        out_rows += [{"block": "ours (niah)", "row": str(col), "col": "#Failure", "ours": len(failed)},
                     {"block": "ours (niah)", "row": str(col), "col": "#Converted",
                      "ours": None if conv is None else len(conv)}]
    lines.append(f"| all | {total[0]} | {total[1]} | {total[2]} |")
    paper = ["", "Paper (Llama-3-8B-Instruct-262K, its 8 needles, failures out of 1,225 tests per needle):", "",
             "| needle | #Failure | #Converted |", "|---|---|---|"]
    prows = papers_data.rows(item.key)
    for block in dict.fromkeys(r["block"] for r in prows):
        for r in dict.fromkeys(r["row"] for r in prows if r["block"] == block):
            v = {x["col"]: x["paper"] for x in prows if x["block"] == block and x["row"] == r}
            paper.append(f"| {r} ({block}) | {v.get('#Failure', '')} | {v.get('#Converted', '')} |")
    md = (render.header(item, impl, profile, df) + "\n".join(lines) + "\n" + "\n".join(paper) + "\n\n"
          + _fact_lines(item.key))
    frame = pd.DataFrame(out_rows + [{"block": "paper", "row": r["block"] + " " + r["row"], "col": r["col"],
                                      "paper": r["paper"]} for r in prows])
    plt = render._plt()
    fig, ax = plt.subplots(figsize=(5, 3))
    ours = frame[frame["block"] == "ours (niah)"].pivot(index="row", columns="col", values="ours")
    if not ours.empty:
        ours.astype(float).plot.bar(ax=ax)
    ax.set_title(f"{item.key} ({profile}): failures and conversions by length", fontsize=9)
    return render.write(out, item.key, md, frame.assign(profile=profile), fig)


# --- Fig. 8 ------------------------------------------------------------------------------------------
def _by_depth(rows: list[dict]) -> dict:
    acc: dict = {}
    for r in rows:
        d, a = (r.get("params") or {}).get("depth"), (r.get("metrics") or {}).get("accuracy")
        if d is not None and a is not None:
            acc.setdefault(float(d), []).append(a)
    return {d: 100 * sum(v) / len(v) for d, v in acc.items()}


def niah_grid(item, impl, df, profile, out):
    md = (render.header(item, impl, profile, df)
          + render.markdown_tables(df, col_name=lambda c: f"{c} tokens", row_title="method, needle")
          + "\nPaper: figure only (heatmaps); " + _fact_lines(item.key))
    grids: dict = {}
    for row, col, rows in _cells(df):
        for d, a in _by_depth(rows).items():
            grids.setdefault(row, {})[(col, d)] = a
    plt = render._plt()
    names = list(df["row"].unique())
    fig, axes = plt.subplots(1, max(1, len(names)), figsize=(3.6 * max(1, len(names)), 3.2), squeeze=False)
    for ax, name in zip(axes[0], names):
        g = grids.get(name, {})
        if not g:
            ax.set_axis_off()
            ax.set_title(f"{name}: no results", fontsize=8)
            continue
        cols = sorted({c for c, _ in g}, key=render._num)
        depths = sorted({d for _, d in g})
        m = np.array([[g.get((c, d), np.nan) for c in cols] for d in depths])
        ax.imshow(m, aspect="auto", cmap="RdYlGn", vmin=0, vmax=100, origin="lower")
        ax.set_xticks(range(len(cols)), [str(c) for c in cols], fontsize=6)
        ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths], fontsize=6)
        ax.set_xlabel("length")
        ax.set_ylabel("depth %")
        ax.set_title(name, fontsize=8)
    fig.suptitle(f"{item.key} ({profile}): NIAH accuracy (%) by length and depth", fontsize=9)
    return render.write(out, item.key, md, df, fig)


# --- Figs. 10-14 -------------------------------------------------------------------------------------
def ablations(item, impl, df, profile, out):
    md = (render.header(item, impl, profile, df)
          + render.markdown_tables(df, col_name=lambda c: "accuracy %", row_title="variant")
          + "\nFigs. 11-13 share the base run (Q=32, lambda 3, Omega row, P/RH/V on): Fig. 10's first row.\n")
    # Fig. 14 per (M, lambda): Fig. 12's rows name both; the base run (Fig. 10's first row) is lambda 3 at the
    # profile's M
    base_m = next((o.split("=")[1] for o in impl.sweeps[profile][0] if o.startswith("method.max_vectors=")), "?")
    per_lam: dict = {}
    for row, _, rows in _cells(df):
        m = re.fullmatch(r"lambda=([\d.]+), M=(\d+)", row)
        key = (base_m, 3.0) if row.startswith("P=on, RH, V=on") else ((m.group(2), float(m.group(1))) if m else None)
        if key is None:
            continue
        for r in rows:
            vpb = (r.get("attended") or {}).get("vectors_per_block") or {}
            for layer, v in vpb.items():
                per_lam.setdefault(key, {}).setdefault(int(layer), []).append(v)
    series = sorted(per_lam, key=lambda k: (int(k[0]) if k[0].isdigit() else 0, k[1]))
    lines = ["\n### Fig. 14: index vectors per block (mean over layers; per layer in the figure)\n",
             "| M (cap per block) | lambda | vectors / block |", "|---|---|---|"]
    for cap, lam in series:
        means = [np.mean(v) for v in per_lam[(cap, lam)].values()]
        lines.append(f"| {cap} | {lam:g} | {np.mean(means):.2f} |")
    md += "\n".join(lines) + "\n\nPaper (plots only):\n" + _fact_lines(item.key)
    plt = render._plt()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4), squeeze=False)
    ax = axes[0][0]
    acc = df[df["ours"].notna()]
    ax.barh([f"{b}: {r}" for b, r in zip(acc["block"], acc["row"])], acc["ours"], xerr=render._yerr(acc))
    ax.set_xlim(0, 100)
    ax.tick_params(labelsize=6)
    ax.set_xlabel("accuracy %")
    ax = axes[0][1]
    for cap, lam in series:
        layers = sorted(per_lam[(cap, lam)])
        ax.plot(layers, [np.mean(per_lam[(cap, lam)][x]) for x in layers], marker=".",
                linestyle=":" if cap == base_m else "-", label=f"M={cap}, lambda={lam:g}")
    ax.set_xlabel("layer")
    ax.set_ylabel("index vectors / block")
    if per_lam:
        ax.legend(fontsize=6)
    fig.suptitle(f"{item.key} ({profile}): ablations (left), Fig. 14 (right)", fontsize=9)
    fig.tight_layout()
    return render.write(out, item.key, md, df, fig)


