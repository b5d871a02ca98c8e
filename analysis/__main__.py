"""python -m analysis list | status KEY | run KEY | export KEY | render KEY | make KEY | table N | tables
                   | bench KEY|FILE | makefile

  list                      every paper item (implemented or not) with its Make target
  status KEY                the item's cells: done / partial / missing / not implemented, and where
                            their rows are (runs = results/runs, rows = committed results/rows);
                            for a latency item, the provenance of each benchmark file
  run KEY                   launch the missing runs (Hydra multiruns of run.py; resumable); for a
                            latency item, print the GPU commands of its files that are missing or flawed
  export KEY                copy the runs the item's cells use from --results into --rows (compact,
                            committed; never replaced by fewer rows)
  render KEY                export, then write results/tables/KEY.md + .csv and results/figures/KEY.png
                            from the committed rows only (latency items: from the benchmark JSON);
                            refuses to replace a table with one holding fewer results (--replace);
                            a data-bound item without rows (and no task.data_dir given) writes its
                            no-data table: the paper's numbers, ours empty, the data it needs
  make KEY                  run, then render (what `make <paper>-<item>` calls)
  table N [--paper P]       make the catalogue's table N of paper P (default lychee)
  tables                    render every implemented item that has rows or benchmark JSON, and the
                            no-data table of each data-bound item without rows (its own profile when
                            it has not --profile's); say which were skipped and why
  bench KEY|FILE            run the one command that writes each benchmark file of a latency item
                            (those missing or flawed; all with --force) into --bench: on a GPU machine
  makefile                  print analysis/targets.mk

Options: --profile paper|embedded (default embedded), --launcher local|submitit_local|slurm,
--results DIR (default results/runs), --rows DIR (default results/rows), --bench DIR (default
results/bench), --out DIR (default results), --dry-run (print the commands; write nothing),
--replace (let a render replace a table that holds more results), --force (bench: every file),
--jobs N (run, local launcher: N processes at once, each over its round-robin share of the cells; on a
  machine of several GPUs each process gets the least busy one, CUDA_VISIBLE_DEVICES).
Hydra overrides after `--` are added to every run of the sweep and to the matching, e.g.
`python -m analysis make tidal.table1 --profile paper -- task.haystack_dir=/data/pg19_mini.jsonl`.
Exit code 2 with one line for an unknown or not yet implemented item, nothing to render from, or a
render that would lose results.
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

import analysis.papers  # noqa: F401  (every paper module registers its items)
from analysis import catalogue, nodata
from analysis.catalogue import MissingResults, NotImplementedItem
from analysis.output import FewerResults, render_into


def _plan(item, args, results: str | None = "", rows: str | None = ""):
    """(sweeps, cells): the item's sweeps for the profile, then those its `derive` computes from the
    filled cells of the first (matched budgets), every cell filled from the results."""
    from analysis.runs import Store, expand

    impl = item.require()
    if args.profile not in impl.sweeps:
        raise NotImplementedItem(f"{item.key} has no {args.profile!r} profile; profiles: {', '.join(impl.sweeps)}")
    store = Store(args.results if results == "" else results, args.rows if rows == "" else rows)
    sweeps = list(impl.sweeps[args.profile])
    cells = [store.fill(c) for c in expand(sweeps, args.overrides, impl.label)]
    extra = impl.derive(args.profile, cells) if impl.derive else []
    if extra:
        seen = {tuple(sorted(c.overrides)) for c in cells}
        for c in expand(extra, args.overrides, impl.label):
            if tuple(sorted(c.overrides)) not in seen:
                c.sweep += len(sweeps)
                cells.append(store.fill(c))
        sweeps += extra
    return sweeps, cells


def _cells(item, args, results: str | None = "", rows: str | None = ""):
    return _plan(item, args, results, rows)[1]


def _sources(item, args):
    from analysis import provenance

    return [provenance.load(f, args.bench) for f in item.impl.bench.files]


def cmd_list(args) -> int:
    for key, it in catalogue.items().items():
        mark = "implemented" if it.implemented else "not implemented"
        print(f"{key:22s} {mark:16s} make {it.target():22s} {it.content}")
    n = len(catalogue.implemented_keys())
    print(f"\n{len(catalogue.items())} items, {n} implemented; profiles: {', '.join(catalogue.PROFILES)}")
    return 0


def cmd_status(args) -> int:
    item = catalogue.get(args.key)
    if item.require().bench:
        for s in _sources(item, args):
            print(f"{s.short():16s} {Path(args.bench) / s.name}  (commit {s.commit or '?'})")
            for p in s.problems:
                print(f"{'':16s}   {p}")
        return 0
    cells = _cells(item, args)
    for c in cells:
        where = f" {c.run.source}:{c.run.run_id} ({c.run.n_rows}/{c.expected or '?'} rows)" if c.run else ""
        print(f"{c.status:16s} {c.block or '-'} | {c.row} | {c.col} :: {' '.join(c.overrides)}{where}")
    _summary(cells)
    return 0


def _summary(cells) -> None:
    counts = Counter(c.status for c in cells)
    print(", ".join(f"{v} {k}" for k, v in sorted(counts.items())))


def cmd_run(args) -> int:
    from analysis.launch import commands, launch, pack, plan, shards

    item = catalogue.get(args.key)
    if item.require().bench:
        todo = [s for s in _sources(item, args) if s.problems]
        print(f"{item.key}: GPU benchmark, not a Hydra sweep; {len(todo)} of {len(item.impl.bench.files)} "
              f"file(s) missing or flawed under {args.bench}/. On the GPU machine (repo root) run "
              f"`python -m analysis bench {item.key}`, or each:")
        for s in todo:
            print(f"  {s.rerun(args.bench)}   # {s.short()}")
        return 0
    failed, done = 0, set()
    # a derived second stage (matched budgets) appears once the first has rows: run it in the same
    # call when the launcher waits for the first (local); Slurm runs the stages on two calls
    for _stage in range(2 if item.require().derive and args.launcher != "slurm" and not args.dry_run else 1):
        sweeps, cells = _plan(item, args)
        for m in sorted({c.values["method"] for c in cells if c.status == "not implemented"}):
            print(f"{item.key}: method {m!r} is not implemented (no methods/{m}.py); its rows stay empty")
        todo = [c for c in cells if c.status in ("missing", "partial")]
        print(f"{item.key} [{args.profile}]: {len(cells)} cells, {len(todo)} to run, "
              f"{sum(c.status == 'done' for c in cells)} done")
        if not todo or {tuple(c.overrides) for c in todo} <= done:
            break
        done |= {tuple(c.overrides) for c in todo}
        t0 = time.time()
        if args.jobs > 1 and args.launcher == "local":      # shards' multiruns interleaved: N at a time
            per = [pack(s) for s in shards(todo, args.jobs)]
            multiruns = [m for i in range(max(map(len, per))) for m in (p[i] for p in per if i < len(p))]
        else:
            multiruns = plan(sweeps, args.overrides, cells)
        failed += launch(commands(item.key, args.profile, multiruns, args.launcher, args.results),
                         dry_run=args.dry_run, parallel=args.launcher == "slurm", jobs=args.jobs)
        if not args.dry_run:
            print(f"{item.key}: launched in {time.time() - t0:.0f} s; {failed} multirun(s) failed")
    if item.require().derive and args.launcher == "slurm":
        print(f"{item.key}: second-stage runs (matched budgets) are planned from the first stage's rows: run "
              f"this command again once the first stage's jobs have finished")
    return 1 if failed else 0


def cmd_export(args, quiet: bool = False) -> int:
    from analysis import compact

    item = catalogue.get(args.key)
    counts = compact.export(_cells(item, args), Path(args.rows))
    if counts["written"] or counts["kept (fewer rows here)"] or not quiet:
        print(f"{item.key} [{args.profile}]: rows in {args.rows}/: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
    return 0


def cmd_render(args) -> int:
    from analysis.render import frame

    item = catalogue.get(args.key)
    impl = item.require()
    if args.dry_run:
        print(f"{item.key}: dry run, nothing exported or rendered")
        return 0
    if impl.bench:
        sources = _sources(item, args)
        if all(s.data is None for s in sources):
            raise MissingResults(f"{item.key}: none of its benchmark files is under {args.bench}/; write them "
                                 f"on the GPU machine: `python -m analysis bench {item.key}`")
        done = render_into(Path(args.out), item.key, lambda out: impl.bench.render(item, impl, sources, out),
                           args.replace)
    else:
        cmd_export(args, quiet=True)
        cells = _cells(item, args, results=None)          # the table comes from the committed rows only
        draw = impl.render
        if not any(c.run for c in cells):
            if not nodata.applies(impl, args.overrides, args.profile):
                raise MissingResults(
                    f"{item.key} [{args.profile}]: no rows for any cell (none under {args.rows}/ nor {args.results}/); "
                    f"nothing written. Produce them: `make {item.target()} PROFILE={args.profile}` (embedded on a "
                    f"GPU: `bash analysis/device_sweep.sh {item.key}`)")
            draw = nodata.render                           # data-bound: the paper's numbers, ours empty
            print(f"{item.key} [{args.profile}]: {nodata.line(item, args.profile)}")
        df = frame(cells, impl, args.profile)
        done = render_into(Path(args.out), item.key, lambda out: draw(item, impl, df, args.profile, out),
                           args.replace)
        _summary(cells)
    for p, state in done:
        print(f"{state} {p}")
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
    """Every item, quietly: the files a render changed, then one summary naming what was not rendered."""
    import contextlib
    import io

    done, nodata_keys, wrote, skipped, refused = [], [], [], {}, []
    for key in catalogue.implemented_keys():
        args.key = key
        impl = catalogue.get(key).impl
        one = args
        if not impl.bench and args.profile not in impl.sweeps:   # e.g. paper-only items (no data offline)
            if not impl.data:
                skipped.setdefault(f"no {args.profile!r} profile", []).append(key)
                continue
            # data-bound and paper-only (LongBench on the paper's model): its table from the profile it has
            one = argparse.Namespace(**{**vars(args), "profile": next(iter(impl.sweeps))})
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):
                cmd_render(one)
        except MissingResults as e:
            skipped.setdefault(_why_skipped(e.args[0]), []).append(key)
            continue
        except FewerResults as e:
            refused.append(f"  {e.args[0]}")
            continue
        lines = out.getvalue().splitlines()
        wrote += [line for line in lines if line.startswith("wrote ")]
        (nodata_keys if any("no data here:" in line for line in lines)
         else done).append(key)
    for line in wrote:
        print(line)
    print(f"rendered {len(done) + len(nodata_keys)} item(s): {len(wrote)} file(s) written, the rest unchanged"
          + (f"; {len(nodata_keys)} as no-data tables (their data is not here): {', '.join(nodata_keys)}"
             if nodata_keys else ""))
    if skipped:
        n = sum(len(v) for v in skipped.values())
        print(f"skipped {n} item(s): " + "; ".join(f"{why}: {', '.join(keys)}" for why, keys in skipped.items())
              + " (`python -m analysis render KEY` says more)")
    if refused:
        print(f"error: refused {len(refused)} item(s):\n" + "\n".join(refused), file=sys.stderr)
        return 2
    return 0


def _why_skipped(message: str) -> str:
    if "no rows for any cell" in message:
        return "no rows"
    if "benchmark file" in message:
        return "no benchmark file"
    return message.split(": ", 1)[-1].split(";")[0][:80]


def cmd_bench(args) -> int:
    from analysis.bench_run import run_files

    return run_files(args.key, args.bench, force=args.force, dry_run=args.dry_run)


def cmd_makefile(args) -> int:
    from analysis.makefile import generate

    sys.stdout.write(generate())
    return 0


HANDLERS = {"list": cmd_list, "status": cmd_status, "run": cmd_run, "export": cmd_export, "render": cmd_render,
            "make": cmd_make, "table": cmd_table, "tables": cmd_tables, "bench": cmd_bench, "makefile": cmd_makefile}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    overrides: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, overrides = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(prog="python -m analysis", description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=list(HANDLERS))
    p.add_argument("key", nargs="?", help="item key (tidal.table1), a benchmark file, or for `table` its number")
    p.add_argument("--profile", default="embedded", choices=catalogue.PROFILES)
    p.add_argument("--paper", default="lychee", choices=list(catalogue.PAPERS))
    p.add_argument("--launcher", default="local", choices=["local", "submitit_local", "slurm"])
    p.add_argument("--results", default="results/runs")
    p.add_argument("--rows", default="results/rows")
    p.add_argument("--bench", default="results/bench")
    p.add_argument("--out", default="results")
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--replace", action="store_true")
    p.add_argument("--force", action="store_true")
    p.add_argument("--jobs", type=int, default=1, help="run: local multiruns at a time, over round-robin shards")
    args = p.parse_args(argv)
    args.overrides = overrides
    if args.command not in ("list", "tables", "makefile") and not args.key:
        p.error(f"{args.command} needs a key")
    if args.command == "table":
        args.number = args.key
    try:
        return HANDLERS[args.command](args)
    except (NotImplementedItem, MissingResults, FewerResults, KeyError, ValueError) as e:
        msg = e.args[0] if e.args else str(e)
        print(f"error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
