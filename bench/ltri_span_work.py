"""Ltri-LLM's span work on the CPU, the per-map reference path (methods/parts/ltri_spans.py, a Python loop per
block) against the batched one (methods/parts/ltri_batch.py), in one process (issues 33/34):

    python -m bench.ltri_span_work --out results/bench/ltri_span_work_cpu.json

- maps: a 32K prompt's leaving blocks, `--layers` x `--blocks` maps of 128 x 128 (batch 1), handed over as the
  method does (`--per-chunk` maps per call: a 512-token chunk's 4 blocks), and the chunks' 512 x 512 query maps
  (`--chunks` per layer); random row-normalised maps, default Ltri options. Picks checked equal.
- prefill: the whole Ltri prefill (YAML defaults, `--prompt` random tokens) of a tiny random Llama (the tests'
  shape: hidden 64, 4 heads, 2 KV heads, `--model-layers` layers), reference vs batched; logits checked equal.
perf_counter seconds, least of `--repeat` (the prefill: each path `--repeat` times, alternating; span_s_in_prefill:
the seconds inside the span functions, per prefill); a shared CPU: compare the ratios of one run. Ltri's query maps
go map by map on the host in both paths now (faster on one core); the GPU path (methods/parts/ltri_device.py) has
its own bench, bench/ltri_device_parity.py.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from bench.engine import provenance
from methods import ModelInfo, build
from methods.ltri import Ltri, LtriConfig
from methods.parts import ltri_batch as LB
from runners.engine import Engine

CONF = Path(__file__).resolve().parents[1] / "conf"


def least(fn, repeat):
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def maps_bench(a):
    c = LtriConfig()
    g = torch.Generator().manual_seed(0)
    n, q = c.block_size, c.exc_block_size
    A = torch.tril(torch.rand(a.blocks, n, n, generator=g) ** 4)
    A = A / A.sum(-1, keepdim=True)
    V = torch.rand(a.blocks, n, generator=g)
    args = (c.theta_quantile[0], c.iou[0], c.spans_per_block, c.fill_gaps, c.ratio_mode, c.ratio_area == "density",
            c.lam, c.min_vectors, c.max_vectors, c.index == "static")

    def run(fn):
        out = []
        for _ in range(a.layers):
            for s in range(0, a.blocks, a.per_chunk):
                out.append(fn(A[s:s + a.per_chunk], V[s:s + a.per_chunk], *args))
        return out

    t_ref, ref = least(lambda: run(LB.index_maps_reference), a.repeat)
    t_new, new = least(lambda: run(LB.index_maps), a.repeat)
    same = all(torch.equal(x[0], y[0]) and torch.equal(x[1], y[1]) and x[2:] == y[2:] for x, y in zip(ref, new))
    Q = torch.tril(torch.rand(a.chunks, q, q, generator=g) ** 4)
    Q = Q / Q.sum(-1, keepdim=True)
    k = -(-c.spans_per_block * q // n)
    qargs = (c.theta_quantile[0], c.iou[0], k, c.fill_gaps)
    tq_ref, qref = least(lambda: [LB.detect_spans_reference(Q[i:i + 1], *qargs) for i in range(a.chunks)], a.repeat)
    tq_new, qnew = least(lambda: [LB.detect_spans(Q[i:i + 1], *qargs) for i in range(a.chunks)], a.repeat)
    return {"block_maps": a.layers * a.blocks, "maps_per_call": a.per_chunk, "block_map_n": n,
            "reference_s": t_ref, "batched_s": t_new, "speedup": t_ref / t_new, "same_picks": same,
            "query_maps_one_layer": a.chunks, "query_map_n": q, "query_reference_s": tq_ref,
            "query_batched_s": tq_new, "query_speedup": tq_ref / tq_new,
            "query_reference_s_all_layers_est": tq_ref * a.layers, "query_batched_s_all_layers_est": tq_new * a.layers,
            "same_query_spans": qref == qnew}


def prefill_bench(a):
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=a.model_layers, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=128, max_position_embeddings=a.prompt + 64, head_dim=16)
    cfg._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    info = ModelInfo.from_hf_config(model.config)
    ids = torch.randint(0, 128, (1, a.prompt), generator=torch.Generator().manual_seed(1))
    row = {"prompt": a.prompt, "model_layers": a.model_layers, "method": "ltri (conf/method/ltri.yaml)"}
    logits, spent = {}, {}

    def clocked(fn, key):          # the span work's own seconds inside the prefill (host work: perf_counter)
        def run(*args, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                spent[key] = spent.get(key, 0.0) + time.perf_counter() - t0
        return run

    saved = {k: getattr(LB, k) for k in ("index_maps", "index_maps_reference", "detect_spans", "detect_spans_reference")}
    for k, fn in saved.items():
        setattr(LB, k, clocked(fn, k))
    for ref in (True, False, True, False)[:2 * a.repeat]:
        Ltri.reference_spans = ref
        try:
            eng = Engine(model, build(OmegaConf.load(CONF / "method" / "ltri.yaml"), info), use_graphs=False)
            eng.reset(1, a.prompt + 8)
            with torch.no_grad():
                t0 = time.perf_counter()
                out = eng.prefill(ids)
                t = time.perf_counter() - t0
        finally:
            Ltri.reference_spans = False
        key = "reference_s" if ref else "batched_s"
        row[key] = min(row.get(key, float("inf")), t)
        logits[ref] = out
        row["vectors_per_block"] = eng.method.stats().get("vectors_per_block")
    for k, fn in saved.items():
        setattr(LB, k, fn)
    row["span_s_in_prefill"] = {k: v / a.repeat for k, v in spent.items()}
    row["speedup"] = row["reference_s"] / row["batched_s"]
    row["same_logits"] = bool(torch.equal(logits[True], logits[False]))
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--blocks", type=int, default=256)
    ap.add_argument("--per-chunk", type=int, default=4)
    ap.add_argument("--chunks", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=8192)
    ap.add_argument("--model-layers", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--skip", nargs="*", default=[], choices=["maps", "prefill"])
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    out = {**provenance("bench.ltri_span_work", list(argv if argv is not None else sys.argv[1:])),
           "torch_threads": torch.get_num_threads(), "device": "cpu"}
    if "maps" not in a.skip:
        out["maps"] = maps_bench(a)
        print(json.dumps(out["maps"], indent=1), flush=True)
    if "prefill" not in a.skip:
        out["prefill"] = prefill_bench(a)
        print(json.dumps(out["prefill"], indent=1), flush=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
