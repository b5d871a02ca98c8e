"""Putting rendered files in place: renderers write into a scratch directory, and only then are the
files copied over the committed ones, after a check that the new table does not hold fewer results
than the one it replaces (fewer filled cells or fewer samples), unless the caller says --replace.
A file whose bytes did not change is left untouched."""
from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import pandas as pd


class FewerResults(Exception):
    """A render would replace a table with one holding fewer results (one line, exit code 2)."""


def _counts(csv: Path) -> tuple[int, int | None]:
    """(filled cells, samples over all cells or None when the table has no n column)."""
    df = pd.read_csv(csv)
    filled = int(df["ours"].notna().sum()) if "ours" in df else 0
    n = int(df["n"].fillna(0).sum()) if "n" in df else None
    return filled, n


def check(key: str, new_csv: Path, old_csv: Path) -> None:
    if not old_csv.exists() or not new_csv.exists():
        return
    (nf, nn), (of, on) = _counts(new_csv), _counts(old_csv)
    if nf < of or (nn is not None and on is not None and nn < on):
        samples = f", {on} samples -> {nn}" if nn is not None and on is not None else ""
        raise FewerResults(f"{key}: the new table holds fewer results than {old_csv} ({of} filled cells -> "
                           f"{nf}{samples}); nothing written. Pass --replace to overwrite it anyway")


def render_into(out_root: Path, key: str, render: Callable[[Path], list[Path]],
                replace: bool = False) -> list[tuple[Path, str]]:
    """Run `render(scratch_root)`, then install its files under out_root: [(path, wrote|unchanged)]."""
    out_root = Path(out_root)
    with tempfile.TemporaryDirectory(prefix="analysis-render-") as tmp:
        scratch = Path(tmp)
        paths = render(scratch)
        if not replace:
            check(key, scratch / "tables" / f"{key}.csv", out_root / "tables" / f"{key}.csv")
        done = []
        for p in paths:
            dest = out_root / p.relative_to(scratch)
            if dest.exists() and dest.read_bytes() == p.read_bytes():
                done.append((dest, "unchanged"))
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(p, dest)
            done.append((dest, "wrote"))
    return done
