"""Layers import downward only (README, Layout): common <- kernels <- methods, tasks <- runners <- offline,
analysis, bench. Read from the source (every import statement, lazy ones included), no module imported."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# what each room may import besides itself (third-party packages are not rooms)
ALLOWED = {
    "common": set(),
    "kernels": {"common"},
    "methods": {"common", "kernels"},
    "tasks": {"common", "kernels"},
    "runners": {"common", "kernels", "methods", "tasks"},
    "offline": {"common", "kernels", "methods", "tasks", "runners"},
    "analysis": {"common", "kernels", "methods", "tasks", "runners"},
    "bench": {"common", "kernels", "methods", "tasks", "runners", "offline", "analysis"},
}


def _rooms_imported(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out & set(ALLOWED)


def test_imports_run_downward_only():
    wrong = []
    for room, allowed in ALLOWED.items():
        for path in sorted((ROOT / room).rglob("*.py")):
            for other in sorted(_rooms_imported(path) - allowed - {room}):
                wrong.append(f"{path.relative_to(ROOT)} imports {other}")
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)
