"""Decode ms, prefill s and peak GiB of methods side by side in one process: issue 33's timing loop.

    python -m bench.method_speed --model llama3 --weights random --contexts 32768 131072 \\
        --methods full streaming_llm:budget=4096 lm_infinite quest --out results/bench/x.json

Each method is built from its YAML defaults plus the `name:key=value,key=value` overrides; per
(context, method): Engine.reset + one prefill of random tokens (CUDA events), then 8 warm-up decode
steps and 40 timed ones (CUDA events around the 40), and the peak memory of the whole (prefill
included). An out-of-memory (or any error of one configuration) is recorded in its row, not raised:
one bad configuration once lost a whole sweep. The timer, the error text and the clean-up between
configurations are bench/timing.py's, shared with bench/every_method.py. `--profile SPEC@CONTEXT` adds a per-kernel
profile of a few eager decode steps (torch.profiler, no CUDA graph): where a method's step goes.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from omegaconf import OmegaConf

from bench.engine import CONF, load_bench_model, provenance
from bench.timing import Clock, error_text, release
from methods import build
from runners.engine import Engine
from runners.results import environment


def parse_spec(spec: str) -> tuple[str, dict]:
    name, _, rest = spec.partition(":")
    over = OmegaConf.to_container(OmegaConf.from_dotlist(rest.split(","))) if rest else {}
    return name, over


def method_cfg(spec: str):
    name, over = parse_spec(spec)
    return OmegaConf.merge(OmegaConf.load(CONF / "method" / f"{name}.yaml"), over)


def run_one(model, info, ids, spec, warmup, steps, graphs=True):
    release()
    torch.cuda.reset_peak_memory_stats()
    row = {"method": spec}
    eng = None
    timer = Clock(ids.device)
    try:
        eng = Engine(model, build(method_cfg(spec), info), use_graphs=graphs)
        B, L = ids.shape
        eng.reset(B, L + warmup + steps + 8)
        row["prefill_s"] = timer(lambda: eng.prefill(ids))
        tok = ids[:, -1]
        for _ in range(warmup):
            eng.decode(tok)

        def timed():                                # one pair of CUDA events around all the steps
            for _ in range(steps):
                eng.decode(tok)
        row["decode_ms"] = 1e3 * timer(timed) / steps
        row["graphed"] = eng.graphs is not None
    except Exception as e:  # noqa: BLE001 - one bad configuration must not lose the rest of the sweep
        row["error"] = error_text(e)
    finally:
        row["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        if eng is not None:
            eng.close()
        eng = None                                  # (the closures share it) freed before the next one
        release()
    return row


def profile(model, info, ids, spec, steps=3, rows=18):
    eng = Engine(model, build(method_cfg(spec), info), use_graphs=False)
    B, L = ids.shape
    eng.reset(B, L + 16)
    eng.prefill(ids)
    tok = ids[:, -1]
    for _ in range(3):
        eng.decode(tok)
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(steps):
            eng.decode(tok)
        torch.cuda.synchronize()
    kern = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    kern.sort(key=lambda e: -e.self_device_time_total)
    total = sum(e.self_device_time_total for e in kern) / steps / 1e3
    out = {"method": spec, "context": L, "kernel_ms_per_step": total,
           "kernels_per_step": sum(e.count for e in kern) / steps,
           "top": [{"name": e.key[:90], "ms_per_step": e.self_device_time_total / steps / 1e3,
                    "calls_per_step": e.count / steps} for e in kern[:rows]]}
    eng.close()
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama3")
    ap.add_argument("--weights", default="random")
    ap.add_argument("--contexts", type=int, nargs="+", default=[32768])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--methods", nargs="+", default=["full"])
    ap.add_argument("--at", nargs="*", default=[], metavar="SPEC@CONTEXT",
                    help="extra (method, context) pairs beyond the --methods x --contexts grid")
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--profile", nargs="*", default=[], metavar="SPEC@CONTEXT")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    argv = sys.argv[1:] if argv is None else list(argv)
    model, info, device, _ = load_bench_model(args.model, args.weights)
    gen = torch.Generator().manual_seed(0)
    pairs = [(m, c) for c in args.contexts for m in args.methods]
    pairs += [(s.rsplit("@", 1)[0], int(s.rsplit("@", 1)[1])) for s in args.at]
    ids_of = {}
    rows, profiles = [], []
    for spec, ctx in pairs:
        if ctx not in ids_of:
            ids_of[ctx] = torch.randint(0, info.vocab_size, (args.batch, ctx), generator=gen).to(device)
        row = {"context": ctx, "batch": args.batch, **run_one(model, info, ids_of[ctx], spec, args.warmup, args.steps)}
        print(json.dumps(row), flush=True)
        rows.append(row)
    for s in args.profile:
        spec, ctx = s.rsplit("@", 1)
        ids = ids_of.get(int(ctx))
        if ids is None:
            ids = torch.randint(0, info.vocab_size, (args.batch, int(ctx)), generator=gen).to(device)
        try:
            p = profile(model, info, ids, spec)
        except Exception as e:  # noqa: BLE001 - as run_one: keep the sweep
            p = {"method": spec, "context": int(ctx), "error": f"{type(e).__name__}: " + str(e).split("\n")[0][:200]}
        print(json.dumps(p), flush=True)
        profiles.append(p)
    out = {"provenance": provenance("bench.method_speed", argv), "environment": environment(),
           "device": torch.cuda.get_device_name(), "warmup": args.warmup, "steps": args.steps,
           "rows": rows, "profiles": profiles}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
