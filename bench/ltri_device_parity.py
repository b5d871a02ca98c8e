"""Ltri-LLM's span work on the GPU (methods/parts/ltri_device.py) against the host path (methods/parts/ltri_batch.py,
the bit reference), and what it does to Ltri's prefill (issues 33/34). GPU only:

    python -m bench.ltri_device_parity --out results/bench/ltri_device_parity_h100.json
    python -m bench.ltri_device_parity --skip scan parity work --contexts 32768 --out ...   # the prefill timing only

- scan: kernels/prefix_scan.py on fp64 [8, 512, 512] (magnitudes over 12 orders) against the CPU's sequential
  cumsum: elements that differ (and, for contrast, torch's CUDA cumsum, a parallel scan).
- parity: how often the device's results differ from ltri_batch's, per map: `--blocks` 128 x 128 block maps
  (random row-normalised lower-triangular maps, as bench/ltri_span_work.py's maps_bench, random votes) with the
  default options at lambda 3 and 20, `--ties` maps with exact ties (a few distinct values, quarter votes) and
  planted triangles, `--queries` 512 x 512 query maps (spans only); thetas compared on their own. Also with
  torch's CUDA cumsum (a parallel scan) in place of the kernel to show what the sequential scan buys.
- work: seconds of one chunk-layer's span work (4 block maps + one query map): device (CUDA graphs replayed, or
  eager launches) vs host, CUDA-synchronised, mean of 20.
- prefill: Ltri (YAML defaults, offload=false) on Llama-3-8B shape at random weights, each of `--contexts` tokens,
  the span work on the device (graphs; eager launches) vs on the host (Ltri.host_spans; up to --host-max), and
  full attention; host syncs per chunk-layer counted as bench/infllm_prefill.py counts them. perf_counter around
  a CUDA-synchronised prefill, after a --warm-token untimed prefill (compiles, graph captures).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

import torch

from methods.ltri import LtriConfig
from methods.parts import ltri_batch as LB
from methods.parts import ltri_device as LD


def _maps(N, n, g, kind):
    if kind == "ties":           # a few distinct values: equal scores, candidates and ratios
        return torch.tril(torch.randint(0, 3, (N, n, n), generator=g).float() * 0.25)
    A = torch.tril(torch.rand(N, n, n, generator=g) ** 4)
    if kind == "planted":
        for i in range(N):
            x = int(torch.randint(0, n, (1,), generator=g))
            y = int(torch.randint(x, n, (1,), generator=g))
            A[i, x:y + 1, x:y + 1] += torch.tril(torch.ones(y - x + 1, y - x + 1)) * 4
        A = torch.tril(A)
    return A / A.sum(-1, keepdim=True).clamp(min=1e-9)


def _args(lam):
    c = LtriConfig()
    return (c.theta_quantile[0], c.iou[0], c.spans_per_block, c.fill_gaps, c.ratio_mode, c.ratio_area == "density",
            lam, c.min_vectors, c.max_vectors, c.index == "static")


@contextlib.contextmanager
def _cuda_cumsum():
    """ltri_device with torch's own CUDA cumsum (a parallel scan) in place of the sequential kernel."""
    saved, graphs = LD.prefix_sum_, LD.use_graphs
    LD.prefix_sum_, LD.use_graphs = (lambda x, axis: x.cumsum_(axis)), False   # (a graph would replay the kernel)
    try:
        yield
    finally:
        LD.prefix_sum_, LD.use_graphs = saved, graphs


def _split(out):
    picked, owner, sizes, n_sp = out
    p, o = picked.cpu().split(sizes), owner.cpu().split(sizes)
    return [(p[i].tolist(), o[i].tolist(), n_sp[i]) for i in range(len(sizes))]


def scan_parity():
    from kernels.prefix_scan import prefix_sum_
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 512, 512, generator=g, dtype=torch.float64) * 10.0 ** torch.randint(-6, 6, (8, 512, 512),
                                                                                             generator=g)
    out = {}
    for axis in (1, 2):
        want = x.cumsum(axis)
        got = prefix_sum_(x.cuda(), axis).cpu()
        out[f"axis{axis}_kernel_elements_differing"] = int((got != want).sum())
        out[f"axis{axis}_torch_cuda_cumsum_elements_differing"] = int((x.cuda().cumsum(axis).cpu() != want).sum())
    out["elements"] = x.numel()
    return out


