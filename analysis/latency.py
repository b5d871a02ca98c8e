"""Shared pieces of the latency items' tables (any paper): cells `ours (paper)` in ms or x, with
estimated cells marked by what they bound, a header naming both devices and the provenance of
every benchmark file, and the writer (CSV columns say which file each number came from)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis import provenance, render

BOUND = {"lower": "≥", "upper": "≤"}
LEGEND = ("≥ = a lower bound, ≤ = an upper bound: an estimate, not a measurement (the notes say how it "
          "was made and why it bounds)")


def row(block, row_, col, ours, paper=None, unit="ms", bound=None, file="") -> dict:
    """One cell of a latency frame; `bound` = lower | upper for an estimate, None if measured."""
    return {"block": block, "row": row_, "col": col, "ours": ours, "paper": paper, "unit": unit,
            "bound": bound, "file": file}


COLUMNS = ["block", "row", "col", "ours", "paper", "unit", "bound", "file"]


def frame(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=COLUMNS)


def div(a, b):
    return None if a is None or b is None else a / b


def cell(v, unit: str) -> str:
    if v is None or pd.isna(v):
        return render.DASH
    if unit == "%":
        return f"{v:.1f}%"
    return f"{v:.2f}x" if unit == "x" else f"{v:.3f}" if v < 1 else f"{v:.2f}"


def md_tables(df: pd.DataFrame, row_title: str,
              col_name=lambda c: f"K={c}" if isinstance(c, int) else str(c)) -> str:
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
                text = cell(x["ours"], x["unit"])
                if x["bound"] in BOUND and not pd.isna(x["ours"]):
                    text = BOUND[x["bound"]] + text
                if x["paper"] is not None and not pd.isna(x["paper"]):
                    text += f" ({cell(x['paper'], x['unit'])})"
                cells.append(text)
            out.append("| " + " | ".join([str(r)] + cells) + " |")
    return "\n".join(out) + "\n"


def devices(sources) -> str:
    return ", ".join(sorted({s.device for s in sources if s.data is not None})) or "not measured"


def header(item, impl, sources, what: str, paper_device: str) -> str:
    ours = devices(sources)
    return (f"# {item.key}: {impl.title}\n\n"
            f"Ours: {impl.setup['paper']} Device: **{ours}**. From {', '.join(s.name for s in sources)} "
            f"(results/bench/).\n"
            f"Paper: {impl.paper_setup} Device: **{paper_device}**.\n\n"
            f"Cells read `ours (paper)`; {what}; {render.DASH} = not measured; {LEGEND}. Absolute times are not "
            f"comparable across GPUs (ours: {ours}; paper: {paper_device}) nor across engines; compare the "
            f"speedups (Full / method), shown beside the paper's.\n" + provenance.markdown(sources))


def write(item, df: pd.DataFrame, md: str, fig, sources, paper_device: str, out_root: Path) -> list[Path]:
    state = {s.name: s.short() for s in sources}
    df = df.assign(provenance=df["file"].map(lambda f: state.get(f, "")), device_ours=devices(sources),
                   device_paper=paper_device)
    return render.write(out_root, item.key, md, df, fig)
