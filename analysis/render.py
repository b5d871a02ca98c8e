"""Renderers: one long frame of cells (ours) outer-joined with the paper's numbers, written as
results/tables/<key>.md and .csv and results/figures/<key>.png.

Markdown cells read `ours [95% interval] (paper)`; `—` is a cell with no result yet; a row whose
method does not exist yet is marked "not implemented" and keeps the paper's numbers. The CSV is the
long frame (mean, interval, n, status, run id, commit and device of every cell).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from analysis.runs import Cell, metric_stats

DASH = "—"
CSV_COLUMNS = ["block", "row", "col", "ours", "ci_lo", "ci_hi", "ci", "n", "expected", "status", "run", "commit",
               "device", "overrides", "order"]


def frame(cells: list[Cell], impl, profile: str) -> pd.DataFrame:
    """Long frame, one line per (block, row, col): ours (sweep order) then what only the paper has.
    Each of our cells carries its mean, 95% interval, n, status and the run id and commit behind it."""
    rows = []
    for i, c in enumerate(cells):
        st = None
        if c.run is not None:
            st = impl.aggregate(c.run) if impl.aggregate else metric_stats(c.run, impl.metric, impl.scale)
        rows.append({"block": c.block, "row": c.row, "col": c.col, **(st or {"n": 0}),
                     "expected": c.expected, "status": c.status, "run": c.run.run_id if c.run else "",
                     "commit": (c.run.info.get("commit") or "") if c.run else "",
                     "device": " ".join(str(c.run.info.get(k)) for k in ("device", "dtype")) if c.run else "",
                     "overrides": " ".join(c.overrides), "order": i})
    ours = pd.DataFrame(rows, columns=CSV_COLUMNS)
    # several cells may share a place (e.g. a budget-free reference row): keep the fullest one
    ours = (ours.sort_values("n", ascending=False, kind="stable")
            .drop_duplicates(["block", "row", "col"]).sort_values("order"))
    paper = pd.DataFrame(impl.paper, columns=["block", "row", "col", "paper"])
    paper["porder"] = range(len(paper))
    df = ours.merge(paper, on=["block", "row", "col"], how="outer", sort=False)
    # first placement of each (block, row) decides where the whole row goes
    df["order"] = df["order"].fillna(len(cells) + df["porder"])
    df["order"] = df.groupby(["block", "row"])["order"].transform("min") * 1e6 + df["order"]
    df = df.sort_values("order", kind="stable").drop(columns=["order", "porder"]).reset_index(drop=True)
    df["status"] = df["status"].fillna("paper only")
    df["n"] = df["n"].fillna(0).astype(int)
    df.insert(0, "profile", profile)
    df.attrs["runs"] = RunMap({c.run.run_id: c.run for c in cells if c.run is not None})  # per-sample rows
    return df


class RunMap(dict):
    """The runs behind a frame (run id -> run, rows loaded), for renderers that read per-sample rows.
    pandas deep-copies `attrs` into the result of every operation: a plain dict of 145 runs made one
    render of tidal.table7-12 take 5 minutes. This one is passed on by reference (it is never mutated)."""

    def __deepcopy__(self, memo):
        return self


def _fmt(v: Any) -> str:
    return DASH if v is None or (isinstance(v, float) and pd.isna(v)) else f"{v:.0f}"


def _ours(x: pd.Series, row_n: int) -> str:
    """`ours* [lo–hi] n=k`: * = partial, the interval when finite, n when it is not the row's."""
    text = _fmt(x["ours"]) + ("*" if x["status"] == "partial" else "")
    if not pd.isna(x["ours"]) and all(math.isfinite(float(x[k])) for k in ("ci_lo", "ci_hi")):
        text += f" [{x['ci_lo']:.0f}–{x['ci_hi']:.0f}]"
    if x["n"] and x["n"] != row_n:
        text += f" n={int(x['n'])}"
    return text


