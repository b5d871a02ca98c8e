"""Provenance of the benchmark JSON a latency item renders from (results/bench/*.json).

Each file must come from exactly one command, which it records with the commit it ran at; the
catalogue declares that command (catalogue.BenchFile) and the code it measures. Loading a file
checks it against the declaration and says, in words the rendered table repeats, what is wrong:
missing, no command recorded, another command recorded, rows merged in by hand from other commands
(left out), no commit, or stale (the measured code changed after the recorded commit, by git; a pure move or rename of
it, or of definitions out of it behind an import, is not a change: analysis/renames.py).
"""
from __future__ import annotations

import json
import shlex
import subprocess
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from analysis.renames import Renames, canonical, has_code, moved_out, only_moved

ROOT = Path(__file__).resolve().parents[1]
# the bench scripts moved from runners/ to bench/ (commit 47602dc); older files record the old names
MODULE_ALIASES = {"runners.bench": "bench.engine", "runners.bench_tpot": "bench.tpot",
                  "runners.bench_kernels": "bench.kernel_ops"}


@dataclass
class Source:
    """One benchmark file as loaded: its rows (only those its own recorded command wrote) and what
    is wrong with it, if anything."""
    file: Any                        # catalogue.BenchFile
    path: Path
    data: dict | None = None
    rows: list[dict] = field(default_factory=list)
    device: str = ""
    commit: str | None = None
    command: str | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.file.name

    def rerun(self, bench_dir: str = "results/bench") -> str:
        return f"{self.file.command} --out {bench_dir}/{self.file.name}"

    def short(self) -> str:
        """One word per problem, for a CSV column: ok | missing | stale | hand-merged | ..."""
        return "; ".join(p.split(":")[0] for p in self.problems) or "ok"


def normalize(command: str) -> tuple:
    """A command's meaning, minus what does not change the numbers: the interpreter's name, where
    the JSON goes (--out), the bench scripts' old module paths, and the order of its options."""
    words = shlex.split(command)
    head, opts, cur = [], {}, None
    for i, w in enumerate(words):
        if i == 0 and w in ("python", "python3"):
            w = "python"
        elif i > 0 and words[i - 1] == "-m":
            w = MODULE_ALIASES.get(w, w)
        if w.startswith("--"):
            name, eq, value = w.partition("=")
            cur = name
            opts[cur] = [value] if eq else []
        elif cur is None:
            head.append(w)
        else:
            opts[cur].append(w)
    opts.pop("--out", None)
    return tuple(head), tuple(sorted((k, tuple(v)) for k, v in opts.items()))


def option_values(command: str, option: str) -> list[str] | None:
    """The values after `option` in a command (up to the next option), or None if absent."""
    words = shlex.split(command)
    if option not in words:
        return None
    vals = []
    for w in words[words.index(option) + 1:]:
        if w.startswith("--"):
            break
        vals.append(w)
    return vals


