"""Tell a move from an edit: what a pure move or rename of modules changes in a file is its module
paths, and nothing else.

A move of `methods/kmeans.py` to `methods/parts/cluster_keys.py` changes the files that name it (the
import lines, the paths in comments and commands), not what any code computes. `Renames.rewrite`
applies such a move to a file's old text: file paths (`methods/kmeans.py`), dotted module names
(`methods.kmeans`, `python -m runners.train_heads`) and the import lines that name a moved module
(`from methods import kmeans as K`, `from .minference import X`) take their new names, and a moved
file's `Path(__file__).parents[k]` still names the same folder. A file whose
new text equals its old text so rewritten was only touched by the move (analysis/provenance.py: such
a file does not stale a benchmark that measures it). Python files are compared by `canonical`: their
code, without docstrings and comments (which name the moved files too, and compute nothing), imports
in any order (a moved module's import sorts elsewhere: the import sorter moves it, and that is still
the move).
"""
from __future__ import annotations

import ast
import re

# a folder named from the file's own place: Path(__file__).parent, .parents[k] (with .resolve())
_HERE = re.compile(r"(Path\(__file__\)(?:\.resolve\(\))?)\.(?:parent(?![\w\[])|parents\[(\d+)\])")
_FROM = re.compile(r"^(\s*)from\s+(\.?[\w.]*)\s+import\s+(.+?)\s*$")


def module_of(path: str) -> str | None:
    """The dotted module a repository path holds (`a/b/c.py` -> `a.b.c`, `a/b/__init__.py` -> `a.b`)."""
    if not path.endswith(".py"):
        return None
    parts = path[:-3].split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts) if parts and all(p.isidentifier() for p in parts) else None


def _package(path: str) -> str:
    return ".".join(path.split("/")[:-1])


