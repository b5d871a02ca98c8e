"""Engine vs the HF model's own forward with a StaticCache: prefill tokens/s and decode ms/token,
same model, same inputs, measured side by side in one run.

    python -m bench.engine                                  # SmolLM2 at 4K on this machine
    python -m bench.engine --model llama3 --weights random --lengths 8192 32768 131072   # GPU

Prints every figure; with --out FILE also writes them as JSON (device, commit, the command, and the
bandwidth floor: weights + KV bytes read per decode step over --bandwidth, by default the copy rate
measured on this device at start). Committed numbers go to results/bench/ through the command the
analysis catalogue declares for them (`python -m analysis bench FILE`), never by default.
"""
from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

import torch
from omegaconf import OmegaConf

from bench.timing import Clock  # re-exported: the benchmarks import it from here
from methods import ModelInfo, build
from runners import models
from runners.engine import Engine
from runners.results import environment, git_commit

CONF = Path(__file__).resolve().parents[1] / "conf"


def copy_bandwidth(device, clock, nbytes: int = 1 << 28, repeat: int = 5) -> float:
    """Bytes/s of a large copy on `device` (each byte read once and written once), median of
    `repeat`: the memory rate the floor divides by, measured here rather than assumed (an H100's
    3.0 TB/s on a CPU made the floor 100x too low)."""
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)                                           # warm-up (allocation, first touch)
    seconds = clock(lambda: dst.copy_(src), repeat)
    return 2 * nbytes / seconds


def provenance(module: str, argv: list[str]) -> dict:
    """How a benchmark JSON was made: the one command (minus --out: where the file goes does not
    change its numbers), the commit, and whether tracked files had uncommitted changes (None when
    there is no git here, e.g. a copy of the tree on the GPU machine with HARNESS_COMMIT set)."""
    args, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--out":
            skip = True
        elif not a.startswith("--out="):
            args.append(a)
    dirty = None
    try:
        r = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=CONF.parent,
                           check=False, capture_output=True, text=True, timeout=10)
        dirty = bool(r.stdout.strip()) if r.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        pass
    return {"command": " ".join(["python", "-m", module, *map(shlex.quote, args)]), "commit": git_commit(),
            "dirty": dirty}


def floor_ms(model, info: ModelInfo, context: int, batch: int, dtype, bandwidth: float) -> dict:
    """Bytes a decode step must read at least: every weight once plus the whole KV cache."""
    elt = torch.finfo(dtype).bits // 8
    weights = sum(p.numel() for p in model.parameters()) * elt  # a tied head is counted once, as read
    kv = 2 * info.num_layers * batch * info.num_kv_heads * context * info.head_dim * elt
    return {"weights_gb": weights / 1e9, "kv_gb": kv / 1e9, "floor_ms": 1e3 * (weights + kv) / bandwidth}


def load_bench_model(name: str, weights: str, device: str = "auto", dtype: str = "auto"):
    """(model, info, device, dtype) for conf/model/<name>.yaml with `weights` pretrained|random."""
    dev = models.resolve_device(device)
    dt = models.resolve_dtype(dtype, dev)
    mcfg = OmegaConf.load(CONF / "model" / f"{name}.yaml")
    mcfg.weights = weights
    model, _ = models.load(mcfg, dev, dt)
    return model, ModelInfo.from_hf_config(model.config), dev, dt


def bench_engine(model, info, ids, steps, clock, repeat, graphs=True, method_cfg=None, time_prefill=True):
    """(prefill seconds or None, decode ms/token) of the engine with `method_cfg` (default full)."""
    cfg = OmegaConf.create(method_cfg or {"name": "full", "prefill_chunk": None})
    eng = Engine(model, build(cfg, info), use_graphs=graphs)
    B, L = ids.shape
    tok = ids[:, -1]

    def prefill():
        eng.reset(B, L + steps + 8)
        eng.prefill(ids)

    prefill_s = None
    if time_prefill:
        prefill()  # warm-up (kernel selection, allocator)
        prefill_s = clock(prefill, repeat)

    def decode():
        for _ in range(steps):
            eng.decode(tok)

    prefill()
    for _ in range(2):
        eng.decode(tok)
    decode_s = clock(decode, 1)
    release(eng)
    return prefill_s, 1e3 * decode_s / steps


