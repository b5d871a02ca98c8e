"""Ltri-LLM's prefill host work per (chunk, layer), counted on the CPU as a GPU run would do it (issue 34):

    python -m bench.ltri_host_work --context 2048 --out notes/ltri_prefill_host_counts.json

A small random Llama (`--layers` layers, 4 query / 2 KV heads of 32) prefills `--context` tokens with Ltri's
options scaled by 1/16 (chunk 32, block 8: 4 leaving blocks and 16 query spans per chunk, as 512/128 at the
defaults). The span work takes its CUDA path (methods/parts/ltri_device.py, eager on the CPU) and every tensor is
treated as living on the GPU unless it came from a device-to-host copy or a factory without a device, so what
is counted is what the host would do on a GPU:
  d2h        device-to-host waits: .cpu()/.tolist()/.item()/bool()/int()/float()/nonzero of a device tensor
  h2d        host tensors sent to the device (.to(device), copy_ into a device tensor, torch.tensor(device=))
  ops        aten ops issued on device tensors (views excluded: bench.op_count's list), by method function;
             a replayed CUDA graph of ltri_device counts as its input copies + 1
  add_calls  IndexVectors.add / add_rows calls (the index's store: per block and row, or per layer)
Counts are per (chunk, layer) over the second half of the prefill's chunks (every block retrieval and leaving
block there, as at 128K; the short last chunk excluded), after one warm-up prefill of `--warm` tokens.
"""
from __future__ import annotations

import argparse
import collections
import json
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from bench.op_count import VIEWS
from methods import ModelInfo, build
from methods.ltri import Ltri
from methods.parts import ltri_device as LD
from methods.parts.stores_blocks import IndexVectors
from runners.engine import Engine

SMALL = "n_init=8,n_local=256,block_size=8,topk=16,exc_block_size=32,last_chunk=8"
SYNC_OPS = {"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique2"}


def _host(t) -> bool:
    return getattr(t, "_sim_host", False)


def _where() -> str:
    """The innermost methods/ frame that issued the op (file:function)."""
    f = sys._getframe(2)
    while f is not None:
        name = f.f_code.co_filename
        if "/methods/" in name:
            return f"{name.rsplit('/methods/', 1)[1]}:{f.f_code.co_name}"
        f = f.f_back
    return "other"


class Sim(TorchDispatchMode):
    """Counts ops, d2h and h2d with a simulated placement (see the module doc)."""

    def __init__(self):
        super().__init__()
        self.c = collections.Counter()
        self.ops = collections.Counter()
        self.off = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.__name__.split(".")[0]
        ts = [a for a in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
        host = all(_host(t) for t in ts) if ts else kwargs.get("device") is None
        if self.off:
            host = False
        elif name in SYNC_OPS and not host:
            self.c["d2h"] += 1
            self.ops["d2h " + _where()] += 1
        elif name == "copy_" and len(ts) == 2 and _host(ts[1]) and not _host(ts[0]):
            self.c["h2d"] += 1
            self.ops["h2d " + _where()] += 1
        elif not host and name not in VIEWS:
            self.c["ops"] += 1
            self.ops[_where()] += 1
        for o in torch.utils._pytree.tree_leaves(out):
            if isinstance(o, torch.Tensor) and host:
                o._sim_host = True
        return out


def install(sim: Sim) -> None:
    T = torch.Tensor
    cpu, tolist, to, tensor = T.cpu, T.tolist, T.to, torch.tensor
    add, add_rows = IndexVectors.add, getattr(IndexVectors, "add_rows", None)

    def sim_cpu(t, *a, **k):
        if not _host(t):
            sim.c["d2h"] += 1
            sim.ops["d2h " + _where()] += 1
        out = cpu(t, *a, **k).clone()
        out._sim_host = True
        return out

    def sim_tolist(t):
        if not _host(t):
            sim.c["d2h"] += 1
            sim.ops["d2h " + _where()] += 1
        return tolist(t)

    def sim_to(t, *a, **k):
        dev = k.get("device", a[0] if a and isinstance(a[0], (torch.device, str)) else None)
        if dev is None and a and isinstance(a[0], torch.Tensor):
            dev = a[0].device
        if dev is not None and _host(t):
            sim.c["h2d"] += 1
            sim.ops["h2d " + _where()] += 1
            return to(t, *a, **k).clone()      # a fresh (device) tensor
        return to(t, *a, **k)

    def sim_tensor(*a, **k):
        out = tensor(*a, **k)
        if k.get("device") is not None:
            sim.c["h2d"] += 1
            sim.ops["h2d " + _where()] += 1
        else:
            out._sim_host = True
        return out

    def sim_add(self, *a, **k):
        sim.c["add_calls"] += 1
        return add(self, *a, **k)

    def sim_add_rows(self, *a, **k):
        sim.c["add_calls"] += 1
        return add_rows(self, *a, **k)

    def sim_run(fn, *tensors, args):   # a graph replay on a GPU: its input copies and one launch
        sim.c["ops"] += len(tensors) + 1
        sim.ops[f"parts/ltri_device.py:_run[{fn.__name__} replay]"] += len(tensors) + 1
        sim.off += 1
        try:
            return fn(*tensors, *args)
        finally:
            sim.off -= 1

    T.cpu, T.tolist, T.to, torch.tensor, IndexVectors.add, LD._run = sim_cpu, sim_tolist, sim_to, sim_tensor, \
        sim_add, sim_run
    if add_rows is not None:
        IndexVectors.add_rows = sim_add_rows


def main(argv=None):
    from transformers import AutoModelForCausalLM, LlamaConfig

    from bench.method_speed import method_cfg
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--warm", type=int, default=512)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--method", default=f"ltri:{SMALL}")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    cfg = LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=a.layers, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=32, vocab_size=256, max_position_embeddings=1 << 16)
    cfg._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    info = ModelInfo.from_hf_config(model.config)
    Ltri._span_work = lambda self, A: "device"      # the CUDA path's span work, on the CPU
    eng = Engine(model, build(method_cfg(a.method), info), use_graphs=False)
    ids = torch.randint(0, 256, (1, a.context), generator=torch.Generator().manual_seed(1))
    eng.reset(1, a.context + 8)
    eng.prefill(ids[:, :a.warm])
    eng.reset(1, a.context + 8)
    sim = Sim()
    install(sim)
    marks, begin = [], eng.method.begin

    def mark(step):                       # counters at each chunk's start: the steady chunks are counted alone
        marks.append((sim.c.copy(), sim.ops.copy()))
        return begin(step)
    eng.method.begin = mark
    with torch.no_grad(), sim:
        eng.prefill(ids)
    n = len(marks)                        # steady state: the second half of the chunks, the short last one not
    (c0, o0), (c1, o1) = marks[n // 2], marks[n - 1]
    per = (n - 1 - n // 2) * a.layers
    rows = {k: round(v / per, 2) for k, v in (c1 - c0).items()}
    mine = {k: round(v / per, 2) for k, v in (o1 - o0).most_common() if k != "other"}
    out = {"argv": list(argv if argv is not None else sys.argv[1:]), "chunk_layers": per, "per_chunk_layer": rows,
           "by_function": dict(list(mine.items())[:a.top])}
    print(json.dumps(out, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
