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


# --- a move of definitions out of a file, behind an import ------------------------------------------------
# `methods/config.py` losing `_plain` to `common/options.py` (imported back from there) changes the file,
# not what it computes: `moved_out` tells such a split from an edit. A top-level binding is a definition
# (def, class, a plain `NAME = ...`) or an import; every other top-level statement must stay as it was.

def _absolute(module: str | None, level: int, path: str) -> str:
    """The absolute module of `from <level dots><module> import`, in the file at `path`."""
    if not level:
        return module or ""
    pkg = path.split("/")[:-1]
    pkg = pkg[:len(pkg) - (level - 1)] if level > 1 else pkg
    return ".".join([*pkg, *([module] if module else [])])


def _code_dump(node: ast.AST, name: str | None = None) -> str:
    """A definition's code (docstrings out), under the name `name` if given (a move may import it under
    its old name: `from common.options import plain as _plain`)."""
    node = ast.parse(ast.unparse(node)).body[0]          # a copy
    if name is not None and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        node.name = name
    return canonical(ast.unparse(node), "x.py")


def _bindings(text: str, path: str) -> tuple[dict, list[str], dict] | None:
    """(name -> ("def", code) | ("import", module, name-or-None), the other top-level statements' code, name
    -> the definition node) of a Python file; None when it does not parse or binds a name twice."""
    try:
        body = ast.parse(text).body
    except SyntaxError:
        return None
    if body and _is_docstring(body[0]):
        body = body[1:]
    binds: dict = {}
    nodes: dict = {}
    rest: list[str] = []

    def bind(name, key, node=None):
        if name in binds:
            raise KeyError(name)
        binds[name] = key
        if node is not None:
            nodes[name] = node
    try:
        for stmt in body:
            if isinstance(stmt, ast.Import):
                for a in stmt.names:
                    bind(a.asname or a.name.split(".")[0], ("import", a.name if a.asname else a.name.split(".")[0], None))
            elif isinstance(stmt, ast.ImportFrom):
                module = _absolute(stmt.module, stmt.level, path)
                for a in stmt.names:
                    bind(a.asname or a.name, ("import", module, a.name))
            elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bind(stmt.name, ("def", _code_dump(stmt)), stmt)
            elif isinstance(stmt, (ast.Assign, ast.AnnAssign)) and \
                    all(isinstance(t, ast.Name) for t in (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target])):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                for t in targets:
                    bind(t.id, ("def", _code_dump(stmt)), stmt)
            else:
                rest.append(_code_dump(stmt))
    except KeyError:
        return None
    return binds, rest, nodes


def only_moved(text: str, path: str, names: set[str]) -> bool:
    """Whether a file added since a benchmark ran holds nothing but definitions moved into it out of
    measured files (`names`, as `moved_out` found them) and imports: then it is where measured code
    now lives, not new code."""
    b = _bindings(text, path)
    return b is not None and not b[1] and all(k[0] == "import" or n in names for n, k in b[0].items())


def _names(nodes) -> set[str]:
    return {n.id for node in nodes for n in ast.walk(node) if isinstance(n, ast.Name)}


def _module_path(module: str, read) -> tuple[str, str] | None:
    """(path, text at HEAD) of a repository module, or None (a module outside the repository)."""
    for path in (module.replace(".", "/") + ".py", module.replace(".", "/") + "/__init__.py"):
        text = read(path)
        if text is not None:
            return path, text
    return None


def moved_out(before: str, after: str, path: str, read) -> dict[str, set[str]] | None:
    """Whether `after` is `before` with some top-level definitions moved out, verbatim, into repository
    modules it imports from (`read(path)`: a file's text where `after` lives, None if absent): every other
    statement and definition unchanged; a moved definition imported back under its name, or no longer
    named in the file; an import dropped only if the moved code used it and nothing left here does; no new name. A
    moved definition must be equal in code (docstrings and comments aside) to the one at its new place, and
    the top-level names it uses (helpers, imports) must mean there what they meant here. Anything else
    (a definition changed, as it moved or after; a new one) is an edit.

    The moved definitions by the path of their new file ({} when none moved), or None for an edit."""
    if not path.endswith(".py"):
        return None
    b, a = _bindings(before, path), _bindings(after, path)
    if b is None or a is None or b[1] != a[1]:
        return None
    (B, _, b_nodes), (A, _, _) = b, a
    if set(A) - set(B):
        return None                                    # a new name: new code or a new dependency
    imported_from = {key[1] for key in A.values() if key[0] == "import"}
    used = _names([s for s in ast.parse(after).body if not isinstance(s, (ast.Import, ast.ImportFrom))])
    modules: dict = {}

    def module(name):
        if name not in modules:
            found = _module_path(name, read)
            modules[name] = found and _bindings(found[1], found[0])
        return modules[name]

    moved: list[tuple[str, str, str]] = []             # (name here, module, name there)
    dropped: set[str] = set()
    for name, kb in B.items():
        ka = A.get(name)
        if ka == kb:
            continue
        if kb[0] == "import":
            if ka is not None or name in used:
                return None                            # an import rebound, or dropped while still named
            dropped.add(name)
            continue
        if ka is None:                                  # no longer named here: found in a module it imports
            where = next((m for m in sorted(imported_from) if module(m) and module(m)[0].get(name) == kb), None)
            if where is None:
                return None
            moved.append((name, where, name))
        elif ka[0] == "import" and ka[2] is not None and module(ka[1]) and ka[2] in module(ka[1])[2] and \
                _code_dump(module(ka[1])[2][ka[2]], name) == kb[1]:
            moved.append((name, ka[1], ka[2]))
        else:
            return None                                # a definition changed in place
    if dropped - _names([b_nodes[name] for name, _, _ in moved]):
        return None                                    # a dropped import the moved code did not use
    # what a moved definition names must mean the same at its new place
    for name, where, _ in moved:
        theirs = module(where)[0]
        for dep in _names([b_nodes[name]]) & set(B) - {name}:
            if theirs.get(dep) != B[dep]:
                return None
    out: dict[str, set[str]] = {}
    for _, where, there in moved:
        out.setdefault(_module_path(where, read)[0], set()).add(there)
    return out