def _git(*args: str) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(["git", "-C", str(ROOT), *args], check=False, capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None


def _under(path: str, measures: tuple[str, ...]) -> bool:
    return any(path == m or path.startswith(m.rstrip("/") + "/") for m in measures)


def _blob(commit: str, path: str) -> str | None:
    out = _git("show", f"{commit}:{path}")
    return out.stdout if out is not None and out.returncode == 0 else None


def edited(commit: str, measures: tuple[str, ...]) -> bool | None:
    """Whether the code at the declared paths (their names at HEAD) was edited between `commit` and
    HEAD; a pure move or rename is not an edit (None: git could not tell).

    The whole tree's diff, renames paired by git; a file added or deleted under the paths is an edit;
    a renamed or modified one is an edit unless its text at `commit`, with every module this diff
    renames given its new name (analysis/renames.py: paths, dotted names, import lines), is its text at
    HEAD; a Python file's code is compared (its syntax tree: docstrings, comments, layout and the order
    of its imports compute nothing). Definitions moved out of a measured file, verbatim, into modules it
    now imports them from are not an edit either (`renames.moved_out`: a moved definition that also
    changed is), nor a new measured file that holds only such moved definitions (their new home, declared
    so that a later edit there is seen). A new package's `__init__.py` without code is not an edit."""
    return _edited(str(ROOT), commit, tuple(measures))


@lru_cache(maxsize=256)   # one answer per (checkout, commit, paths) in a process: HEAD does not move under it
def _edited(root: str, commit: str, measures: tuple[str, ...]) -> bool | None:
    diff = _git("diff", "-z", "--name-status", "--find-renames", commit, "HEAD")
    if diff is None or diff.returncode != 0:
        return None
    words = diff.stdout.split("\0")
    entries, i = [], 0
    while i < len(words) and words[i]:
        status = words[i]
        if status[0] in "RC":
            entries.append((status[0], words[i + 1], words[i + 2]))
            i += 3
        else:
            entries.append((status[0], words[i + 1], words[i + 1]))
            i += 2
    moves = Renames({old: new for st, old, new in entries if st == "R"})
    destinations: dict[str, set[str]] = {}          # measured definitions moved out, by their new file
    added = []
    for st, old, new in entries:
        if not (_under(new, measures) or _under(old, measures)):
            continue
        if st == "A" and new.endswith("__init__.py") and not has_code(_blob("HEAD", new)):
            continue                  # the marker of a package the move made (empty, or a docstring)
        if st == "A":
            added.append(new)
            continue
        if st not in "RM":
            return True
        before, after = _blob(commit, old), _blob("HEAD", new)
        if before is None or after is None:
            return True
        before = moves.rewrite(before, old, new)
        if canonical(before, new) == canonical(after, new):
            continue
        moved = moved_out(before, after, new, lambda path: _blob("HEAD", path))
        if moved is None:
            return True               # neither the same code nor definitions moved out behind an import
        for path, names in moved.items():
            destinations.setdefault(path, set()).update(names)
    # a new measured file is an edit unless it holds only definitions moved out of measured files
    return any(path not in destinations or not only_moved(_blob("HEAD", path) or "", path, destinations[path])
               for path in added)


def staleness(commit: str | None, measures: tuple[str, ...]) -> str | None:
    """A problem line when the measured code changed between `commit` and HEAD (or when that
    cannot be told), None when it did not. Moving or renaming the measured files (with the imports
    and paths that name them) changes nothing they measure: the catalogue declares their new names."""
    if not commit:
        return None                   # reported as "no commit" already
    known = _git("cat-file", "-e", f"{commit}^{{commit}}")
    if known is None or known.returncode != 0:
        return (f"freshness unknown: commit {commit} is not in this checkout's git history, so whether "
                f"{', '.join(measures)} changed since cannot be checked")
    changed = edited(commit, measures)
    if changed is None:
        return f"freshness unknown: git diff {commit} HEAD failed"
    if not changed:
        return None
    # the declared paths, not the changed files: the line then stays the same as the code moves on
    return f"stale: the code it measures ({', '.join(measures)}) changed after {commit}"


def load(file, bench_dir: str | Path) -> Source:
    path = Path(bench_dir) / file.name
    src = Source(file, path)
    if not path.exists():
        src.problems.append(f"missing: no {file.name} in the bench directory")
        return src
    d = json.loads(path.read_text())
    meta = d.get("meta") or d.get("provenance") or {}   # bench.tactic nests it under "provenance"
    src.data = d
    src.device = d.get("device") or meta.get("device") or "?"
    src.command = d.get("command") or meta.get("command")
    src.commit = d.get("commit") or (d.get("environment") or {}).get("git_commit") or meta.get("commit")
    rows = list(d.get("rows") or [])
    if not src.command:
        src.problems.append(f"no command recorded: cannot tell what wrote it (should be `{file.command}`)")
    else:
        first = src.command.split(";")[0]
        if ";" in src.command:
            src.problems.append(f"several commands recorded: `{src.command}`")
        elif normalize(first) != normalize(file.command):
            src.problems.append(f"other command recorded: `{src.command}` (should be `{file.command}`)")
        merged = d.get("merged_from") or []
        if merged:
            own = option_values(first, "--contexts")
            kept = [r for r in rows if own is None or str(r.get("context")) in own]
            others = "; ".join(f"`{m.get('command')}`" for m in merged)
            left = (f"its {len(rows) - len(kept)} rows from them are left out here" if own is not None
                    else "which rows came from which command cannot be told: all are shown")
            src.problems.append(f"hand-merged: rows of {len(merged)} more command(s) were added by hand "
                                f"({others}); {left}")
            rows = kept
    if not src.commit:
        src.problems.append("no commit recorded")
    elif d.get("dirty") or meta.get("dirty"):
        src.problems.append(f"uncommitted changes: tracked files differed from {src.commit} when it ran")
    stale = staleness(src.commit, file.measures)
    if stale:
        src.problems.append(stale)
    src.rows = rows
    return src


def markdown(sources: list[Source]) -> str:
    """The Provenance section of a latency table: one line per file, its command and commit,
    its problems, and the command that re-writes it."""
    intro = ("Provenance (each file must come from one recorded command at a commit no older than the code "
             "it measures; re-write a file on the GPU machine with the command shown, or "
             "`make results/bench/<file>`):")
    lines = ["", intro, ""]
    for s in sources:
        state = "ok" if not s.problems else "**" + "; ".join(p.split(":")[0] for p in s.problems) + "**"
        lines.append(f"- `{s.name}`: {state}; commit {s.commit or '?'}; device {s.device or '?'}.")
        lines += [f"  - {p}" for p in s.problems]
        if s.problems:
            lines.append(f"  - re-run: `{s.rerun()}`")
    return "\n".join(lines) + "\n"
