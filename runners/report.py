"""The short results table printed at the end of a run."""
from __future__ import annotations


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def print_table(summary: dict) -> None:
    m = summary.get("metrics", {})
    scalars = {k: v for k, v in m.items() if not isinstance(v, dict)}
    lines = [f"\n{summary['method']} | {summary['task']} | {summary['model']}  ({summary['n_samples']} samples)",
             "  " + "  ".join(f"{k}={_fmt(v)}" for k, v in scalars.items())]
    for key, groups in m.items():
        if not isinstance(groups, dict):
            continue
        metric_names = sorted({name for g in groups.values() if isinstance(g, dict) for name in g})
        if not metric_names:
            continue
        header = f"  {key[3:] if key.startswith('by_') else key:>10} | " + " | ".join(f"{n:>10}" for n in metric_names)
        lines.append(header)
        lines.append("  " + "-" * (len(header) - 2))
        for idx, g in groups.items():
            lines.append(f"  {idx:>10} | " + " | ".join(f"{_fmt(g.get(n, '')):>10}" for n in metric_names))
    t = summary.get("timings", {})
    if t:
        lines.append("  timings: " + "  ".join(f"{k}={_fmt(v)}" for k, v in t.items()))
    lines.append(f"  results: {summary.get('results_dir')}")
    print("\n".join(lines))
