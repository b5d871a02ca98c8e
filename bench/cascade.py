"""Cascading KV Cache latency (the paper's Fig. 6, Tables 6 and 8, and the issue's targets), one JSON
per suite, each recording its one command and commit (bench.engine.provenance):

    python -m bench.cascade layer   --model llama31_8b      one attention layer (the paper's latency job):
        strided prefill of each length through the bounded cache (cascade: 4 cascades; streaming: the
        same with 1 cascade, and the harness's streaming_llm method) vs dense SDPA (flash) prefill of
        the same tokens; and the stride sweep at the largest length (Fig. 6c)
    python -m bench.cascade e2e     --model llama31_8b --weights random --methods cascade streaming
        the whole model (engine): strided prefill seconds per length, then decode ms/token after the
        longest prefill; `--methods full` times dense prefill (lengths that fit) and full decode at the
        cache size (the target: bounded decode at 1M within 1.3x of full decode at the cache size)
    python -m bench.cascade cacheadd                         cache-add operations per token (Fig. 6a):
        the update kernel (4 and 1 cascades), the streaming_llm ring write, and the original
        StreamingLLM's concatenation (StartRecentKVCache: evict + torch.cat) as the paper measured

Times are CUDA-event seconds around whole loops (host work inside them: the prefill plans are built
on the host per chunk). The `layer` suite runs the method objects themselves on random q/k/v of
the model's shapes (rotary embedding of the model), no projections, as the reference's job timed
one attention module.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from omegaconf import OmegaConf

import kernels
from bench.engine import CONF, Clock, load_bench_model, provenance, release
from methods import ModelInfo, Step, build
from methods.parts.rope import Rope
from runners import models
from runners.engine import Engine
from runners.results import environment


def cascade_cfg(cache: int, stride: int, cascades: int, sink: int = 64) -> dict:
    return {"name": "cascade", "sink": sink, "cache_size": cache, "cascades": cascades, "stride": stride}


def streaming_cfg(cache: int, stride: int, sink: int = 64) -> dict:
    return {"name": "streaming_llm", "sink": sink, "window": cache, "stride": stride}


def layer_setup(model_name: str, device, dtype):
    """ModelInfo of one layer of `model_name` and its rotary embedding (no weights needed)."""
    mcfg = OmegaConf.load(CONF / "model" / f"{model_name}.yaml")
    config = models.config_from_arch(mcfg.arch)
    config.num_hidden_layers = 1
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    rotary = LlamaRotaryEmbedding(config).to(device)
    return ModelInfo.from_hf_config(config), Rope(rotary)


def stream_layer(method, info, rope, L: int, stride: int, device, dtype) -> float:
    """Seconds to stream L tokens through one attention layer of `method` in chunks of `stride`."""
    g = torch.Generator(device=device).manual_seed(0)
    H, Hkv, D = info.num_heads, info.num_kv_heads, info.head_dim
    q = torch.randn(1, H, stride, D, device=device, dtype=dtype, generator=g)
    k = torch.randn(1, Hkv, stride, D, device=device, dtype=dtype, generator=g)
    v = torch.randn(1, Hkv, stride, D, device=device, dtype=dtype, generator=g)
    method.setup(info, 1, L, device, dtype)

    def run():
        method.setup(info, 1, L, device, dtype)
        for s in range(0, L, stride):
            T = min(stride, L - s)
            rope.new_step()
            method.begin(Step("prefill", s, T, torch.arange(s, s + T, device=device)))
            method.attend(0, q[:, :, :T], k[:, :, :T], v[:, :, :T], rope)

    return Clock(device)(run)


def dense_layer(info, rope, L: int, device, dtype) -> float:
    """Seconds of dense causal prefill attention of L tokens (rotary + SDPA: the flash kernel)."""
    g = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(1, info.num_heads, L, info.head_dim, device=device, dtype=dtype, generator=g)
    k = torch.randn(1, info.num_kv_heads, L, info.head_dim, device=device, dtype=dtype, generator=g)
    v = torch.randn_like(k)
    pos = torch.arange(L, device=device)

    # At 1M tokens q holds 2^32 elements: FlashAttention-2 faults on tensors over 2^31 elements
    # (Dao-AILab/flash-attention#767). Query chunks under 2^31 elements, each over the keys up to its
    # last position, do the same causal work in a few calls. (The H100 run's illegal memory access is
    # most likely the rope kernel's 32-bit offsets, fixed in kernels/fused.py; not re-run yet.)
    rows = max(1, (2**31 - 1) // (info.num_heads * info.head_dim))

    def run():
        rope.new_step()
        qr, kr = rope.apply(q, pos), rope.apply(k, pos)
        for t0 in range(0, L, rows):
            t1 = min(L, t0 + rows)
            kernels.prefill_attention(qr[:, :, t0:t1], kr[:, :, :t1], v[:, :, :t1], info.scaling)

    return Clock(device)(run)


def suite_layer(args, device, dtype) -> list[dict]:
    info, rope = layer_setup(args.model, device, dtype)
    rows = []
    methods = {"cascade": lambda s: cascade_cfg(args.cache, s, args.cascades),
               "cascade_1": lambda s: cascade_cfg(args.cache, s, 1),
               "streaming_llm": lambda s: streaming_cfg(args.cache, s)}
    for L in args.lengths:
        for name, cfg in methods.items():
            if name == "streaming_llm" and L > args.streaming_max:
                continue
            m = build(OmegaConf.create(cfg(args.stride)), info)
            # warm-up past the cache size: the first eviction JIT-compiles the cascade kernels (a warm-up
            # inside the cache left that in the 32K point of the 16K-cache run: 1.7 s, 20x its neighbours)
            stream_layer(m, info, rope, min(L, args.cache + 2 * args.stride), args.stride, device, dtype)
            rows.append({"suite": "layer", "method": name, "length": L, "cache": args.cache, "stride": args.stride,
                         "seconds": stream_layer(m, info, rope, L, args.stride, device, dtype)})
            print(rows[-1], flush=True)
        if L <= args.dense_max:
            try:
                dense_layer(info, rope, min(L, 16384), device, dtype)                          # warm-up
                rows.append({"suite": "layer", "method": "dense", "length": L, "seconds":
                             dense_layer(info, rope, L, device, dtype)})
            except torch.cuda.OutOfMemoryError:
                rows.append({"suite": "layer", "method": "dense", "length": L, "seconds": None, "oom": True})
            print(rows[-1], flush=True)
            torch.cuda.empty_cache() if device.type == "cuda" else None
    L = max(args.lengths)
    for s in args.strides:
        m = build(OmegaConf.create(cascade_cfg(args.cache, s, args.cascades)), info)
        stream_layer(m, info, rope, min(L, args.cache + 2 * s), s, device, dtype)               # warm-up
        rows.append({"suite": "stride", "method": "cascade", "length": L, "cache": args.cache, "stride": s,
                     "seconds": stream_layer(m, info, rope, L, s, device, dtype)})
        print(rows[-1], flush=True)
    return rows


def suite_e2e(args, device, dtype) -> list[dict]:
    model, info, device, dtype = load_bench_model(args.model, args.weights, args.device, args.dtype)
    clock = Clock(device)
    rows = []
    gen = torch.Generator().manual_seed(0)
    longest = max(args.lengths)
    ids_all = torch.randint(0, info.vocab_size, (1, longest + args.steps + 8), generator=gen).to(device)
    for name in args.methods:
        cfg = {"cascade": cascade_cfg(args.cache, args.stride, args.cascades),
               "streaming": cascade_cfg(args.cache, args.stride, 1),
               "full": {"name": "full", "prefill_chunk": None}}[name]
        eng = Engine(model, build(OmegaConf.create(cfg), info))
        lengths = sorted(L for L in args.lengths if name != "full" or L <= args.dense_max)
        # decode: bounded methods right after their longest prefill; full at the cache size
        ctx = args.cache + 64 if name == "full" else lengths[-1]
        for i, L in enumerate(sorted(set(lengths) | {ctx})):   # `full` past --dense-max: only its decode context
            ids = ids_all[:, :L]

            def prefill():
                eng.reset(1, L + args.steps + 8)
                eng.prefill(ids, logits="none")

            try:
                if i == 0:
                    prefill()                                        # warm-up (compilation, allocator)
                seconds = clock(prefill)
                if L in lengths:
                    rows.append({"suite": "e2e", "method": name, "length": L, "prefill_s": seconds})
            except torch.cuda.OutOfMemoryError:
                rows.append({"suite": "e2e", "method": name, "length": L, "prefill_s": None, "oom": True})
                torch.cuda.empty_cache()
                continue
            if L in lengths:
                print(rows[-1], flush=True)
            if L != ctx:
                continue
            tok = ids_all[:, ctx]
            for _ in range(2):
                eng.decode(tok)

            def decode():
                for _ in range(args.steps):
                    eng.decode(tok)

            ms = 1e3 * clock(decode) / args.steps
            rows.append({"suite": "decode", "method": name, "context": ctx, "ms_per_token": ms,
                         "graphed": eng.graphs is not None})
            print(rows[-1], flush=True)
        release(eng)
    return rows


def suite_cacheadd(args, device, dtype) -> list[dict]:
    """Per-token cache adds of one layer's K and V (Llama-3.1-8B head shapes), nothing else."""
    from kernels.cascade_update import cascade_apply
    from methods.parts.stores import SinkRingStore
    from methods.parts.stores_cascade import CascadeLayout, CascadeStore

    Hkv, D, S, C, n = 8, 128, 64, args.cache, args.tokens
    g = torch.Generator(device=device).manual_seed(0)
    new_k = torch.randn(n, 1, Hkv, 1, D, device=device, dtype=dtype, generator=g)
    clock = Clock(device)
    rows = []
    for cascades in (args.cascades, 1):
        L = CascadeLayout(S, cascades, C // cascades)
        store = CascadeStore()
        score = torch.zeros(1, Hkv, 1, device=device)
        p = torch.zeros(1, dtype=torch.long, device=device)

        def add_one():                      # the decode path's update: device plan, then the kernel
            plan, _, _, new = L.device_step(store.ctr, p, True)
            cascade_apply(store.k[0], store.v[0], store.score[0], store.tok[0], new_k[0], new_k[0], score, p, plan)
            store.ctr.copy_(new)
            p.add_(1)

        def reset():
            L.reset()
            L.prepare(device)
            store.allocate(1, 1, Hkv, L.slots, D, cascades, device, dtype)
            p.zero_()

        def run():
            reset()
            for _ in range(n):
                add_one()

        run()
        s = clock(run)
        rows.append({"suite": "cacheadd", "method": f"cascade_{cascades}", "graphed": False, "tokens": n, "cache": C,
                     "seconds": s, "us_per_token": 1e6 * s / n})
        print(rows[-1], flush=True)
        if device.type == "cuda":           # as the decode step runs it: one CUDA-graph replay per token
            reset()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                add_one()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                add_one()

            def run_graph():
                reset()
                for _ in range(n):
                    graph.replay()

            run_graph()
            s = clock(run_graph)
            rows.append({"suite": "cacheadd", "method": f"cascade_{cascades}", "graphed": True, "tokens": n,
                         "cache": C, "seconds": s, "us_per_token": 1e6 * s / n})
            print(rows[-1], flush=True)
    ring = SinkRingStore()

    def run_ring():
        ring.allocate(1, 1, Hkv, S, C, D, device, dtype)
        for t in range(n):
            slots, _ = ring.slots(t, t + 1)
            ring.mark(slots, torch.tensor([t], device=device))
            ring.write(0, slots, new_k[t], new_k[t])

    run_ring()
    s = clock(run_ring)
    rows.append({"suite": "cacheadd", "method": "streaming_llm_ring", "tokens": n, "cache": C, "seconds": s,
                 "us_per_token": 1e6 * s / n})
    print(rows[-1], flush=True)

    def run_concat():                      # StartRecentKVCache.evict_for_space + torch.cat, per token
        k = v = torch.empty(1, Hkv, 0, D, device=device, dtype=dtype)
        for t in range(n):
            if k.shape[2] + 1 > S + C:
                k = torch.cat([k[:, :, :S], k[:, :, S + 1:]], 2)
                v = torch.cat([v[:, :, :S], v[:, :, S + 1:]], 2)
            k = torch.cat([k, new_k[t]], 2)
            v = torch.cat([v, new_k[t]], 2)

    run_concat()
    s = clock(run_concat)
    rows.append({"suite": "cacheadd", "method": "streaming_llm_concat", "tokens": n, "cache": C, "seconds": s,
                 "us_per_token": 1e6 * s / n})
    print(rows[-1], flush=True)
    return rows


SUITES = {"layer": suite_layer, "e2e": suite_e2e, "cacheadd": suite_cacheadd}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("suite", choices=list(SUITES))
    ap.add_argument("--model", default="llama31_8b", help="conf/model/<name>.yaml: shapes (and rope)")
    ap.add_argument("--weights", default="random", choices=["pretrained", "random"])
    ap.add_argument("--lengths", type=int, nargs="+", default=[1 << i for i in range(14, 21)])
    ap.add_argument("--cache", type=int, default=32768, help="cascade slots |C| (sinks: 64, on top)")
    ap.add_argument("--cascades", type=int, default=4)
    ap.add_argument("--stride", type=int, default=4096)
    ap.add_argument("--strides", type=int, nargs="*", default=[1024, 2048, 4096, 8192, 16384],
                    help="layer: the stride sweep at the largest length")
    ap.add_argument("--dense-max", type=int, default=1 << 20, help="longest dense prefill tried")
    ap.add_argument("--streaming-max", type=int, default=1 << 20,
                    help="layer: longest length for the streaming_llm method (the harness's own method, whole)")
    ap.add_argument("--methods", nargs="+", default=["cascade", "streaming"], help="e2e: cascade streaming full")
    ap.add_argument("--steps", type=int, default=64, help="e2e: decode steps timed")
    ap.add_argument("--tokens", type=int, default=16384, help="cacheadd: tokens added one at a time")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--out", default=None, help="write the JSON here (default: print only)")
    args = ap.parse_args(argv)
    argv = sys.argv[1:] if argv is None else list(argv)
    device = models.resolve_device(args.device)
    dtype = models.resolve_dtype(args.dtype, device)
    with torch.inference_mode():
        rows = SUITES[args.suite](args, device, dtype)
    out = {**provenance("bench.cascade", argv), "device": environment().get("gpu") or str(device),
           "model": args.model, "dtype": str(dtype), "suite": args.suite, "rows": rows,
           "settings": {k: v for k, v in vars(args).items() if k not in ("out", "suite")}}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1))
        print(f"wrote {args.out}")
    else:
        print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
