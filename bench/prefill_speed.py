"""Prefill seconds of methods side by side in one process (issue 34), and one layer's prefill stages.

    python -m bench.prefill_speed --model llama3 --weights random --contexts 32768 131072 \\
        --methods full bigbird h2o minference:pattern_model=llama3 duo:heads=random:0:128 \\
        --stages 32768 131072 --out results/bench/x.json

Per (context, method), methods built as bench.method_speed builds them (YAML defaults + `name:key=value`
overrides): one untimed prefill of `--warm` tokens (Triton compilation, allocator), then Engine.reset and
one timed prefill of random tokens (CUDA events), and the peak memory of the timed prefill. `--stages`
times, on one layer's random q, k, v at the model's shape (CUDA events, least of 2): SDPA's causal
prefill (full attention), H2O's attention + column sums (kernels.causal_attention_mass) and the old two-pass
attention_mass, and MInference's three stages on the model's pattern file (index estimation, list build,
kernel) with the density its lists give.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

import kernels
from bench.engine import load_bench_model, provenance
from bench.method_speed import method_cfg
from bench.timing import Clock
from kernels import block_sparse_prefill as KM
from kernels import mass_prefill as MP
from methods import build
from methods.parts import minference_patterns as P
from runners.engine import Engine
from runners.results import environment


def timed(fn, repeat=2):
    """Seconds of fn (CUDA events): the least of `repeat` calls (the first may compile Triton kernels)."""
    timer = Clock(torch.device("cuda"))
    return min(timer(fn) for _ in range(repeat))


def prefill_row(model, info, ids, spec, warm):
    torch.cuda.empty_cache()
    row = {"method": spec, "context": ids.shape[1]}
    eng = None
    try:
        eng = Engine(model, build(method_cfg(spec), info), use_graphs=False)
        eng.reset(ids.shape[0], ids.shape[1] + 8)
        eng.prefill(ids[:, :warm])
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        eng.reset(ids.shape[0], ids.shape[1] + 8)
        row["prefill_s"] = timed(lambda: eng.prefill(ids), repeat=1)
    except Exception as e:  # noqa: BLE001 - one bad configuration must not lose the rest
        row["error"] = f"{type(e).__name__}: " + str(e).split("\n")[0][:200]
    finally:
        row["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
        if eng is not None:
            eng.close()
    return row


def stages(info, N, layer=20):
    """One layer at N tokens: seconds per stage (least of 2)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    Hq, Hkv, D = info.num_heads, info.num_kv_heads, info.head_dim
    q = torch.randn(1, Hq, N, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(1, Hkv, N, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(1, Hkv, N, D, device="cuda", dtype=torch.bfloat16, generator=g)
    s = info.scaling
    row = {"context": N, "layer": layer}
    row["full_sdpa_s"] = timed(lambda: kernels.prefill_attention(q, k, v, s))
    row["h2o_attention_and_mass_s"] = timed(lambda: kernels.causal_attention_mass(q, k, v, s))
    row["h2o_mass_pass_only_s"] = row["h2o_attention_and_mass_s"] - row["full_sdpa_s"]
    row["old_attention_mass_s"] = timed(lambda: kernels.attention_mass(q, k, s), repeat=1)
    lse2 = MP._flash_with_lse(q, k, v, s)[1] * MP.LOG2E              # H2O's column pass alone, launch configs
    for bm, bn, w, st in [(64, 128, 8, 3), (128, 64, 8, 3), (64, 64, 4, 3), (128, 128, 8, 2), (64, 128, 4, 3)]:
        cfg = {"block_m": bm, "block_n": bn, "num_warps": w, "num_stages": st}
        row[f"h2o_mass_{bm}x{bn}_w{w}_s{st}_s"] = timed(lambda cfg=cfg: MP.causal_mass(q, k, lse2, s, cfg))
    heads = P.resolve("auto", model="llama3", num_layers=info.num_layers, num_heads=Hq).heads[layer]
    c, pos = P.Consts(), torch.arange(N, device="cuda")
    index = []
    row["minf_estimate_per_head_s"] = timed(      # before: one head at a time
        lambda: [P.head_index(p, q[:, h], k[:, h // (Hq // Hkv)], pos, c, s) for h, p in enumerate(heads)], 1)
    row["minf_estimate_s"] = timed(lambda: index.append(P.layer_index(heads, q, k, pos, c, s)))
    idx = []
    row["minf_lists_per_head_s"] = timed(         # before: each head's lists alone
        lambda: [KM.build_index(heads[h:h + 1], index[0][h:h + 1], 0, N, N, 1, c.block, q.device) for h in range(Hq)], 1)
    row["minf_lists_s"] = timed(lambda: idx.append(KM.build_index(heads, index[0], 0, N, N, 1, c.block, q.device)))
    row["minf_kernel_s"] = timed(lambda: KM.mixed_sparse_attention(q, k, v, idx[0], s))
    _, pairs = KM.mixed_sparse_attention(q, k, v, idx[0], s, count=True)
    row["minf_density"] = float(pairs.sum(dtype=torch.int64)) / (Hq * N * (N + 1) / 2)
    row["minf_dense_lists_kernel_s"] = timed(lambda: KM.mixed_sparse_attention(
        q, k, v, KM.build_index([P.Pattern("dense")] * Hq, [None] * Hq, 0, N, N, 1, c.block, q.device), s))
    row["patterns"] = sorted({p.text() for p in heads})
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama3")
    ap.add_argument("--weights", default="random")
    ap.add_argument("--contexts", type=int, nargs="*", default=[32768])
    ap.add_argument("--methods", nargs="*", default=["full"])
    ap.add_argument("--warm", type=int, default=4096)
    ap.add_argument("--stages", type=int, nargs="*", default=[])
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    argv = sys.argv[1:] if argv is None else list(argv)
    model, info, device, _ = load_bench_model(args.model, args.weights)
    gen = torch.Generator().manual_seed(0)
    rows, stage_rows = [], []
    for N in args.stages:
        try:
            r = stages(info, N)
        except Exception as e:  # noqa: BLE001
            r = {"context": N, "error": f"{type(e).__name__}: " + str(e).split("\n")[0][:200]}
        print(json.dumps(r), flush=True)
        stage_rows.append(r)
    for ctx in args.contexts:
        ids = torch.randint(0, info.vocab_size, (1, ctx), generator=gen).to(device)
        for spec in args.methods:
            row = prefill_row(model, info, ids, spec, min(args.warm, ctx))
            print(json.dumps(row), flush=True)
            rows.append(row)
    out = {"provenance": provenance("bench.prefill_speed", argv), "environment": environment(),
           "device": torch.cuda.get_device_name(), "rows": rows, "stages": stage_rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
