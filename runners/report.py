"""The short results table printed at the end of a run."""
from __future__ import annotations

WIDE = 6  # more metric columns than this: print one line per (group, metric) instead


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}/"))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _group_lines(key: str, groups: dict) -> list[str]:
    rows = {str(idx): _flatten(g) for idx, g in groups.items() if isinstance(g, dict)}
    names = list(dict.fromkeys(n for r in rows.values() for n in r))
    if not names:
        return []
    label = key[3:] if key.startswith("by_") else key
    if len(names) > WIDE:
        lines = [f"  {label:>10} | metric"]
        for idx, r in rows.items():
            lines += [f"  {idx:>10} | {n} = {_fmt(v)}" for n, v in r.items()]
        return lines
    header = f"  {label:>10} | " + " | ".join(f"{n:>10}" for n in names)
    lines = [header, "  " + "-" * (len(header) - 2)]
    for idx, r in rows.items():
        lines.append(f"  {idx:>10} | " + " | ".join(f"{_fmt(r.get(n, '')):>10}" for n in names))
    return lines


def print_table(summary: dict) -> None:
    m = summary.get("metrics", {})
    scalars = {k: v for k, v in m.items() if not isinstance(v, dict)}
    failed = summary.get("n_failed") or 0
    count = f"{summary['n_samples']} samples" + (f", {failed} failed" if failed else "")
    lines = [f"\n{summary['method']} | {summary['task']} | {summary['model']}  ({count})",
             "  " + "  ".join(f"{k}={_fmt(v)}" for k, v in scalars.items())]
    for key, groups in m.items():
        if isinstance(groups, dict):
            lines += _group_lines(key, groups)
    a = summary.get("attended")
    if a:
        lines.append(f"  attended: {a['mean_fraction']:.1%} of the tokens seen (mean {a['mean_attended']:.0f} of "
                     f"{a['mean_tokens']:.0f}, last decode step, {a['n']} samples)")
    t = summary.get("timings", {})
    if t:
        lines.append("  timings: " + "  ".join(f"{k}={_fmt(v)}" for k, v in t.items()))
    if failed:
        first = (summary.get("failed") or [{}])[0]
        lines.append(f"  failed: {failed} (first: {first.get('id')}: {first.get('error')}); metrics exclude them; "
                     f"rerun the same command to retry them")
    lines.append(f"  results: {summary.get('results_dir')}")
    print("\n".join(lines))
