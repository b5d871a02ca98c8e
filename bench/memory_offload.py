"""Decode latency and memory vs context, methods side by side (InfLLM's offload, Ltri-LLM's index,
StreamingLLM's bounded cache, dense attention): for each method and context, one prefill of random
tokens then timed decode steps, with the device memory the method holds MEASURED
(torch.cuda.memory_allocated around setup + prefill), its host memory, the peak, and the blocks it
moved host->device per decoded token.

    python -m bench.memory_offload --model llama3 --weights random --layers 4 \
        --lengths 4224 102400 262144 524288 1048576 --methods full infllm infllm:offload=false ltri \
        streaming_llm:sink=128,window=4096 --out results/bench/memory_offload_llama3_h100.json

A method spec is `name[:key=value,...]` (values parsed as YAML). `--layers N` builds the model with N
layers (random weights only): memory per layer is what the methods differ in, and the JSON records N.
The smallest length (default 4224 = InfLLM's 128 sinks + 4096 window) is the baseline at which no
token is evicted: ltri.table4's "GPU memory of evicted tokens" is a method's measured device bytes at
a length minus at that baseline (analysis/papers/ltri_bench.py). A configuration that runs out of
device memory is recorded as {"error": "OOM"} and the sweep goes on.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch
import yaml
from omegaconf import OmegaConf

from bench.engine import CONF, Clock, provenance, release
from methods import ModelInfo, build
from runners import models
from runners.engine import Engine
from runners.results import environment


def parse_spec(spec: str) -> dict:
    """'infllm:offload=false,topk=8' -> {"name": "infllm", "offload": False, "topk": 8}."""
    name, _, rest = spec.partition(":")
    cfg = {"name": name}
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        cfg[key.strip()] = yaml.safe_load(value)
    return cfg


def load_model(name: str, weights: str, layers: int | None, device, dtype):
    mcfg = OmegaConf.load(CONF / "model" / f"{name}.yaml")
    mcfg.weights = weights
    if layers:
        if weights != "random":
            raise SystemExit("error: --layers needs --weights random (a pretrained model keeps its layers)")
        mcfg.arch.num_hidden_layers = layers
    model, _ = models.load(mcfg, device, dtype)
    return model, ModelInfo.from_hf_config(model.config)


def tensor_bytes(method) -> tuple[int, int]:
    """(device bytes, host bytes) of every buffer a method declares."""
    dev = host = 0
    for t in method.buffers().values():
        if t is None:
            continue
        n = t.numel() * t.element_size()
        if t.is_cuda:
            dev += n
        else:
            host += n
    return dev, host


def measure(model, info, spec: dict, context: int, steps: int, clock, device, setup_only: bool = False) -> dict:
    row = {"method": spec["name"], "spec": spec, "context": context, "measured_after": "setup" if setup_only
           else "prefill"}
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated() if cuda else 0
    eng = None
    try:
        method = build(OmegaConf.create(spec), info)
        eng = Engine(model, method)
        ids = torch.randint(0, info.vocab_size, (1, context), generator=torch.Generator().manual_seed(0)).to(device)
        eng.reset(1, context + steps + 4)
        if setup_only:   # a store preallocated for the context holds it all from setup on: no prefill needed
            row["device_bytes_allocated"] = (torch.cuda.memory_allocated() - base) if cuda else None
            row["method_device_bytes"], row["method_host_bytes"] = tensor_bytes(method)
            return row
        row["prefill_s"] = clock(lambda: eng.prefill(ids, logits="none"))
        row["device_bytes_allocated"] = (torch.cuda.memory_allocated() - base) if cuda else None
        row["method_device_bytes"], row["method_host_bytes"] = tensor_bytes(method)
        tok = ids[:, -1]
        for _ in range(2):                                   # warm-up (graph capture, allocator)
            eng.decode(tok)
        loads0 = method.stats().get("block_loads", 0)
        times = [clock(lambda: eng.decode(tok)) for _ in range(steps)]
        st = method.stats()
        row.update(decode_ms_median=1e3 * statistics.median(times), decode_ms_mean=1e3 * statistics.mean(times),
                   block_loads_per_token=(st.get("block_loads", 0) - loads0) / steps,
                   attended_mean=st.get("attended_mean"),
                   device_peak_bytes=(torch.cuda.max_memory_allocated() - base) if cuda else None)
        for key in ("blocks", "index_vectors", "spans"):
            if key in st:
                row[key] = st[key]
    except torch.cuda.OutOfMemoryError:
        row["error"] = "OOM"
    finally:
        if eng is not None:
            release(eng)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama3", help="a conf/model/*.yaml (llama3: 1M positions)")
    ap.add_argument("--weights", default="random", choices=["pretrained", "random"])
    ap.add_argument("--layers", type=int, default=None, help="build the model with this many layers (random)")
    ap.add_argument("--lengths", type=int, nargs="+", default=[4224, 102400, 262144, 524288, 1048576])
    ap.add_argument("--methods", nargs="+", default=["full", "infllm", "infllm:offload=false", "ltri",
                                                     "streaming_llm:sink=128,window=4096"])
    ap.add_argument("--steps", type=int, default=16, help="decode steps timed (each one separately)")
    ap.add_argument("--setup-only", nargs="*", default=[], help="method names measured after setup, without a "
                    "prefill (stores preallocated for the context, e.g. full: its memory is there from setup)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--out", default=None, help="write the JSON here (default: print only)")
    args = ap.parse_args(argv)
    argv = sys.argv[1:] if argv is None else list(argv)
    device = models.resolve_device(args.device)
    dtype = models.resolve_dtype(args.dtype, device)
    model, info = load_model(args.model, args.weights, args.layers, device, dtype)
    clock = Clock(device)
    rows = []
    for spec in map(parse_spec, args.methods):
        for L in sorted(args.lengths):
            row = measure(model, info, spec, L, args.steps, clock, device, setup_only=spec["name"] in args.setup_only)
            rows.append(row)
            print(json.dumps(row), flush=True)
    env = environment()
    out = {"bench": "memory_offload", **provenance("bench.memory_offload", argv), "model": args.model,
           "weights": args.weights, "layers": info.num_layers, "dtype": str(dtype),
           "device": env.get("gpu", "cpu"), "steps": args.steps, "baseline_context": min(args.lengths),
           "environment": env, "rows": rows}
    print(f"\n{'method':>32} {'context':>8} {'dev MiB':>9} {'host MiB':>9} {'ms/tok':>8} {'loads/tok':>9}")
    for r in rows:
        label = ",".join(f"{k}={v}" for k, v in r["spec"].items() if k != "name") or "-"
        label = f"{r['method']}({label})"[:32]
        if "error" in r:
            print(f"{label:>32} {r['context']:>8} {r['error']:>9}")
            continue
        dev = (r["device_bytes_allocated"] or r["method_device_bytes"]) / 2**20
        print(f"{label:>32} {r['context']:>8} {dev:>9.1f} {r['method_host_bytes'] / 2**20:>9.1f} "
              f"{r.get('decode_ms_median', float('nan')):>8.2f} {r.get('block_loads_per_token', float('nan')):>9.2f}")
    if args.out:
        path = Path(args.out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out, indent=2))
        print(f"wrote {path}")
    else:
        print("(not written: pass --out FILE to keep the JSON)")


if __name__ == "__main__":
    main()
