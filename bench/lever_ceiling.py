"""Ceiling of the engine-wide levers on LycheeDecode's batch-1 ratio (issue 10's 1.7x at 128K): full and
lychee_block TPOT side by side in one process, under timing-only patches. Not a benchmark file: its
numbers are quoted in notes/kernels.md ("fourth pass").

  base             the engine as it is;
  norope           decode skips RoPE on q and k and the K/V append (wrong outputs, timing only): the most
                   that fusing those 4 launches a layer into one kernel, or into attention, could save;
  relayout         o_proj, gate_up, down and lm_head weights stored [K, N] (F.linear on the transposed
                   view is cuBLAS NN, the faster batch-1 layout in isolation; notes/kernels.md, third pass);
  relayout+norope  both;
  relayout(+qkv)   the qkv weight stored [K, N] as well.

    python -m bench.lever_ceiling [--context 131072] [--steps 16] [--repeat 2]
"""
from __future__ import annotations

import argparse

import torch

from bench.engine import Clock, bench_engine, load_bench_model
from bench.lychee_tpot import method_cfg
from methods.parts.rope import Rope
from methods.parts.stores import FullStore
from runners.layer_ops import FusedOps

FLAGS = {"norope": False}
_apply, _write = Rope.apply, FullStore.write


def _apply_patched(self, x, positions, precise=False):
    return x if FLAGS["norope"] and x.shape[2] == 1 else _apply(self, x, positions, precise)


def _write_patched(self, layer, positions, k, v):
    if not (FLAGS["norope"] and k.shape[2] == 1):
        _write(self, layer, positions, k, v)


def _transposed(w: torch.Tensor) -> torch.Tensor:
    """w [N, K] as a view of a [K, N] contiguous copy (idempotent)."""
    return w.t().contiguous().t()


def relayout(model, ops: FusedOps, qkv: bool = False) -> None:
    """Store the decode GEMMs' weights [K, N]; module weights stay views of what the engine multiplies."""
    for i, layer in enumerate(model.model.layers):
        attn, mlp = layer.self_attn, layer.mlp
        attn.o_proj.weight.data = _transposed(attn.o_proj.weight.data)
        mlp.down_proj.weight.data = _transposed(mlp.down_proj.weight.data)
        fused = [("gate_up", [mlp.gate_proj, mlp.up_proj])] + ([("qkv_w", [attn.q_proj, attn.k_proj, attn.v_proj])]
                                                              if qkv else [])
        for attr, mods in fused:
            w, b = getattr(ops, attr)[i]
            wt, row = _transposed(w), 0
            for m in mods:
                n = m.weight.shape[0]
                m.weight.data, row = wt[row:row + n], row + n
            getattr(ops, attr)[i] = (wt, b)
        torch.cuda.empty_cache()
    if model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():  # not tied
        model.lm_head.weight.data = _transposed(model.lm_head.weight.data)
    torch.cuda.empty_cache()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama3")
    ap.add_argument("--context", type=int, default=131072)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args(argv)
    Rope.apply, FullStore.write = _apply_patched, _write_patched
    model, info, device, _ = load_bench_model(args.model, "random")
    ops = FusedOps.of(model, info)
    clock = Clock(device)
    ids = torch.randint(0, info.vocab_size, (1, args.context), generator=torch.Generator().manual_seed(0)).to(device)

    def run(tag):
        ms = {"full": [], "lychee_block": []}
        for _ in range(args.repeat):
            for v, runs in ms.items():
                runs.append(bench_engine(model, info, ids, args.steps, clock, 1, graphs=True,
                                          method_cfg=method_cfg(v, info), time_prefill=False)[1])
        f, lb = min(ms["full"]), min(ms["lychee_block"])
        print(f"{tag:>16}: full {f:.2f} ms, lychee_block {lb:.2f} ms (runs {ms}): {f / lb:.3f}x", flush=True)

    run("base")
    FLAGS["norope"] = True
    run("norope")
    FLAGS["norope"] = False
    relayout(model, ops)
    run("relayout")
    FLAGS["norope"] = True
    run("relayout+norope")
    FLAGS["norope"] = False
    relayout(model, ops, qkv=True)
    run("relayout(+qkv)")


if __name__ == "__main__":
    main()