def markdown_tables(df: pd.DataFrame, col_name=lambda c: f"K={c}", row_title="Method / Budget",
                    paper_digits: int = 0) -> str:
    """One table per block: rows x columns, each cell `ours [95% interval] (paper)`, and n (the
    samples per cell of the row; a cell with another n states its own). `paper_digits`: decimals of
    the paper's number (papers that print one decimal keep it)."""
    out = []
    blocks = list(df["block"].unique())
    for block in blocks:
        b = df[df["block"] == block]
        cols = list(b["col"].unique())
        if all(_num(c)[0] == 0 for c in cols):      # budgets: ascending; names: first-seen order
            cols = sorted(cols, key=_num)
        rows = list(b["row"].unique())
        if len(blocks) > 1 or block:
            out.append(f"\n### {block}\n")
        else:
            out.append("")
        out.append("| " + " | ".join([row_title] + [col_name(c) for c in cols] + ["n"]) + " |")
        out.append("|" + "---|" * (len(cols) + 2))
        for r in rows:
            sub = b[b["row"] == r].set_index("col")
            status = set(sub["status"])
            label = f"{r} — not implemented" if status == {"not implemented"} else r
            ns = [int(x) for x in sub["n"] if x]
            row_n = max(set(ns), key=lambda k: (ns.count(k), k)) if ns else 0
            cells = []
            for c in cols:
                if c not in sub.index:
                    cells.append("")
                    continue
                x = sub.loc[c]
                text = _ours(x, row_n)
                if not pd.isna(x["paper"]):
                    text += f" ({x['paper']:.{paper_digits}f})"
                cells.append(text)
            out.append("| " + " | ".join([label] + cells + [str(row_n)]) + " |")
    return "\n".join(out) + "\n"


def _num(v):
    try:
        return (0, float(v))
    except (TypeError, ValueError):
        return (1, str(v))


def header(item, impl, profile: str, df: pd.DataFrame, what: str = "") -> str:
    """The table's head: setups, how to read a cell, cells done, runs rendered from. `what`: what a cell
    holds when it is not a percentage (e.g. "token-weighted perplexity, 95% interval over the books")."""
    done = int((df["status"] == "done").sum())
    todo = int(df["status"].isin(["missing", "partial"]).sum())
    ni = int((df["status"] == "not implemented").sum())
    how = sorted(set(df["ci"].dropna()))
    ci = {"wilson": "95% Wilson score interval", "normal": "95% normal interval (mean +- 1.96 sd/sqrt(n))"}
    read = (f": {what}" if what else f", {impl.metric} in %: ours = mean over the cell's n samples, [lo–hi] = its "
                                     f"{' or '.join(ci[h] for h in how) or '95% interval'}")
    lines = [f"# {item.key}: {impl.title}", "",
             f"Profile `{profile}`. Ours: {impl.setup.get(profile, '')}",
             f"Paper: {impl.paper_setup}",
             "", (f"Cells read `ours [lo–hi] (paper)`{read}; {DASH} = no result yet; "
                  f"* = partial (fewer samples than the cell needs, still running or interrupted); n = samples "
                  f"per cell (a cell with another n than its row says so). {done} cells done, {todo} missing or "
                  f"partial, {ni} not implemented.")]
    runs = df[df["run"].fillna("") != ""]
    if len(runs):
        commits = ", ".join(sorted(set(runs["commit"].fillna("?").replace("", "?"))))
        devices = ", ".join(sorted(set(runs["device"].fillna("?"))))
        lines.append(f"Rendered from the committed compact rows of {runs['run'].nunique()} runs (results/rows/; "
                     f"run ids in the CSV) at commit(s) {commits}; device and dtype: {devices}.")
    if todo:
        lines.append(f"Fill the missing cells: `make {item.target()} PROFILE={profile}`.")
    return "\n".join(lines) + "\n"


def write(out_root: Path, key: str, md: str, df: pd.DataFrame, fig) -> list[Path]:
    tables, figures = out_root / "tables", out_root / "figures"
    tables.mkdir(parents=True, exist_ok=True)
    figures.mkdir(parents=True, exist_ok=True)
    paths = [tables / f"{key}.md", tables / f"{key}.csv", figures / f"{key}.png"]
    paths[0].write_text(md)
    df.to_csv(paths[1], index=False)
    # no "Software: matplotlib x.y" stamp: the bytes then depend on the figure, not the version
    fig.savefig(paths[2], dpi=120, bbox_inches="tight", metadata={"Software": None})
    import matplotlib.pyplot as plt

    plt.close(fig)
    return paths


def _yerr(s: pd.DataFrame) -> list:
    """Error bars from each cell's interval (none where the interval is unknown or unbounded)."""
    lo = (s["ours"] - s["ci_lo"]).replace([math.inf, -math.inf], math.nan).fillna(0).clip(lower=0)
    hi = (s["ci_hi"] - s["ours"]).replace([math.inf, -math.inf], math.nan).fillna(0).clip(lower=0)
    return [lo.to_numpy(float), hi.to_numpy(float)]


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# --- item renderers --------------------------------------------------------------------------------

