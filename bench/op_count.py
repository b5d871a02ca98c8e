"""Count the tensor ops one decode step of a method issues, per layer, grouped by the source line in
methods/ or kernels/ that issued them: a CPU proxy for the GPU's small-kernel cost (issue 33).

On a GPU every op of a decode step is a kernel launch, and inside a CUDA graph each small kernel
still costs ~2 us (H200 profile at 32K, notes/perf_bench.md): a method with 100 ops per layer more
than full attention pays ~6 ms a step at 32 layers whatever it reads. This counts the aten ops of one
eager decode step (views, which launch nothing, excluded) on a tiny random model, so an op-count cut
is checked here before a device call. Run it as the GPU would: Triton kernels under the interpreter,
each launch counted once,

    TRITON_INTERPRET=1 python -m bench.op_count ...

(the prefill then runs the torch references, the decode steps the kernels; without it the kernels' torch references run, and their ops are counted instead).

    python -m bench.op_count --methods full infllm infllm:offload=false ltri h2o --top 15

A method's options: NAME:key=value,key=value (the YAML's keys). The defaults shrink InfLLM/Ltri's
windows (n_local 256, block 32) so that a 1K prompt already retrieves blocks.
"""
from __future__ import annotations

import argparse
import collections
import importlib
import os
import traceback
from pathlib import Path

import torch
from omegaconf import OmegaConf
from torch.utils._python_dispatch import TorchDispatchMode

from methods import ModelInfo, build
from runners.engine import Engine

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf" / "method"
# small windows so that a short CPU prompt exercises every path of the memory methods
SMALL = {"infllm": "n_init=32,n_local=256,block_size=32,topk=4,exc_block_size=128,repr_topk=2",
         "ltri": "n_init=32,n_local=256,block_size=32,topk=4,exc_block_size=128,last_chunk=8"}
VIEWS = {"view", "_unsafe_view", "as_strided", "expand", "slice", "select", "unsqueeze", "squeeze", "t",
         "transpose", "permute", "alias", "detach", "lift_fresh", "_reshape_alias", "unbind", "split",
         "split_with_sizes", "chunk", "narrow", "reshape", "flatten", "unflatten", "view_as", "expand_as",
         "diagonal", "movedim", "indices", "values", "_local_scalar_dense", "sym_size", "sym_stride",
         "is_nonzero", "item", "dim", "size", "stride", "_to_copy_view"}

ALLOCS = {"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided"}


class Counter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.by_line = collections.Counter()
        self.total = 0
        self.allocs = 0   # of which allocations (empty*): no kernel on the GPU, nothing in a CUDA graph

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if name not in VIEWS and not LAUNCH["inside"]:
            self.total += 1
            self.allocs += name in ALLOCS
            self.by_line[_origin()] += 1
        return func(*args, **(kwargs or {}))


LAUNCH = {"inside": False, "counter": None}


def _count_launches() -> None:
    """A Triton kernel is one launch on the GPU: under the interpreter count each launch once (at
    its caller) and not the tensor copies the interpreter makes to run it."""
    from triton.runtime import interpreter as ti

    original = ti.GridExecutor.__call__

    def call(self, *args, **kwargs):
        c = LAUNCH["counter"]
        if c is None or LAUNCH["inside"]:
            return original(self, *args, **kwargs)
        c.total += 1
        c.by_line[_origin() + " [triton]"] += 1
        LAUNCH["inside"] = True
        try:
            return original(self, *args, **kwargs)
        finally:
            LAUNCH["inside"] = False

    ti.GridExecutor.__call__ = call


def _origin() -> str:
    """The innermost frame in the project's methods/, kernels/ or runners/."""
    for f in reversed(traceback.extract_stack()[:-3]):
        rel = f.filename.replace(str(ROOT) + "/", "")
        if rel.startswith(("methods/", "kernels/", "runners/")):
            return f"{rel}:{f.lineno} {f.name}"
    return "other"


def tiny_model(layers: int):
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=layers, num_attention_heads=8,
                      num_key_value_heads=2, vocab_size=256, max_position_embeddings=8192, head_dim=32)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()


def method_cfg(spec: str):
    name, _, rest = spec.partition(":")
    base = OmegaConf.load(CONF / f"{name}.yaml")
    over = ",".join(x for x in (SMALL.get(name, ""), rest) if x)
    return OmegaConf.merge(base, OmegaConf.from_dotlist(over.split(",")) if over else {})


def count(model, spec: str, prompt: int, steps: int) -> Counter:
    info = ModelInfo.from_hf_config(model.config)
    eng = Engine(model, build(method_cfg(spec), info), use_graphs=False)
    ids = torch.randint(0, model.config.vocab_size, (1, prompt))
    eng.reset(1, prompt + steps + 8)
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    with torch.no_grad():
        if interpret:                   # the interpreter is slow: prefill with the torch references
            os.environ["HARNESS_KERNELS"] = "torch"
        eng.prefill(ids)
        if interpret:
            os.environ["HARNESS_KERNELS"] = "triton"
        tok = ids[:, -1]
        for _ in range(steps - 1):      # reach a steady step (first steps may set state up)
            eng.decode(tok)
        c = Counter()
        LAUNCH["counter"] = c
        with c:
            eng.decode(tok)
        LAUNCH["counter"] = None
    return c


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--methods", nargs="+", default=["full", "infllm"])
    ap.add_argument("--prompt", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--top", type=int, default=10, help="source lines shown per method")
    ap.add_argument("--patch", nargs="*", default=[], metavar="MODULE.NAME=INT",
                    help="set a module's int constant first, e.g. kernels.topk.RADIX_MAX_CONTEXT=1024: a short "
                         "prompt then takes the dispatch a long context takes on the GPU")
    a = ap.parse_args(argv)
    for spec in a.patch:
        target, _, value = spec.partition("=")
        mod, _, attr = target.rpartition(".")
        setattr(importlib.import_module(mod), attr, int(value))
    if os.environ.get("TRITON_INTERPRET") == "1":
        _count_launches()
    model = tiny_model(a.layers)
    for spec in a.methods:
        c = count(model, spec, a.prompt, a.steps)
        print(f"== {spec}: {c.total / a.layers:.0f} ops per layer ({c.total} in the step, {a.layers} layers; "
              f"{(c.total - c.allocs) / a.layers:.1f} per layer without the {c.allocs} allocations)")
        for line, n in c.by_line.most_common(a.top):
            print(f"   {n / a.layers:6.1f}  {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
