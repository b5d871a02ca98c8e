"""Every bench/ module imports on the CPU: the GPU-only scripts run nowhere in CI, so a name moved or
removed elsewhere (bench.timing's Timer -> Clock left bench/prefill_speed.py failing at import) shows here."""
from __future__ import annotations

import importlib
from pathlib import Path

import pytest

BENCH = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "bench").glob("*.py") if p.stem != "__init__")


@pytest.mark.parametrize("name", BENCH)
def test_bench_module_imports(name):
    importlib.import_module(f"bench.{name}")