def budget_table(item, impl, df: pd.DataFrame, profile: str, out_root: Path, notes: str = "") -> list[Path]:
    """Accuracy vs budget K, one line per method: table + line plot (ours solid, paper dashed)."""
    md = header(item, impl, profile, df) + markdown_tables(df) + notes
    plt = _plt()
    blocks = list(df["block"].unique())
    fig, axes = plt.subplots(1, len(blocks), figsize=(4.2 * len(blocks), 3.4), squeeze=False)
    for ax, block in zip(axes[0], blocks):
        b = df[df["block"] == block]
        for i, r in enumerate(b["row"].unique()):
            s = b[b["row"] == r].assign(k=lambda x: pd.to_numeric(x["col"], errors="coerce")).sort_values("k")
            color = f"C{i % 10}"
            if s["ours"].notna().any():     # with its 95% interval as error bars
                ax.errorbar(s["k"], s["ours"], yerr=_yerr(s), fmt="o-", color=color, capsize=2, label=f"{r} (ours)")
            if s["paper"].notna().any():
                ax.plot(s["k"], s["paper"], "x--", color=color, alpha=0.6, label=f"{r} (paper)")
        ax.set_xscale("log", base=2)
        ax.set_ylim(-3, 103)
        ax.set_title(block or item.key, fontsize=9)
        ax.set_xlabel("token budget K")
        ax.set_ylabel("accuracy (%)")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=6, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.suptitle(f"{item.key} ({profile}): solid = ours (bars: 95% interval), dashed = paper", fontsize=9)
    return write(out_root, item.key, md, df, fig)


def layer_heatmaps(item, impl, df: pd.DataFrame, profile: str, out_root: Path, notes: str = "") -> list[Path]:
    """Re-selection layer x budget: one md table per model, heatmaps ours | paper per model."""
    md = header(item, impl, profile, df) + markdown_tables(df, row_title="RL / K") + notes
    plt = _plt()
    blocks = list(df["block"].unique())
    fig, axes = plt.subplots(len(blocks), 2, figsize=(8, 4.2 * len(blocks) + 0.6), squeeze=False)
    for (ax_ours, ax_paper), block in zip(axes, blocks):
        b = df[(df["block"] == block) & df["row"].str.startswith("TD+L")]
        for ax, col, who in ((ax_ours, "ours", "ours"), (ax_paper, "paper", "paper")):
            grid = b.pivot_table(index="row", columns="col", values=col, aggfunc="first")
            if grid.empty or grid.isna().all().all():
                ax.set_axis_off()
                ax.set_title(f"{block}: " + ("no results yet" if who == "ours" else "not in the paper"), fontsize=8)
                continue
            grid = grid.reindex(sorted(grid.index, key=lambda r: int(r[4:])))
            grid = grid[sorted(grid.columns, key=_num)]
            im = ax.imshow(grid.values.astype(float), aspect="auto", cmap="viridis", vmin=0, vmax=100)
            ax.set_yticks(range(len(grid.index)), grid.index, fontsize=5)
            ax.set_xticks(range(len(grid.columns)), [str(c) for c in grid.columns], fontsize=6)
            ax.set_xlabel("K", fontsize=7)
            ax.set_title(f"{block}: {who}", fontsize=8)
            fig.colorbar(im, ax=ax, fraction=0.05)
    fig.suptitle(f"{item.key} ({profile}): NIAH accuracy (%) by re-selection layer and budget", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.4 / (4.2 * len(blocks) + 0.6)))
    return write(out_root, item.key, md, df, fig)


def layer_lines(item, impl, df: pd.DataFrame, profile: str, out_root: Path, budget: int,
                notes: str = "") -> list[Path]:
    """Accuracy vs re-selection layer at one budget, one panel per model (Fig. 9)."""
    df = df[df["col"].apply(lambda c: _num(c) == _num(budget))]
    md = (header(item, impl, profile, df)
          + markdown_tables(df.assign(col=df["block"], block=""), col_name=str, row_title="RL") + notes)
    plt = _plt()
    blocks = list(df["block"].unique())
    fig, axes = plt.subplots(1, len(blocks), figsize=(4 * len(blocks), 3.2), squeeze=False)
    for ax, block in zip(axes[0], blocks):
        b = df[(df["block"] == block) & df["row"].str.startswith("TD+L")].copy()
        b["layer"] = b["row"].str[4:].astype(int)
        b = b.sort_values("layer")
        if b["ours"].notna().any():
            ax.errorbar(b["layer"], b["ours"], yerr=_yerr(b), fmt="o-", capsize=2, label="ours (95% interval)")
        if b["paper"].notna().any():
            ax.plot(b["layer"], b["paper"], "x--", alpha=0.7, label="paper")
        ax.set_ylim(-3, 103)
        ax.set_title(f"{block}, K={budget}", fontsize=9)
        ax.set_xlabel("re-selection layer")
        ax.set_ylabel("accuracy (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return write(out_root, item.key, md, df, fig)
