"""Profile engine decode steps (torch.profiler): where the time goes, by kernel, against the floor.

One method (the original form):
    python -m bench.profile_decode --model llama3 --weights random --context 8192
    python -m bench.profile_decode --model llama3 --weights random --context 131072 --method lychee \
        --set heads=random:0:24 block_size=64

A sweep, one model load, one prefill per (context, method) (issue 33):
    python -m bench.profile_decode --model llama3 --weights random --contexts 32768 131072 \
        --methods full quest tactic:mode=topk,budget=4096 lychee:heads=random:0:24 \
        --alt quest:select_impl=scores_topk
For each (context, method): one prefill, then the graphed decode ms (CUDA events over --timed steps
after --warmup), the same again for each `--alt NAME:attr=value[,attr=value]` applied to the built
method object (timing-only switches a method documents, e.g. an older kernel path kept as an option;
the graph is captured again), then a per-kernel profile of --steps eager steps (no graph: launch gaps
are in the wall time, not in the kernel times) and the floor of bench/floors.py at the measured copy
rate. Kernel totals are per decode step.
"""
from __future__ import annotations

import argparse
import json
import time

import torch
from omegaconf import OmegaConf

from bench import floors
from bench.engine import CONF, Clock, copy_bandwidth, load_bench_model
from methods import build, get
from runners.engine import Engine


def spec_cfg(spec: str):
    name, _, rest = spec.partition(":")
    over = OmegaConf.from_dotlist(rest.split(",")) if rest else OmegaConf.create({})
    return name, OmegaConf.merge(OmegaConf.load(CONF / "method" / f"{name}.yaml"), over)


def kernel_table(prof, steps: int, rows: int) -> tuple[float, float, list[dict]]:
    kern = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    kern.sort(key=lambda e: -e.self_device_time_total)
    total = sum(e.self_device_time_total for e in kern) / steps / 1e3
    count = sum(e.count for e in kern) / steps
    top = [{"kernel": e.key[:80], "ms": round(e.self_device_time_total / steps / 1e3, 4),
            "calls": e.count / steps} for e in kern[:rows]]
    return total, count, top


def time_graphed(eng, tok, warmup: int, timed: int) -> float:
    for _ in range(warmup):
        eng.decode(tok)
    if tok.device.type != "cuda":   # a CPU smoke run
        t = time.perf_counter()
        for _ in range(timed):
            eng.decode(tok)
        return (time.perf_counter() - t) * 1e3 / timed
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(timed):
        eng.decode(tok)
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / timed


def profile_eager(eng, tok, steps: int, rows: int):
    graphs, eng.graphs = eng.graphs, None
    for _ in range(2):
        eng.decode(tok)
    acts = [torch.profiler.ProfilerActivity.CPU] + (
        [torch.profiler.ProfilerActivity.CUDA] if tok.device.type == "cuda" else [])
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(steps):
            eng.decode(tok)
        if tok.device.type == "cuda":
            torch.cuda.synchronize()
    eng.graphs = graphs
    return kernel_table(prof, steps, rows)


_UNSET = object()


def apply_alt(method, alt: dict) -> dict:
    """Set the switches on the method object; returns what to restore (a switch the method reads with
    a getattr default may not exist yet: it is removed again)."""
    old = {k: getattr(method, k, _UNSET) for k in alt}
    for k, v in alt.items():
        if v is _UNSET:
            delattr(method, k)
        else:
            setattr(method, k, v)
    return old


