"""Kernel-level benchmark on the GPU (Llama-3-8B decode shapes: Hq 32, Hkv 8, D 128, bf16).

    python -m bench.kernel_ops --out results/bench/kernels_llama3_h100.json [--quick] [--sweep]

Times (median; CUDA-graph replays by default, --eager for do_bench; inputs rotate over buffers so
repeated calls do not hit L2) torch SDPA flash decode vs our full decode kernel, sparse decode at
token and page granularity over budgets, and selection attention vs full decode + a separate score
pass + top-k. Effective bandwidth = bytes of K/V the op must read / time, against PEAK_TBS.
No hydra/omegaconf here: it runs on the bare device image.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import time

import torch

import kernels
from kernels import attention as A

HQ, HKV, D = 32, 8, 128
PEAK_TBS = 3.0  # measured device-to-device copy on the H100 here (KINDS.md)
EB = 2  # bf16 bytes


MODE = {"graph": True}


def bench(fn, n_inputs, graph=None):
    """Median ms of fn(i) over rotating input sets i. With graph (default), the calls are captured
    in a CUDA graph (do_bench_cudagraph): device time without Python launch overhead, which for
    small ops exceeds the kernel itself. Eager (do_bench) numbers include that overhead."""
    from triton.testing import do_bench, do_bench_cudagraph

    state = {"i": 0}

    def call():
        state["i"] = (state["i"] + 1) % n_inputs
        fn(state["i"])

    if MODE["graph"] if graph is None else graph:
        return do_bench_cudagraph(call, rep=50, return_mode="median")
    return do_bench(call, warmup=25, rep=100, return_mode="median")


def kv_sets(B, S, budget_bytes=24 << 30):
    """As many K/V copies as rotate past L2 without exceeding ~budget_bytes."""
    one = 2 * B * HKV * S * D * EB
    n = max(2, min(4, math.ceil(256e6 / one)))
    n = max(1, min(n, budget_bytes // one))
    g = torch.Generator(device="cuda").manual_seed(0)
    sets = []
    for _ in range(n):
        k = torch.randn(B, HKV, S, D, device="cuda", generator=g, dtype=torch.bfloat16)
        v = torch.randn(B, HKV, S, D, device="cuda", generator=g, dtype=torch.bfloat16)
        q = torch.randn(B, HQ, D, device="cuda", generator=g, dtype=torch.bfloat16)
        sets.append((q, k, v))
    return sets


def tbs(nbytes, ms):
    return nbytes / (ms * 1e-3) / 1e12


def sdpa_fn(sets):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F

    def run(i):
        q, k, v = sets[i]
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            return F.scaled_dot_product_attention(q.unsqueeze(2), k, v, enable_gqa=True)

    try:
        run(0)
        return run, "flash"
    except Exception as e:  # no GQA flash in this torch: expand K/V (reads Hq/Hkv times more)
        print(f"SDPA flash with enable_gqa failed ({type(e).__name__}: {e}); using expanded K/V")
        exp = [(q, k.repeat_interleave(HQ // HKV, 1), v.repeat_interleave(HQ // HKV, 1)) for q, k, v in sets[:1]]
        return (lambda i: run_exp(exp[0])), "flash-expanded"


def run_exp(t):
    import torch.nn.functional as F
    q, k, v = t
    return F.scaled_dot_product_attention(q.unsqueeze(2), k, v)


def sweep(rows, sets, B, S, lengths):
    """Launch-config sweep for the dense and token kernels at one shape (printed, kept in JSON)."""
    configs = [dict(block_n=bn, num_warps=w, num_stages=st, splits_per_sm=sp)
               for bn, w, st, sp in [(64, 4, 3, 4), (64, 4, 2, 4), (64, 8, 3, 4), (128, 4, 3, 4),
                                     (128, 8, 3, 4), (32, 4, 4, 4), (64, 4, 4, 4), (64, 4, 3, 2),
                                     (64, 4, 3, 8), (128, 8, 2, 2)]]
    nbytes = 2 * B * HKV * S * D * EB
    for cfg in configs:
        try:
            ms = bench(lambda i: kernels.decode_attention(*sets[i], lengths, D ** -0.5, max_length=S,
                                                          config=cfg), len(sets))
        except Exception as e:
            print("config", cfg, "failed:", type(e).__name__, str(e)[:200])
            continue
        rows.append(dict(op="sweep_dense", B=B, S=S, cfg=cfg, ms=ms, tbs=tbs(nbytes, ms)))
        print(f"sweep dense B={B} S={S} {cfg}: {ms * 1e3:.1f} us {tbs(nbytes, ms):.2f} TB/s")
    budget = 4096
    g = torch.Generator(device="cuda").manual_seed(1)
    idx = torch.rand(B, HQ, S, device="cuda", generator=g).topk(budget, -1).indices.sort(-1).values
    idx, cnt = idx.int(), torch.full((B, HQ), budget, dtype=torch.int32, device="cuda")
    nbytes = 2 * B * HQ * budget * D * EB
    P = 16
    pidx = torch.rand(B, HQ, S // P, device="cuda", generator=g).topk(budget // P, -1).indices
    pidx, pcnt = pidx.sort(-1).values.int(), torch.full((B, HQ), budget // P, dtype=torch.int32,
                                                        device="cuda")
    for cfg in configs[:7]:
        ms = bench(lambda i: kernels.sparse_decode_tokens(*sets[i], idx, cnt, D ** -0.5, config=cfg),
                   len(sets))
        rows.append(dict(op="sweep_tokens", B=B, S=S, cfg=cfg, ms=ms, tbs=tbs(nbytes, ms)))
        ms_p = bench(lambda i: kernels.sparse_decode_pages(*sets[i], pidx, pcnt, P, lengths, D ** -0.5,
                                                           config=cfg), len(sets))
        rows.append(dict(op="sweep_pages16", B=B, S=S, cfg=cfg, ms=ms_p, tbs=tbs(nbytes, ms_p)))
        print(f"sweep sparse4096/Hq B={B} S={S} {cfg}: tokens {ms * 1e3:.1f} us {tbs(nbytes, ms):.2f} TB/s"
              f" | pages16 {ms_p * 1e3:.1f} us {tbs(nbytes, ms_p):.2f} TB/s")


def quest_rows(rows, sets, B, S):
    """Quest page scores + page top-k (budget 4096 tokens) over S // 16 pages."""
    P = 16
    q, k, _ = sets[0]
    kmin = torch.empty(B, HKV, S // P, D, device="cuda", dtype=torch.bfloat16)
    kmax = torch.empty_like(kmin)
    kernels.quest_update_pages(kmin, kmax, k, 0, P)
    nv = torch.full((B,), S // P, dtype=torch.int32, device="cuda")
    ms_s = bench(lambda i: kernels.quest_page_scores(sets[i][0], kmin, kmax, nv), len(sets))
    ms_t = bench(lambda i: kernels.quest_topk_pages(kernels.quest_page_scores(sets[i][0], kmin, kmax, nv),
                                                    4096 // P, nv), len(sets))
    ms_u = bench(lambda i: kernels.quest_update_pages(kmin, kmax, sets[i][1][:, :, S - 1:S], S - 1, P),
                 len(sets))
    nbytes = 2 * B * HKV * (S // P) * D * EB
    rows.append(dict(op="quest", B=B, S=S, ms_scores=ms_s, ms_scores_topk=ms_t, ms_update1=ms_u,
                     tbs_scores=tbs(nbytes, ms_s)))
    print(f"  quest B={B} S={S}: page scores {ms_s * 1e3:.1f} us ({tbs(nbytes, ms_s):.2f} TB/s), "
          f"+topk {ms_t * 1e3:.1f} us, update(1 token) {ms_u * 1e3:.1f} us", flush=True)


def provenance(argv: list[str]) -> dict:
    """The one command that wrote the JSON (minus --out) and the commit: git, or HARNESS_COMMIT on
    a copy of the tree without .git. Kept here rather than shared: this script runs on the bare
    device image, without the packages bench.engine imports."""
    args, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--out":
            skip = True
        elif not a.startswith("--out="):
            args.append(a)
    commit = os.environ.get("HARNESS_COMMIT")
    if not commit:
        try:
            r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], check=False, capture_output=True, text=True,
                               timeout=10, cwd=os.path.dirname(os.path.abspath(__file__)))
            commit = r.stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            commit = None
    return {"command": " ".join(["python", "-m", "bench.kernel_ops", *map(shlex.quote, args)]), "commit": commit}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--contexts", default="10240,32768,102400,131072")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--budgets", default="32,128,512,1024,2048,4096")
    ap.add_argument("--sweep", action="store_true", help="launch-config sweep at 128K first")
    ap.add_argument("--quick", action="store_true", help="32K and 128K, budgets 512/4096 only")
    ap.add_argument("--eager", action="store_true", help="time eager calls (do_bench), not graphs")
    args = ap.parse_args()
    MODE["graph"] = not args.eager
    contexts = [int(x) for x in args.contexts.split(",")]
    budgets = [int(x) for x in args.budgets.split(",")]
    if args.quick:
        contexts, budgets = [32768, 131072], [512, 4096]
    props = torch.cuda.get_device_properties(0)
    meta = dict(device=props.name, sms=props.multi_processor_count, torch=torch.__version__,
                peak_tbs=PEAK_TBS, config=A.CONFIG, timing="eager" if args.eager else "cuda graph")
    print(meta)
    rows = []
    scale = D ** -0.5
    t0 = time.time()
    for B in [int(x) for x in args.batches.split(",")]:
        for S in contexts:
            sets = kv_sets(B, S)
            n = len(sets)
            lengths = torch.full((B,), S, dtype=torch.int32, device="cuda")
            if args.sweep and S == max(contexts):
                sweep(rows, sets, B, S, lengths)
            full_bytes = 2 * B * HKV * S * D * EB
            fn, kind = sdpa_fn(sets)
            ms_sdpa = bench(fn, n)
            ms_full = bench(lambda i: kernels.decode_attention(*sets[i], lengths, scale, max_length=S), n)
            ms_sdpa_e = bench(fn, n, graph=False)
            ms_full_e = bench(lambda i: kernels.decode_attention(*sets[i], lengths, scale, max_length=S),
                              n, graph=False)
            ms_sel = bench(lambda i: kernels.selection_attention(*sets[i], lengths, scale, max_length=S), n)
            ms_selk = bench(lambda i: kernels.selection_attention(*sets[i], lengths, scale, topk=4096,
                                                                  max_length=S), n)

            def separate(i):  # baseline: full decode, then a second pass over K for scores, top-k
                q, k, v = sets[i]
                kernels.decode_attention(q, k, v, lengths, scale, max_length=S)
                s = torch.matmul(q.view(B, HKV, HQ // HKV, D), k.transpose(-1, -2)).float()
                return A.topk_positions(s.view(B, HQ, S), lengths, 4096)
            ms_sep = bench(separate, n)
            rows.append(dict(op="full", B=B, S=S, sdpa_kind=kind, ms_sdpa=ms_sdpa, ms_ours=ms_full,
                             ratio_ours_over_sdpa=ms_full / ms_sdpa, tbs_sdpa=tbs(full_bytes, ms_sdpa),
                             tbs_ours=tbs(full_bytes, ms_full), ms_selection=ms_sel,
                             ms_selection_topk=ms_selk, ms_full_plus_separate_topk=ms_sep,
                             selection_over_full=ms_sel / ms_full, ms_sdpa_eager=ms_sdpa_e,
                             ms_ours_eager=ms_full_e))
            print(f"B={B} S={S}: sdpa({kind}) {ms_sdpa * 1e3:.1f} us ({tbs(full_bytes, ms_sdpa):.2f} TB/s) | "
                  f"ours {ms_full * 1e3:.1f} us ({tbs(full_bytes, ms_full):.2f} TB/s, "
                  f"{ms_full / ms_sdpa:.2f}x sdpa) | selection {ms_sel * 1e3:.1f} us "
                  f"({ms_sel / ms_full:.2f}x full), +topk4096 {ms_selk * 1e3:.1f} us, "
                  f"full+separate scores+topk {ms_sep * 1e3:.1f} us | eager: sdpa {ms_sdpa_e * 1e3:.1f} us, "
                  f"ours {ms_full_e * 1e3:.1f} us", flush=True)
            if S == max(contexts):
                quest_rows(rows, sets, B, S)
            g = torch.Generator(device="cuda").manual_seed(2)
            for budget in budgets:
                if budget > S:
                    continue
                for H in (HQ, HKV):
                    idx = torch.rand(B, H, S, device="cuda", generator=g).topk(budget, -1).indices
                    idx = idx.sort(-1).values.int()
                    cnt = torch.full((B, H), budget, dtype=torch.int32, device="cuda")
                    ms = bench(lambda i: kernels.sparse_decode_tokens(*sets[i], idx, cnt, scale), n)
                    nbytes = 2 * B * H * budget * D * EB
                    rows.append(dict(op="tokens", B=B, S=S, budget=budget, sets="Hq" if H == HQ else "Hkv",
                                     ms=ms, tbs=tbs(nbytes, ms), frac_peak=tbs(nbytes, ms) / PEAK_TBS))
                    P = 16
                    npg = max(1, budget // P)
                    pidx = torch.rand(B, H, S // P, device="cuda", generator=g).topk(npg, -1).indices
                    pidx = pidx.sort(-1).values.int()
                    pcnt = torch.full((B, H), npg, dtype=torch.int32, device="cuda")
                    ms_p = bench(lambda i: kernels.sparse_decode_pages(*sets[i], pidx, pcnt, P, lengths,
                                                                       scale), n)
                    nb_p = 2 * B * H * npg * P * D * EB
                    rows.append(dict(op="pages16", B=B, S=S, budget=budget, sets="Hq" if H == HQ else "Hkv",
                                     ms=ms_p, tbs=tbs(nb_p, ms_p), frac_peak=tbs(nb_p, ms_p) / PEAK_TBS))
                    print(f"  sparse B={B} S={S} budget={budget} sets/{'Hq' if H == HQ else 'Hkv'}: "
                          f"tokens {ms * 1e3:.1f} us {tbs(nbytes, ms):.2f} TB/s | pages16 "
                          f"{ms_p * 1e3:.1f} us {tbs(nb_p, ms_p):.2f} TB/s", flush=True)
            sets = None  # free before the next shape allocates
            torch.cuda.empty_cache()
    print(f"done in {time.time() - t0:.0f} s")
    with open(args.out, "w") as f:
        json.dump(dict(bench="kernel_ops", **provenance(sys.argv[1:]), device=props.name, meta=meta, rows=rows), f,
                  indent=1)
    print("\n| B | S | SDPA us | ours us | ours/SDPA | ours TB/s | sel/full | sel+topk us | full+sep+topk us "
          "| eager SDPA us | eager ours us |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r["op"] == "full":
            print(f"| {r['B']} | {r['S']} | {r['ms_sdpa'] * 1e3:.1f} | {r['ms_ours'] * 1e3:.1f} | "
                  f"{r['ratio_ours_over_sdpa']:.2f} | {r['tbs_ours']:.2f} | {r['selection_over_full']:.2f} | "
                  f"{r['ms_selection_topk'] * 1e3:.1f} | {r['ms_full_plus_separate_topk'] * 1e3:.1f} | "
                  f"{r['ms_sdpa_eager'] * 1e3:.1f} | {r['ms_ours_eager'] * 1e3:.1f} |")
    print("\n| B | S | budget | sets | tokens us | tokens TB/s | pages16 us | pages16 TB/s |")
    print("|---|---|---|---|---|---|---|---|")
    tok = {(r["B"], r["S"], r["budget"], r["sets"]): r for r in rows if r["op"] == "tokens"}
    for r in rows:
        if r["op"] == "pages16" and r["S"] == max(contexts):
            t = tok[(r["B"], r["S"], r["budget"], r["sets"])]
            print(f"| {r['B']} | {r['S']} | {r['budget']} | {r['sets']} | {t['ms'] * 1e3:.1f} | "
                  f"{t['tbs']:.2f} | {r['ms'] * 1e3:.1f} | {r['tbs']:.2f} |")


if __name__ == "__main__":
    main()