def parity(a):
    g = torch.Generator().manual_seed(1)
    out = {}
    cases = [("rand", a.blocks, 3.0), ("rand", a.blocks, 20.0), ("ties", a.ties, 3.0), ("planted", a.ties, 3.0)]
    for kind, N, lam in cases:
        A = _maps(N, 128, g, kind)
        V = torch.rand(N, 128, generator=g)
        if kind != "rand":
            V = (V * 4).floor() / 4
        host, dev, dev_torch = [], [], []
        for s in range(0, N, 256):
            host += _split(LB.index_maps(A[s:s + 256], V[s:s + 256], *_args(lam)))
            dev += _split(LD.index_maps(A[s:s + 256].cuda(), V[s:s + 256].cuda(), *_args(lam)))
            with _cuda_cumsum():
                dev_torch += _split(LD.index_maps(A[s:s + 256].cuda(), V[s:s + 256].cuda(), *_args(lam)))
        Ad = A.double()
        th = (LD.quantiles(Ad.cuda(), 0.9).cpu() != torch.from_numpy(LB.quantiles(Ad.numpy(), 0.9))).sum()
        out[f"blocks_{kind}_lam{lam:g}"] = {
            "maps": N, "maps_differing": sum(h != d for h, d in zip(host, dev)),
            "maps_differing_with_torch_cuda_cumsum": sum(h != d for h, d in zip(host, dev_torch)),
            "thetas_differing": int(th)}
        print(kind, lam, out[f"blocks_{kind}_lam{lam:g}"], flush=True)
    k = -(-4 * 512 // 128)
    for kind in ("rand", "planted"):
        A = _maps(a.queries, 512, g, kind)
        diff = diff_t = 0
        for s in range(0, a.queries, 16):
            h = LB.detect_spans_reference(A[s:s + 16], 0.9, 0.1, k, True)
            diff += sum(x != y for x, y in zip(h, LD.detect_spans(A[s:s + 16].cuda(), 0.9, 0.1, k, True)))
            with _cuda_cumsum():
                diff_t += sum(x != y for x, y in zip(h, LD.detect_spans(A[s:s + 16].cuda(), 0.9, 0.1, k, True)))
        Ad = A.double()
        th = (LD.quantiles(Ad.cuda(), 0.9).cpu() != torch.from_numpy(LB.quantiles(Ad.numpy(), 0.9))).sum()
        out[f"queries_{kind}"] = {"maps": a.queries, "maps_differing": diff,
                                  "maps_differing_with_torch_cuda_cumsum": diff_t, "thetas_differing": int(th)}
        print(kind, out[f"queries_{kind}"], flush=True)
    return out


def work(a):
    g = torch.Generator().manual_seed(2)
    A, V, Q = _maps(4, 128, g, "rand"), torch.rand(4, 128, generator=g), _maps(1, 512, g, "rand")
    Ad, Vd, Qd = A.cuda(), V.cuda(), Q.cuda()

    def dev():
        LD.index_maps(Ad, Vd, *_args(3.0))
        LD.detect_spans(Qd, 0.9, 0.1, 16, True)

    def host():
        LB.index_maps(Ad.cpu(), Vd.cpu(), *_args(3.0))
        LB.detect_spans_reference(Qd, 0.9, 0.1, 16, True)
    out = {}
    for name, fn, graphs in (("device_graphs", dev, True), ("device_eager", dev, False), ("host", host, False)):
        LD.use_graphs = graphs
        fn()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        out[f"{name}_ms_per_chunk_layer"] = round((time.perf_counter() - t) / 20 * 1e3, 2)
    LD.use_graphs = True
    print(out, flush=True)
    return out


def prefill(a):
    from bench.engine import load_bench_model
    from bench.infllm_prefill import SyncCounter
    from bench.method_speed import method_cfg
    from methods import build
    from methods.ltri import Ltri
    from runners.engine import Engine
    model, info, dev, _ = load_bench_model("llama3", "random")
    ids = torch.randint(0, model.config.vocab_size, (1, max(a.contexts)), device=dev)
    rows = []
    runs = [(ctx, spec, work) for ctx in a.contexts for spec, work in
            (("full", None), ("ltri:offload=false", "device"), ("ltri:offload=false", "device_eager"),
             ("ltri:offload=false", "host")) if work in (None, "device") or ctx <= a.host_max]
    for ctx, spec, work in runs:
        Ltri.host_spans, LD.use_graphs = work == "host", work == "device"
        try:
            eng = Engine(model, build(method_cfg(spec), info), use_graphs=False)
            eng.reset(1, ctx + 8)
            eng.prefill(ids[:, :a.warm])
            eng.reset(1, ctx + 8)
            with SyncCounter() as sc:
                torch.cuda.synchronize()
                t = time.perf_counter()
                eng.prefill(ids[:, :ctx])
                torch.cuda.synchronize()
                secs = time.perf_counter() - t
        finally:
            Ltri.host_spans, LD.use_graphs = False, True
        per = -(-ctx // (eng.method.prefill_chunk or ctx)) * info.num_layers
        row = {"method": spec, "span_work": work, "context": ctx, "prefill_s": round(secs, 3),
               "syncs_per_chunk_layer": {k: round(v / per, 2) for k, v in sc.counts.items()}}
        rows.append(row)
        print(json.dumps(row), flush=True)
        eng.close()
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", type=int, default=2048)
    ap.add_argument("--ties", type=int, default=512)
    ap.add_argument("--queries", type=int, default=256)
    ap.add_argument("--contexts", type=int, nargs="+", default=[16384, 32768])
    ap.add_argument("--host-max", type=int, default=16384, help="the host span work and eager device launches only "
                    "up to this context (the host's is ~25 ms per chunk and layer)")
    ap.add_argument("--warm", type=int, default=6144, help="tokens of the untimed prefill before each timed one: past "
                    "n_local, so retrieval runs and the spans' Triton kernels compile and graphs are captured there "
                    "(at 1024, b991085's run, the first timed Ltri prefill paid them)")
    ap.add_argument("--skip", nargs="*", default=[], choices=["scan", "parity", "work", "prefill"])
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: bench.ltri_device_parity needs a CUDA device", file=sys.stderr)
        raise SystemExit(2)
    from bench.engine import provenance
    out = {**provenance("bench.ltri_device_parity", list(argv if argv is not None else sys.argv[1:])),
           "device": torch.cuda.get_device_name(), "torch": torch.__version__}
    for name, fn in (("scan", lambda: scan_parity()), ("parity", lambda: parity(a)), ("work", lambda: work(a)),
                     ("prefill", lambda: prefill(a))):
        if name not in a.skip:
            out[name] = fn()
            Path(a.out).parent.mkdir(parents=True, exist_ok=True)
            Path(a.out).write_text(json.dumps(out, indent=1) + "\n")   # what ran so far, if a later part dies


if __name__ == "__main__":
    main()
