"""python -m analysis list | status KEY | run KEY | render KEY | make KEY | table N | tables | makefile

  list                      every paper item (implemented or not) with its Make target
  status KEY                the item's cells: done / partial / missing / not implemented
  run KEY                   launch the missing runs (Hydra multiruns of run.py; resumable); for a
                            latency item, print the GPU command that writes its benchmark JSON
  render KEY                results/tables/KEY.md + .csv, results/figures/KEY.png from stored runs
                            (latency items: from the benchmark JSON under --bench)
  make KEY                  run, then render (what `make <paper>-<item>` calls)
  table N [--paper P]       make the catalogue's table N of paper P (default lychee)
  tables                    render every implemented item that has results
  makefile                  print analysis/targets.mk

Options: --profile paper|embedded (default embedded), --launcher local|submitit_local|slurm,
--results DIR (default results/runs), --bench DIR (default results/bench: the GPU benchmark JSON of
the latency items), --out DIR (default results), --dry-run (print the commands).
Hydra overrides after `--` are added to every run of the sweep and to the matching, e.g.
`python -m analysis make tidal.table1 --profile paper -- task.haystack_dir=/data/pg19_mini.jsonl`.
Exit code 2 with one line for an unknown or not yet implemented item, or a missing benchmark JSON.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from analysis import catalogue
from analysis.catalogue import MissingResults, NotImplementedItem


def _cells(item, profile: str, extra: list[str], results: str):
    from analysis.runs import Store, expand

    impl = item.require()
    if profile not in impl.sweeps:
        raise NotImplementedItem(f"{item.key} has no {profile!r} profile; profiles: {', '.join(impl.sweeps)}")
    store = Store(results)
    return [store.fill(c) for c in expand(impl.sweeps[profile], extra, impl.label)]


def cmd_list(args) -> int:
    for key, it in catalogue.items().items():
        mark = "implemented" if it.implemented else "not implemented"
        print(f"{key:22s} {mark:16s} make {it.target():22s} {it.content}")
    n = len(catalogue.implemented_keys())
    print(f"\n{len(catalogue.items())} items, {n} implemented; profiles: {', '.join(catalogue.PROFILES)}")
    return 0


def _bench_status(item, args) -> int:
    bench = item.impl.bench
    for name in bench.files:
        path = Path(args.bench) / name
        print(f"{'done' if path.exists() else 'missing':16s} {path}")
    print(f"GPU benchmark (profile-independent); writes them: {bench.command}")
    return 0


def cmd_status(args) -> int:
    item = catalogue.get(args.key)
    if item.require().bench:
        return _bench_status(item, args)
    cells = _cells(item, args.profile, args.overrides, args.results)
    for c in cells:
        where = f" {c.run.path} ({c.run.n_rows}/{c.expected or '?'} rows)" if c.run else ""
        print(f"{c.status:16s} {c.block or '-'} | {c.row} | {c.col} :: {' '.join(c.overrides)}{where}")
    _summary(cells)
    return 0


def _summary(cells) -> None:
    from collections import Counter

    counts = Counter(c.status for c in cells)
    print(", ".join(f"{v} {k}" for k, v in sorted(counts.items())))


def cmd_run(args) -> int:
    from analysis.launch import commands, launch, plan

    item = catalogue.get(args.key)
    if item.require().bench:
        bench = item.impl.bench
        have = [n for n in bench.files if (Path(args.bench) / n).exists()]
        print(f"{item.key}: GPU benchmark, not a Hydra sweep ({len(have)}/{len(bench.files)} JSON under "
              f"{args.bench}); on the GPU machine (repo root) run:\n  {bench.command}\nthen put "
              f"{', '.join(bench.files)} under {args.bench}/ and `python -m analysis render {item.key}`.")
        return 0
    cells = _cells(item, args.profile, args.overrides, args.results)
    ni = sorted({c.values["method"] for c in cells if c.status == "not implemented"})
    for m in ni:
        print(f"{item.key}: method {m!r} is not implemented (no methods/{m}.py); its rows stay empty")
    todo = [c for c in cells if c.status in ("missing", "partial")]
    print(f"{item.key} [{args.profile}]: {len(cells)} cells, {len(todo)} to run, "
          f"{sum(c.status == 'done' for c in cells)} done")
    if not todo:
        return 0
    t0 = time.time()
    multiruns = plan(item.require().sweeps[args.profile], args.overrides, cells)
    failed = launch(commands(item.key, args.profile, multiruns, args.launcher, args.results),
                    dry_run=args.dry_run, parallel=args.launcher == "slurm")
    if not args.dry_run:
        print(f"{item.key}: launched in {time.time() - t0:.0f} s; {failed} multirun(s) failed")
    return 1 if failed else 0


def cmd_render(args, quiet_if_empty: bool = False) -> int:
    from analysis.render import frame

    item = catalogue.get(args.key)
    impl = item.require()
    if impl.bench:
        if quiet_if_empty and not all((Path(args.bench) / n).exists() for n in impl.bench.files):
            return 0
        paths = impl.bench.render(item, impl, catalogue.read_bench(item, args.bench), Path(args.out))
        for p in paths:
            print(f"wrote {p}")
        return 0
    cells = _cells(item, args.profile, args.overrides, args.results)
    if quiet_if_empty and not any(c.run for c in cells):
        return 0
    df = frame(cells, impl, args.profile)
    paths = impl.render(item, impl, df, args.profile, Path(args.out))
    _summary(cells)
    for p in paths:
        print(f"wrote {p}")
    return 0


def cmd_make(args) -> int:
    rc = cmd_run(args)
    cmd_render(args)
    return rc


def cmd_table(args) -> int:
    args.key = catalogue.table_key(int(args.number), args.paper)
    if not catalogue.get(args.key).implemented:
        raise NotImplementedItem(f"table {args.number} of {catalogue.PAPERS[args.paper]} is {args.key}, not "
                                 f"implemented in analysis/ yet (implemented: "
                                 f"{', '.join(catalogue.implemented_keys())}; pick another with PAPER=)")
    return cmd_make(args)


def cmd_tables(args) -> int:
    for key in catalogue.implemented_keys():
        args.key = key
        cmd_render(args, quiet_if_empty=True)
    return 0


def cmd_makefile(args) -> int:
    from analysis.makefile import generate

    sys.stdout.write(generate())
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    overrides: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, overrides = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(prog="python -m analysis", description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=["list", "status", "run", "render", "make", "table", "tables", "makefile"])
    p.add_argument("key", nargs="?", help="item key (tidal.table1) or, for `table`, the table number")
    p.add_argument("--profile", default="embedded", choices=catalogue.PROFILES)
    p.add_argument("--paper", default="lychee", choices=list(catalogue.PAPERS))
    p.add_argument("--launcher", default="local", choices=["local", "submitit_local", "slurm"])
    p.add_argument("--results", default="results/runs")
    p.add_argument("--bench", default="results/bench")
    p.add_argument("--out", default="results")
    p.add_argument("--dry-run", action="store_true")
    args = p.parse_args(argv)
    args.overrides = overrides
    if args.command in ("status", "run", "render", "make", "table") and not args.key:
        p.error(f"{args.command} needs a key")
    if args.command == "table":
        args.number = args.key
    handler = {"list": cmd_list, "status": cmd_status, "run": cmd_run, "render": cmd_render,
               "make": cmd_make, "table": cmd_table, "tables": cmd_tables, "makefile": cmd_makefile}
    try:
        return handler[args.command](args)
    except (NotImplementedItem, MissingResults, KeyError, ValueError) as e:
        msg = e.args[0] if e.args else str(e)
        print(f"error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