class Renames:
    """The moves old path -> new path of one change, applied to a file's text."""

    def __init__(self, moves: dict[str, str]):
        self.paths = dict(moves)
        self.modules = {}
        for old, new in moves.items():
            a, b = module_of(old), module_of(new)
            if a and b and a != b:
                self.modules[a] = b
        # longest first, and bounded on both sides, so `kernels.minference` does not touch
        # `kernels.minference_triton` nor `xkernels.minference`
        self._path_re = self._alternation(self.paths, r"(?<![\w/.])", r"(?![\w])")
        # a module's path without `.py`, as prose names an attribute (`kernels/minference.SparseIndex`)
        self.stems = {o[:-3]: n[:-3] for o, n in moves.items() if o.endswith(".py") and n.endswith(".py")}
        self._stem_re = self._alternation(self.stems, r"(?<![\w/.])", r"(?![\w/])")
        self._mod_re = self._alternation(self.modules, r"(?<![\w.])", r"(?![\w])")

    @staticmethod
    def _alternation(names, before: str, after: str):
        if not names:
            return None
        alts = "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
        return re.compile(f"{before}({alts}){after}")

    def _from_line(self, m: re.Match, old_path: str, new_path: str) -> str:
        """`from P import a, b as c`, each name resolved to its module and moved; the names regrouped
        by their new package (one line per package, in order of first appearance)."""
        indent, pkg, names = m.group(1), m.group(2), m.group(3)
        relative = pkg.startswith(".")
        if relative and pkg.startswith(".."):
            return m.group(0)
        full = (_package(old_path) + pkg if relative else pkg) if pkg != "." else _package(old_path)
        full = self.modules.get(full, full)
        here = _package(new_path)
        if not re.fullmatch(r"[\w\s,]+", names):   # `import (` of a parenthesised list: the package only
            return f"{indent}from {self._shown(full, relative, here)} import {names}"
        groups: dict[str, list[str]] = {}
        for item in (n.strip() for n in names.split(",")):
            if not item:
                continue
            name, _, alias = (w.strip() for w in item.partition(" as "))
            target = self.modules.get(f"{full}.{name}")
            parent, leaf = (target.rsplit(".", 1) if target else (full, name))
            alias = alias or (name if leaf != name else "")   # the code below keeps the name it used
            groups.setdefault(parent, []).append(leaf + (f" as {alias}" if alias else ""))
        return "\n".join(f"{indent}from {self._shown(parent, relative, here)} import {', '.join(items)}"
                         for parent, items in groups.items())

    @staticmethod
    def _shown(module: str, relative: bool, here: str) -> str:
        """A module as an import line names it: relative to `here` if the line was relative."""
        if relative and module == here:
            return "."
        if relative and module.startswith(here + "."):
            return "." + module[len(here) + 1:]
        return module

    @staticmethod
    def _anchor(m: re.Match, old_path: str, new_path: str) -> str:
        """`Path(__file__).parents[k]` of the file at `old_path`, re-anchored at `new_path` so that it
        names the same folder (a moved module finds its data where it was); unchanged when that
        folder is not above the new place."""
        k = int(m.group(2)) if m.group(2) is not None else 0
        old_dir, new_dir = old_path.split("/")[:-1], new_path.split("/")[:-1]
        if k >= len(old_dir) + 1:
            return m.group(0)
        target = old_dir[:len(old_dir) - k]
        if new_dir[:len(target)] != target:
            return m.group(0)
        j = len(new_dir) - len(target)
        return f"{m.group(1)}.parent" if j == 0 else f"{m.group(1)}.parents[{j}]"

    def rewrite(self, text: str, old_path: str, new_path: str | None = None) -> str:
        """`text` (the file at `old_path`) with every moved path and module given its new name."""
        new_path = new_path or self.paths.get(old_path, old_path)
        if not self.modules and not self.paths:
            return text
        out = []
        for line in text.split("\n"):
            if new_path != old_path and "__file__" in line:
                line = _HERE.sub(lambda x: self._anchor(x, old_path, new_path), line)
            m = _FROM.match(line) if self.modules else None
            if m:
                line = self._from_line(m, old_path, new_path)
            if self._path_re:
                line = self._path_re.sub(lambda x: self.paths[x.group(1)], line)
            if self._stem_re:
                line = self._stem_re.sub(lambda x: self.stems[x.group(1)], line)
            if self._mod_re:
                line = self._mod_re.sub(lambda x: self.modules[x.group(1)], line)
            out.append(line)
        return "\n".join(out)


def _explode(stmt: ast.stmt) -> list[ast.stmt]:
    """An import statement as one statement per imported name."""
    if isinstance(stmt, ast.Import):
        return [ast.Import(names=[a]) for a in stmt.names]
    return [ast.ImportFrom(module=stmt.module, names=[a], level=stmt.level) for a in stmt.names]


def _sorted_imports(body: list[ast.stmt]) -> list[ast.stmt]:
    """Each run of consecutive import statements, one name each, sorted."""
    out: list[ast.stmt] = []
    run: list[ast.stmt] = []
    for stmt in [*body, None]:
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            run += _explode(stmt)
            continue
        out += sorted(run, key=ast.dump)
        run = []
        if stmt is not None:
            out.append(stmt)
    return out


def _is_docstring(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def canonical(text: str, path: str) -> str:
    """What a Python file computes, as text: its syntax tree without docstrings (comments, blank lines
    and line breaks are not in it), each run of imports sorted name by name. Any other file: its text."""
    if not path.endswith(".py"):
        return text
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    for node in list(ast.walk(tree)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body \
                and _is_docstring(node.body[0]):
            node.body = node.body[1:] or [ast.Pass()]
        for name in ("body", "orelse", "finalbody"):
            stmts = getattr(node, name, None)
            if isinstance(stmts, list) and stmts and isinstance(stmts[0], ast.stmt):
                setattr(node, name, _sorted_imports(stmts))
    return ast.dump(tree)


def has_code(text: str | None) -> bool:
    """Whether a Python file holds more than a docstring (None, unparsable: yes, to be safe)."""
    if text is None:
        return True
    try:
        body = ast.parse(text).body
    except SyntaxError:
        return True
    return not all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) for n in body)
