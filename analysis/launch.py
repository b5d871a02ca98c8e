"""Launch the missing runs of an item as Hydra multiruns of run.py.

Cells still to do are packed back into as few multiruns as possible (cells that differ in one key
become one comma sweep), each run through the chosen launcher (`local`: sequential in-process, or
`--jobs N` processes at a time over N round-robin shards of the cells;
`submitit_local`; `slurm`: hydra-submitit-launcher's Slurm launcher, conf/hydra/launcher/). Runs
are resumable, so a partial cell is simply launched again and keeps its rows.
"""
from __future__ import annotations

import os
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


def model_gpus(model: str) -> int:
    """The GPUs a model's config states it needs (`gpus:` in conf/model/<model>.yaml; 1 when unset)."""
    from omegaconf import OmegaConf

    path = ROOT / "conf" / "model" / f"{model}.yaml"
    return int(OmegaConf.load(path).get("gpus") or 1) if path.exists() else 1


def by_gpus(multiruns: list[list[str]]) -> list[list[str]]:
    """A multirun sweeping models of different GPU needs becomes one multirun per need: one Slurm
    array asks for one gpus_per_node (conf/hydra/launcher/slurm.yaml reads it from model.gpus)."""
    out = []
    for overrides in multiruns:
        i = next((j for j, o in enumerate(overrides) if _split(o)[0] == "model"), None)
        models = _split(overrides[i])[1].split(",") if i is not None else []
        groups: dict[int, list[str]] = defaultdict(list)
        for m in models:
            groups[model_gpus(m)].append(m)
        if len(groups) <= 1:
            out.append(overrides)
            continue
        for ms in groups.values():
            out.append([*overrides[:i], f"model={','.join(ms)}", *overrides[i + 1:]])
    return out


def commands(key: str, profile: str, multiruns: list[list[str]], launcher: str, results_dir: str,
             extra_hydra: list[str] = ()) -> list[list[str]]:
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
    cmds = []
    for n, overrides in enumerate(by_gpus(multiruns)):
        cmd = [sys.executable, str(ROOT / "run.py"), "-m", *overrides, f"hydra/launcher={launcher}",
               f"hydra.sweep.dir=results/multirun/{key}/{profile}/{stamp}-{n}"]
        if str(results_dir) != "results/runs":
            cmd.append(f"runner.results_dir={results_dir}")
        cmds.append(cmd + list(extra_hydra))
    return cmds


def shards(cells: list[Cell], n: int) -> list[list[Cell]]:
    """The cells dealt round-robin into at most n non-empty groups (neighbouring cells, e.g. one
    method at growing lengths, land in different groups, which keeps the groups' costs alike)."""
    return [g for g in (cells[i::n] for i in range(max(1, n))) if g]


def gpus() -> list[str]:
    """The CUDA devices this machine's processes can be spread over: CUDA_VISIBLE_DEVICES's list
    where it is set, else one per GPU nvidia-smi lists (none on a machine without it)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [d.strip() for d in visible.split(",") if d.strip()]
    try:
        out = subprocess.run(["nvidia-smi", "-L"], check=False, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i in range(sum(line.startswith("GPU ") for line in out.splitlines()))]


def launch(cmds: list[list[str]], dry_run: bool = False, parallel: bool = False, jobs: int = 1) -> int:
    """Run the multiruns, in turn on this machine, `jobs` at a time, or all at once when `parallel`
    (Slurm: each parent only waits on its array); returns the number that failed. A failure is
    reported and the others still run: one bad cell must not cost a night of Slurm jobs.
    jobs > 1 is for a machine the runs leave idle (e.g. a small model on a GPU is bound by the host:
    one Python process per step); each process then gets cpu_count / jobs threads and, on a machine
    of several GPUs, the one running the fewest of them (CUDA_VISIBLE_DEVICES): otherwise every
    process would take the first GPU and leave the others idle."""
    width = len(cmds) if parallel else max(1, jobs)
    env = dict(os.environ)
    if width > 1 and not parallel and "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // width))
    devices = gpus() if width > 1 and not parallel and not dry_run else []
    running: list[tuple[subprocess.Popen, str | None]] = []
    failed = 0

    def reap(p: subprocess.Popen) -> int:
        if p.wait() != 0:
            print(f"  -> exit code {p.returncode}: {' '.join(p.args[3:])}", file=sys.stderr, flush=True)
            return 1
        return 0

    for cmd in cmds:
        print(f"$ python {' '.join(_quote(a) for a in cmd[1:])}", flush=True)
        if dry_run:
            continue
        while len(running) >= width:                 # wait for a slot
            done = next((r for r in running if r[0].poll() is not None), None)
            if done is None:
                time.sleep(0.5)
                continue
            running.remove(done)
            failed += reap(done[0])
        gpu = None
        if len(devices) > 1:                         # the least busy GPU, the first of equals
            gpu = min(devices, key=lambda d: sum(g == d for _, g in running))
            env = {**env, "CUDA_VISIBLE_DEVICES": gpu}
        running.append((subprocess.Popen(cmd, cwd=ROOT, env=env), gpu))
    return failed + sum(reap(p) for p, _ in running)


def _quote(arg: str) -> str:
    return f"'{arg}'" if any(ch in arg for ch in "[]*? ") else arg
