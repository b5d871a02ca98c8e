"""Local data files, compressed or not: the repository's `data/` folder keeps every file it ships
xz-compressed (`FILE.xz`, to stay a few MB), and a loader given `FILE` reads `FILE.xz` (or `FILE.gz`)
when `FILE` itself is absent. Configs therefore name the plain file (`data/math500` with
`test.jsonl` inside, `data/pg19_books/pg19_books.jsonl`), a decompressed copy is read the same way,
and what a loader reads does not depend on how the file is stored.

A relative path is taken from the working directory first, then from the repository root (where
`data/` is), so `data/...` works from any directory. Nothing here reaches outside the path it is given.
"""
from __future__ import annotations

import gzip
import lzma
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data"                       # the data the repository ships (data/README.md)
COMPRESSED = {".xz": lzma.open, ".gz": gzip.open}


def stored(path: Path) -> Path | None:
    """The file on disk that holds `path`: the path itself, or `path.xz` / `path.gz`; None if none."""
    if path.is_file():
        return path
    for suffix in COMPRESSED:
        z = path.with_name(path.name + suffix)
        if z.is_file():
            return z
    return None


def resolve(path) -> Path:
    """`path` (str or Path, ~ expanded); a relative one that is missing from the working directory (as
    a file, a compressed file or a folder) is taken from the repository root when it is there."""
    p = Path(str(path)).expanduser()
    if p.is_absolute() or p.exists() or stored(p):
        return p
    rooted = ROOT / p
    return rooted if rooted.exists() or stored(rooted) else p


def is_file(path) -> bool:
    """`path` (resolved) is a file, stored plain or compressed."""
    return stored(resolve(path)) is not None


def plain_name(path) -> str:
    """The file name without a compression suffix (`pg19_books.jsonl.xz` -> `pg19_books.jsonl`)."""
    name = Path(str(path)).name
    for suffix in COMPRESSED:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def open_text(path) -> IO[str]:
    """Open `path` (resolved; plain, or its .xz/.gz copy) for reading UTF-8 text."""
    p = resolve(path)
    f = stored(p)
    if f is None:
        raise FileNotFoundError(f"{p} (nor {p.name}.xz / .gz)")
    opener = COMPRESSED.get(f.suffix)
    return opener(f, "rt", encoding="utf-8") if opener else open(f, encoding="utf-8")


def read_text(path) -> str:
    with open_text(path) as f:
        return f.read()
