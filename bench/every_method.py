"""Every registered method's decode cost in one process (issue 34's one table, harness.tpot): per
(context x batch) cell, decode ms/token, its floor (bench/floors.py) and the ratio, the speed-up over
full attention measured in the same process, prefill seconds and peak GPU memory.

    python -m bench.every_method --cells 131072x1 --shard 1/2 --out results/bench/every_method_llama3_128k_s1of2_h100.json

(harness.tpot reads one file per cell, two for 128K: analysis/papers/harness.py FILES names each one's command.)

No hand-written method list: the registry is iterated (`methods.REGISTRY`), each method with its YAML
defaults and its budget option set to --budget (methods/parts/budget.py BUDGET_KNOB: budget, cache_size,
local_branch, n_local; Tactic in top-k mode). A method whose `heads: auto` file does not exist for
the model (DuoAttention, LycheeDecode on Llama-3-8B) runs with --random-heads (`random:0:24`: layer 0's
KV heads for LycheeDecode, which forces them, plus 24 drawn at random, the paper's 32 of 256; random
weights have no trained heads and the cost does not depend on which heads they are); MInference reads
methods/patterns/<model>.json. What each ran with is in its row (`semantics`, `heads`).

Timing: the engine as `run.py` uses it (CUDA graphs where the method is graph-safe; the row says), one
prefill per cell timed with CUDA events, --warmup decode steps, then --steps decode steps each timed
with CUDA events: the median. Before its first cell each method runs a short prefill and decode twice,
untimed (the first compiles Triton kernels and captures graphs). Cells run in the order given; in each, full
attention first, then the methods by their second short run's prefill time, cheapest first (a time budget
then covers the most methods). A failure (out of memory, an error) is a row with the error, not a dropped
method. The file is rewritten after every row (`complete` false until the end): a call cut by its time limit
keeps the rows that ran, the others skipped rows that say so.
BENCH_TIME_BUDGET (seconds, default 540: one device call): a cell whose projected prefill (this method's
time on the first cell, or on its short run, projected by `project`) would end past it is recorded as
skipped, with why. The whole table needs more than one 10-minute call today (prefills at 128K of
15-170 s per method): run it where a call may take longer, with the budget raised.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import yaml
from omegaconf import OmegaConf

from bench import floors
from bench.engine import copy_bandwidth, load_bench_model, provenance
from bench.timing import Clock, error_text, release
from common.errors import ConfigError
from methods import REGISTRY, build, get
from runners.engine import Engine
from runners.results import environment

GIB = 2 ** 30


def h2d_bandwidth(device, clock, nbytes: int = 1 << 28, repeat: int = 5) -> float:
    """Bytes/s of a large copy from pinned host memory to `device`, median of `repeat`: the rate an
    offloaded memory's moves are floored at (bench/floors.py)."""
    src = torch.ones(nbytes // 4, dtype=torch.float32).pin_memory()
    dst = torch.empty(src.shape, dtype=src.dtype, device=device)
    dst.copy_(src, non_blocking=True)                        # warm-up
    return nbytes / clock(lambda: dst.copy_(src, non_blocking=True), repeat)


def project(method_s: float, full_s: float, full_at_cell_s: float, tokens: int, cell_tokens: int) -> float:
    """A method's prefill at a cell, from its prefill and full attention's on a shorter run and full's at the
    cell: the part it shares with full scales as full's did (attention: quadratic), what it spends beyond
    full per token (pattern estimation, span work, score passes) linearly. Scaling the whole of it as full's
    projected MInference's ~20-s prefill at 128K to 148 s from a 2K run (its fixed cost times full's 170x)
    and skipped the row."""
    shared = min(method_s, full_s) / full_s * full_at_cell_s
    return shared + max(0.0, method_s - full_s) * cell_tokens / tokens


def method_cfg(name: str, budget: int, model: str, random_heads: str, info) -> tuple[dict, str]:
    """(config dict, heads note): YAML defaults, the budget option at `budget`, model-named files."""
    cfg = {"name": name, **get(name).Config.defaults(), **floors.BUDGET_KNOB[name](budget)}
    for key in ("head_model", "pattern_model"):
        if key in cfg:
            cfg[key] = model
    note = ""
    if cfg.get("heads") == "auto":
        try:
            get(name).validate(dict(cfg), info)
            note = f"auto ({model} head file)"
        except ConfigError:
            cfg["heads"], note = random_heads, f"{random_heads} (no {model} head file)"
    if cfg.get("reselect_layer") is not None:
        cfg["reselect_layer"] = min(int(cfg["reselect_layer"]), info.num_layers - 1)
    return cfg, note


def run_cell(model, info, cfg: dict, ids, warmup: int, steps: int, timer: Clock, device) -> dict:
    """One engine at one (context, batch): prefill s, median decode ms, peak GiB, stats."""
    B, C = ids.shape
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    eng = Engine(model, build(OmegaConf.create(cfg), info), use_graphs=True)
    try:
        eng.reset(B, C + warmup + steps + 8)
        prefill_s = timer(lambda: eng.prefill(ids))
        if warmup == steps == 0:      # the ordering run: its prefill only
            return {"prefill_s": prefill_s}
        tok = ids[:, -1]
        # the first step also captures the graph and runs work a method does once before decoding
        # (Tactic clusters the prompt's keys there): not in prefill_s, so it is kept on its own
        first_s = timer(lambda: eng.decode(tok))
        for _ in range(warmup - 1):
            eng.decode(tok)
        staged = eng.method.stats().get("staged_bytes")   # an offloaded memory's host-to-device bytes so far
        per_step = [timer(lambda: eng.decode(tok)) for _ in range(steps)]
        stats = eng.method.stats()
        out = {"prefill_s": prefill_s, "first_decode_s": first_s, "decode_ms": 1e3 * statistics.median(per_step),
               "decode_ms_min": 1e3 * min(per_step), "decode_ms_max": 1e3 * max(per_step),
               "graphs": eng.graphs is not None, "attended_mean": stats.get("attended_mean")}
        if staged is not None and steps:
            out["moved_bytes_per_step"] = (stats["staged_bytes"] - staged) / steps
        if device.type == "cuda":
            torch.cuda.synchronize()
            out["peak_gib"] = torch.cuda.max_memory_allocated() / GIB
        return out
    finally:
        eng.close()
        release()


def write(path: str, head: dict, rows: list, cells, names, t_start: float, done: bool) -> None:
    """The file, rewritten after every row: a call cut by its time limit leaves the rows that ran, the rest
    listed as skipped (`complete` false); speed-ups over full attention of the same cell."""
    rows = [dict(r) for r in rows]
    seen = {(r["method"], r["context"], r["batch"]) for r in rows}
    if not done:
        rows += [{"method": n, "context": C, "batch": B, "status": "skipped",
                  "error": "not run: the call ended before this row"}
                 for C, B in cells for n in names if (n, C, B) not in seen]
    for r in rows:
        ref = next((f for f in rows if f["method"] == "full" and f["context"] == r["context"]
                    and f["batch"] == r["batch"] and f["status"] == "ok"), None)
        if r["status"] == "ok" and ref:
            r["speedup_vs_full"] = ref["decode_ms"] / r["decode_ms"]
            r["prefill_vs_full"] = r["prefill_s"] / ref["prefill_s"]
    out = {**head, "elapsed_s": time.time() - t_start, "complete": done, "rows": rows}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(path).with_suffix(".part")
    tmp.write_text(json.dumps(out, indent=2))
    tmp.replace(path)


def parse_cell(s: str) -> tuple[int, int]:
    c, _, b = s.lower().partition("x")
    return int(c), int(b or 1)


def parse_variant(spec: str, registered) -> tuple[str, tuple[str, dict]]:
    """'infllm:offload=false,topk=8' -> ('infllm:offload=false,topk=8', ('infllm', {'offload': False, 'topk': 8}))."""
    name, _, opts = spec.partition(":")
    if name not in registered:
        raise ValueError(f"--variants {spec}: unknown method {name!r}")
    pairs = [kv.partition("=") for kv in opts.split(",") if kv]
    if not pairs or any(not k or not eq for k, eq, _ in pairs):
        raise ValueError(f"--variants {spec}: expected NAME:KEY=VALUE[,KEY=VALUE]")
    return spec, (name, {k: yaml.safe_load(v) for k, _, v in pairs})


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama3")
    ap.add_argument("--weights", default="random", choices=["pretrained", "random"])
    ap.add_argument("--cells", nargs="+", default=["32768x1", "131072x1", "32768x8"],
                    help="CONTEXTxBATCH, run in this order")
    ap.add_argument("--budget", type=int, default=4096, help="tokens per head (methods/parts/budget.py BUDGET_KNOB)")
    ap.add_argument("--methods", nargs="+", default=None, help="a subset (default: every registered method)")
    ap.add_argument("--variants", nargs="+", default=[], metavar="NAME:KEY=VALUE[,KEY=VALUE]",
                    help="extra rows: a registered method with options over its YAML defaults, e.g. "
                    "infllm:offload=false (the row's method is the whole spec)")
    ap.add_argument("--shard", default="1/1", metavar="K/N",
                    help="the K-th of N parts of the rows (every N-th from the K-th, registry order, variants last); "
                    "full attention is in every part, the reference of its speed-ups: a 128K cell of every "
                    "method needs more than one 10-minute call")
    ap.add_argument("--random-heads", default="random:0:24")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    argv = sys.argv[1:] if argv is None else list(argv)
    t_start = time.time()
    # an env var, not an option: the file's command (its identity for the catalogue) stays the same
    # whatever time a device call leaves; the rows say which cells it skipped
    time_budget = float(os.environ.get("BENCH_TIME_BUDGET", "540"))
    names = REGISTRY.names()
    if args.methods:
        unknown = sorted(set(args.methods) - set(names))
        if unknown:
            sys.exit(f"error: unknown method(s) {', '.join(unknown)}; registered: {', '.join(names)}")
        names = [n for n in names if n in args.methods]
    names = ["full"] + [n for n in names if n != "full"]
    try:
        variants = dict(parse_variant(v, REGISTRY.names()) for v in args.variants)
    except ValueError as e:
        sys.exit(f"error: {e}")
    names += list(variants)
    try:
        k, n = (int(x) for x in args.shard.split("/"))
        assert 1 <= k <= n
    except (ValueError, AssertionError):
        sys.exit(f"error: --shard {args.shard}: expected K/N with 1 <= K <= N")
    names = ["full"] + [m for i, m in enumerate(names[1:]) if i % n == k - 1]
    base = {**{n: n for n in names if n not in variants}, **{k: b for k, (b, _) in variants.items()}}
    cells = [parse_cell(c) for c in args.cells]

    model, info, device, dtype = load_bench_model(args.model, args.weights)
    elt = torch.finfo(dtype).bits // 8
    wbytes = floors.weight_bytes(model, elt)
    if device.type == "cuda":   # a cold GPU's first copies read low (2.30 vs 2.74 TB/s in two runs): warm it first
        copy_bandwidth(device, Clock(device))
    bandwidth = copy_bandwidth(device, Clock(device)) if device.type == "cuda" else floors.H100_BANDWIDTH
    h2d = h2d_bandwidth(device, Clock(device)) if device.type == "cuda" else floors.H2D_BANDWIDTH
    timer = Clock(device)
    gen = torch.Generator().manual_seed(0)
    cfgs, broken, rows, warm_prefill = {}, {}, [], {}
    warm_tokens = min(2048, cells[0][0])
    for name in names:                   # configs and a short untimed run (compilation, graph capture)
        try:
            cfg, note = method_cfg(base[name], args.budget, args.model, args.random_heads, info)
            cfgs[name] = ({**cfg, **variants[name][1]} if name in variants else cfg), note
            warm_ids = torch.randint(0, info.vocab_size, (1, warm_tokens), generator=gen).to(device)
            # twice: the first run compiles (Triton) and captures, so its prefill says little of the method's
            # cost (Ltri-LLM's host-bound 212-s prefill at 128K ran before 30-s ones, 2026-11-28); the second
            # orders the rows and projects their prefill at the cell
            run_cell(model, info, cfgs[name][0], warm_ids, 1, 1, timer, device)
            warm_prefill[name] = run_cell(model, info, cfgs[name][0], warm_ids, 0, 0, timer, device)["prefill_s"]
        except Exception as e:  # noqa: BLE001 - every failure becomes a row, not a crash
            broken[name] = error_text(e)
            release()
        print(f"warm {name}: {broken.get(name, 'ok')}", flush=True)

    env = environment()
    head = {"bench": "every_method", **provenance("bench.every_method", argv), "model": args.model,
            "weights": args.weights, "dtype": str(dtype), "device": env.get("gpu", "cpu"),
            "cells": [list(c) for c in cells], "shard": args.shard, "budget": args.budget,
            "budget_knob": floors.KNOB_NOTE, "warmup": args.warmup, "steps": args.steps, "time_budget_s": time_budget,
            "bandwidth_bytes_s": bandwidth,
            "bandwidth_source": "measured copy" if device.type == "cuda" else "assumed H100 3.0 TB/s",
            "h2d_bytes_s": h2d, "h2d_source": "measured pinned copy" if device.type == "cuda" else "assumed 50 GB/s",
            "weights_gb": wbytes / 1e9, "peak_note": "peak GiB = torch.cuda.max_memory_allocated over the cell "
            "(weights included), reset before each cell", "methods": names, "environment": env}
    first_prefill, full_prefill = {}, {}
    write(args.out, head, rows, cells, names, t_start, done=False)
    for C, B in cells:
        ids = torch.randint(0, info.vocab_size, (B, C), generator=gen).to(device)
        # full first, then the cheapest prefills (the untimed short run's): a budget covers the most methods
        order = ["full"] + sorted((n for n in names if n != "full"), key=lambda n: warm_prefill.get(n, float("inf")))
        for name in order:
            cfg, heads = cfgs.get(name, ({"name": name}, ""))
            row = {"method": name, "context": C, "batch": B, "heads": heads,
                   "semantics": {k: v for k, v in cfg.items() if k != "name"}}
            left = time_budget - (time.time() - t_start)
            guess = None          # this method's prefill on the first cell (else on the short run), projected
            if name in first_prefill and full_prefill.get((C, B)) and full_prefill.get(cells[0]):
                guess = project(first_prefill[name], full_prefill[cells[0]], full_prefill[(C, B)],
                                cells[0][0] * cells[0][1], C * B)
            elif name in warm_prefill and full_prefill.get((C, B)) and warm_prefill.get("full"):
                guess = project(warm_prefill[name], warm_prefill["full"], full_prefill[(C, B)], warm_tokens, C * B)
            if name in broken:
                row.update(status="error", error=broken[name])
            elif left <= 0 or (guess is not None and guess > left):
                why = f"projected prefill {guess:.0f} s" if guess is not None else "time budget spent"
                row.update(status="skipped", error=f"not run: {why}, {max(left, 0):.0f} s of BENCH_TIME_BUDGET left")
            else:
                try:
                    row.update(status="ok", **run_cell(model, info, cfg, ids, args.warmup, args.steps, timer, device))
                except Exception as e:  # noqa: BLE001
                    row.update(status="error", error=error_text(e))
                    release()
            if row["status"] == "ok":
                first_prefill.setdefault(name, row["prefill_s"])
                if name == "full":
                    full_prefill[(C, B)] = row["prefill_s"]
                tcfg = get(base[name]).validate(dict(cfg), info)
                fl = floors.floor(base[name], tcfg, info, C, B, wbytes, elt, attended=row.get("attended_mean"),
                                  moved=row.get("moved_bytes_per_step"))
                row.update(fl.as_dict(bandwidth, h2d))
                row["over_floor"] = row["decode_ms"] / row["floor_ms"]
            rows.append(row)
            write(args.out, head, rows, cells, names, t_start, done=False)
            print(f"{C:>7} x{B} {name:>18s} " + (
                f"{row['decode_ms']:8.2f} ms  x{row['over_floor']:4.2f} floor  prefill {row['prefill_s']:6.2f} s  "
                f"peak {row.get('peak_gib', float('nan')):5.1f} GiB  graphs {row['graphs']}"
                if row["status"] == "ok" else f"{row['status']}: {row['error']}"), flush=True)
        del ids
        release()
    write(args.out, head, rows, cells, names, t_start, done=True)
    print(f"wrote {args.out} ({time.time() - t_start:.0f} s)")


if __name__ == "__main__":
    main()