def sweep(args):
    model, info, device, dtype = load_bench_model(args.model, args.weights)
    elt = torch.finfo(dtype).bits // 8
    wbytes = floors.weight_bytes(model, elt)
    bw = copy_bandwidth(device, Clock(device))
    dev_name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(f"device {dev_name} copy rate {bw / 1e12:.2f} TB/s", flush=True)
    alts: dict[str, list[dict]] = {}
    for a in args.alt:
        name, _, rest = a.partition(":")
        alts.setdefault(name, []).append({k: v for k, v in OmegaConf.to_container(
            OmegaConf.from_dotlist(rest.split(","))).items()})
    gen = torch.Generator().manual_seed(0)
    out = []
    for ctx in args.contexts:
        ids = torch.randint(0, info.vocab_size, (args.batch, ctx), generator=gen).to(device)
        tok = ids[:, -1]
        for spec in args.methods:
            name, cfg = spec_cfg(spec)
            row = {"method": spec, "context": ctx, "batch": args.batch}
            eng = None
            try:
                eng = Engine(model, build(cfg, info), use_graphs=True)
                eng.reset(args.batch, ctx + 64 + (args.warmup + args.timed + args.steps + 4) * 8)
                t0 = time.perf_counter()
                eng.prefill(ids)
                if device.type == "cuda":
                    torch.cuda.synchronize()
                row["prefill_s"] = round(time.perf_counter() - t0, 2)
                fl = floors.floor(name, get(name).validate(OmegaConf.to_container(cfg, resolve=True), info),
                                  info, ctx, args.batch, wbytes, elt)
                row["floor_ms"] = round(fl.ms(bw), 3)
                variants = [("default", {})] + [(",".join(f"{k}={v}" for k, v in a.items()), a)
                                                for a in alts.get(name, [])]
                for label, alt in variants:
                    old = apply_alt(eng.method, alt)
                    if eng.graphs is not None:
                        eng.graphs.key = None     # capture again with the switched path
                    ms = time_graphed(eng, tok, args.warmup, args.timed)
                    kms, kn, top = profile_eager(eng, tok, args.steps, args.rows)
                    apply_alt(eng.method, old)
                    v = {"variant": label, "decode_ms": round(ms, 3), "x_floor": round(ms / row["floor_ms"], 3),
                         "graphed": eng.graphs is not None, "kernel_ms": round(kms, 3), "kernels": kn, "top": top}
                    row.setdefault("variants", []).append(v)
                    print(f"== {ctx} {spec} [{label}] decode {ms:.3f} ms (graphed {v['graphed']}), floor "
                          f"{row['floor_ms']:.3f} ms (x{v['x_floor']:.2f}), eager kernel time {kms:.3f} ms, "
                          f"{kn:.0f} kernels/step, prefill {row['prefill_s']} s", flush=True)
                    for t in top:
                        print(f"   {t['ms']:8.4f} ms {t['calls']:6.1f}x  {t['kernel']}", flush=True)
            except Exception as e:  # noqa: BLE001 - one bad configuration must not lose the sweep
                row["error"] = f"{type(e).__name__}: " + str(e).split("\n")[0][:200]
                print(f"== {ctx} {spec} error {row['error']}", flush=True)
            finally:
                if eng is not None:
                    eng.close()
                del eng
                torch.cuda.empty_cache()
            out.append(row)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": dev_name, "copy_tb_s": bw / 1e12, "rows": out}, f, indent=1)


def single(args):
    model, info, device, _ = load_bench_model(args.model, args.weights)
    mcfg_method = OmegaConf.merge(OmegaConf.load(CONF / "method" / f"{args.method}.yaml"),
                                  OmegaConf.from_dotlist(args.set))
    eng = Engine(model, build(mcfg_method, info))
    ids = torch.randint(0, info.vocab_size, (1, args.context), device=device)
    eng.reset(1, args.context + 64)
    eng.prefill(ids)
    tok = ids[:, -1]
    for _ in range(3):
        eng.decode(tok)
    acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else [])
    if args.phase == "prefill":
        args.steps = 1
    with torch.profiler.profile(activities=acts) as prof:
        t0 = time.perf_counter()
        if args.phase == "prefill":
            eng.reset(1, args.context + 64)
            eng.prefill(ids)
        for _ in range(args.steps if args.phase == "decode" else 0):
            eng.decode(tok)
        if device.type == "cuda":
            torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) * 1e3 / args.steps
    key = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=args.rows))
    if device.type == "cuda":
        total, count, _ = kernel_table(prof, args.steps, 0)
        print(f"{args.method} {' '.join(args.set)} @ {args.context}: {args.phase} GPU kernel time {total:.3f} ms/step, "
              f"{count:.0f} kernels/step")
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=args.rows))
    print(f"{args.method} {' '.join(args.set)} @ {args.context}: {args.phase} wall {wall:.1f} ms/step (profiled, eager)")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--weights", default="pretrained")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--method", default="full")
    ap.add_argument("--steps", type=int, default=5, help="profiled eager steps")
    ap.add_argument("--rows", type=int, default=25)
    ap.add_argument("--phase", choices=["decode", "prefill"], default="decode",
                    help="prefill: profile one whole prefill of --context tokens (--steps ignored)")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="method option overrides")
    ap.add_argument("--contexts", type=int, nargs="*", default=None, help="sweep mode: these contexts")
    ap.add_argument("--methods", nargs="*", default=None, metavar="NAME:K=V,K=V", help="sweep mode: these methods")
    ap.add_argument("--alt", nargs="*", default=[], metavar="NAME:ATTR=V", help="sweep: also time with these switches")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--timed", type=int, default=20, help="sweep: graphed steps timed")
    ap.add_argument("--out", default=None, help="sweep: JSON of the rows")
    args = ap.parse_args(argv)
    if args.methods:
        args.contexts = args.contexts or [args.context]
        return sweep(args)
    return single(args)


if __name__ == "__main__":
    main()
