"""Launch the missing runs of an item as Hydra multiruns of run.py.

Cells still to do are packed back into as few multiruns as possible (cells that differ in one key
become one comma sweep), each run through the chosen launcher (`local`: sequential in-process;
`submitit_local`; `slurm`: hydra-submitit-launcher's Slurm launcher, conf/hydra/launcher/). Runs
are resumable, so a partial cell is simply launched again and keeps its rows.
"""
from __future__ import annotations

import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

from analysis.runs import Cell

ROOT = Path(__file__).resolve().parents[1]


def _split(override: str) -> tuple[str, str]:
    key, _, value = override.partition("=")
    return key, value


def pack(cells: list[Cell]) -> list[list[str]]:
    """Override lists, one per multirun, covering exactly the given cells."""
    by_keys: dict[tuple[str, ...], list[list[str]]] = defaultdict(list)
    for c in cells:
        by_keys[tuple(_split(o)[0] for o in c.overrides)].append(c.overrides)
    out = []
    for keys, combos in by_keys.items():
        # sweep the key with the most distinct values; the rest must agree within a multirun
        distinct = [len({_split(c[i])[1] for c in combos}) for i in range(len(keys))]
        i = max(range(len(keys)), key=lambda j: distinct[j])
        groups: dict[tuple[str, ...], list[str]] = defaultdict(list)
        for c in combos:
            rest = tuple(o for j, o in enumerate(c) if j != i)
            value = _split(c[i])[1]
            if value not in groups[rest]:
                groups[rest].append(value)
        for rest, values in groups.items():
            out.append(list(rest[:i]) + [f"{keys[i]}={','.join(values)}"] + list(rest[i:]))
    return out


def plan(sweeps: list[list[str]], extra: list[str], cells: list[Cell]) -> list[list[str]]:
    """Multiruns for the cells to do: a sweep with every cell to do is launched as written (one
    big Cartesian multirun: one Slurm array), the rest of each sweep is packed."""
    out = []
    for n, sweep in enumerate(sweeps):
        mine = [c for c in cells if c.sweep == n]
        todo = [c for c in mine if c.status in ("missing", "partial")]
        if todo and len(todo) == len(mine):
            out.append(list(sweep) + list(extra))
        elif todo:
            out += pack(todo)
    return out


def commands(key: str, profile: str, multiruns: list[list[str]], launcher: str, results_dir: str,
             extra_hydra: list[str] = ()) -> list[list[str]]:
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
    cmds = []
    for n, overrides in enumerate(multiruns):
        cmd = [sys.executable, str(ROOT / "run.py"), "-m", *overrides, f"hydra/launcher={launcher}",
               f"hydra.sweep.dir=results/multirun/{key}/{profile}/{stamp}-{n}"]
        if str(results_dir) != "results/runs":
            cmd.append(f"runner.results_dir={results_dir}")
        cmds.append(cmd + list(extra_hydra))
    return cmds


def launch(cmds: list[list[str]], dry_run: bool = False, parallel: bool = False) -> int:
    """Run the multiruns, in turn on this machine or all at once when `parallel` (Slurm: each
    parent only waits on its array); returns the number that failed. A failure is reported and
    the others still run: one bad cell must not cost a night of Slurm jobs."""
    procs = []
    for cmd in cmds:
        print(f"$ python {' '.join(_quote(a) for a in cmd[1:])}", flush=True)
        if dry_run:
            continue
        p = subprocess.Popen(cmd, cwd=ROOT)
        if not parallel:
            p.wait()
        procs.append(p)
    failed = 0
    for p in procs:
        if p.wait() != 0:
            failed += 1
            print(f"  -> exit code {p.returncode}: {' '.join(p.args[3:])}", file=sys.stderr, flush=True)
    return failed


def _quote(arg: str) -> str:
    return f"'{arg}'" if any(ch in arg for ch in "[]*? ") else arg