def release(eng) -> None:
    """Free an engine's KV storage and graph pool now, so the next configuration of a sweep finds
    the memory (100K-token caches are ~13 GB each) in the allocator and in nvidia-smi."""
    eng.close()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def bench_hf(model, ids, steps, clock, repeat):
    from transformers import StaticCache

    _, L = ids.shape
    dev = ids.device
    state = {}

    def prefill():
        cache = StaticCache(config=model.config, max_cache_len=L + steps + 8)
        state["cache"] = cache
        with torch.inference_mode():
            model(ids, past_key_values=cache, cache_position=torch.arange(L, device=dev), logits_to_keep=1,
                  use_cache=True)

    prefill()  # warm-up
    prefill_s = clock(prefill, repeat)
    tok = ids[:, -1:]

    def decode():
        with torch.inference_mode():
            for i in range(steps):
                pos = torch.tensor([L + i], device=dev)
                model(tok, past_key_values=state["cache"], cache_position=pos, use_cache=True)

    prefill()
    decode_s = clock(decode, 1)
    state.clear()  # drop the StaticCache before the next configuration allocates its own
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return prefill_s, 1e3 * decode_s / steps


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2", help="name of a conf/model/*.yaml")
    ap.add_argument("--weights", default="pretrained", choices=["pretrained", "random"])
    ap.add_argument("--lengths", type=int, nargs="+", default=[4096])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=32, help="decode steps timed per length")
    ap.add_argument("--repeat", type=int, default=1, help="prefill repeats (median)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--skip-hf", action="store_true", help="only the engine (e.g. when HF would not fit)")
    ap.add_argument("--bandwidth", type=float, default=None,
                    help="bytes/s for the floor (default: a copy measured on this device at start)")
    ap.add_argument("--out", default=None, help="write the JSON here (default: print only)")
    args = ap.parse_args(argv)
    argv = sys.argv[1:] if argv is None else list(argv)

    model, info, device, dtype = load_bench_model(args.model, args.weights, args.device, args.dtype)
    model.config._attn_implementation = "sdpa"
    clock = Clock(device)
    bandwidth = args.bandwidth or copy_bandwidth(device, clock)
    gen = torch.Generator(device="cpu").manual_seed(0)
    rows = []
    for L in args.lengths:
        ids = torch.randint(0, info.vocab_size, (args.batch, L), generator=gen).to(device)
        row = {"context": L, "batch": args.batch, **floor_ms(model, info, L, args.batch, dtype, bandwidth)}
        pf, dec = bench_engine(model, info, ids, args.steps, clock, args.repeat)
        row.update(engine_prefill_tok_s=args.batch * L / pf, engine_decode_ms=dec)
        if device.type == "cuda":  # the same engine without CUDA graphs: what the capture buys
            _, dec_eager = bench_engine(model, info, ids, args.steps, clock, 1, graphs=False)
            row.update(engine_eager_decode_ms=dec_eager)
        if not args.skip_hf:
            pf_hf, dec_hf = bench_hf(model, ids, args.steps, clock, args.repeat)
            row.update(hf_prefill_tok_s=args.batch * L / pf_hf, hf_decode_ms=dec_hf,
                       decode_speedup=dec_hf / dec, prefill_speedup=pf_hf / pf)
        row["engine_over_floor"] = row["engine_decode_ms"] / row["floor_ms"]
        rows.append(row)
        print(json.dumps(row), flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()

    env = environment()
    out = {"bench": "engine_vs_hf_static_cache", **provenance("bench.engine", argv), "model": args.model,
           "weights": args.weights, "dtype": str(dtype), "device": env.get("gpu", "cpu"),
           "torch_threads": torch.get_num_threads(), "steps": args.steps, "bandwidth_bytes_s": bandwidth,
           "bandwidth_source": "--bandwidth" if args.bandwidth else "measured copy", "environment": env,
           "rows": rows}
    print(f"\n{'context':>8} {'engine ms/tok':>14} {'hf ms/tok':>10} {'floor ms':>9} {'engine tok/s':>13} {'hf tok/s':>10}")
    for r in rows:
        print(f"{r['context']:>8} {r['engine_decode_ms']:>14.2f} {r.get('hf_decode_ms', float('nan')):>10.2f} "
              f"{r['floor_ms']:>9.2f} {r['engine_prefill_tok_s']:>13.0f} {r.get('hf_prefill_tok_s', float('nan')):>10.0f}")
    print(f"floor at {bandwidth / 1e9:.1f} GB/s ({out['bandwidth_source']})")
    if args.out:
        path = Path(args.out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out, indent=2))
        print(f"wrote {path}")
    else:
        print("(not written: pass --out FILE to keep the JSON)")


if __name__ == "__main__":
    main()
