"""Peak memory and prefill time at 128K, batch 1, of the eviction family beside full attention
(issue 34; helper kit-evict). Llama-3.1-8B shape, random weights, bf16, each method's YAML defaults with
budget 4096 (the issue's table), one 128K prefill after a 4K warm-up, then 8 decode steps.
    python notes/kit-evict/probe_128k.py full snapkv pyramidkv h2o   (prints one JSON line per method)"""
import json
import sys
import time

import torch
from omegaconf import OmegaConf

from bench.engine import load_bench_model, release
from methods import REGISTRY, build
from runners.engine import Engine

GIB = 2 ** 30
model, info, dev, dtype = load_bench_model("llama31_8b", "random")
CTX = int(sys.argv[1]) if sys.argv[1].isdigit() else 131072
for name in [a for a in sys.argv[1:] if not a.isdigit()]:
    cfg = {"name": name, **REGISTRY.get(name).Config.defaults()}
    if "budget" in cfg:
        cfg["budget"] = 4096
    row = {"method": name, "context": CTX, "cfg": {k: v for k, v in cfg.items() if k in ("budget", "heads", "prefill_chunk")}}
    try:
        eng = Engine(model, build(OmegaConf.create(cfg), info))
        ids = torch.randint(0, info.vocab_size, (1, CTX), device=dev)
        eng.reset(1, 4096 + 16)
        eng.prefill(ids[:, :4096])
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        eng.reset(1, CTX + 16)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        eng.prefill(ids)
        torch.cuda.synchronize()
        row["prefill_s"] = round(time.perf_counter() - t0, 2)
        for _ in range(8):
            eng.decode(ids[:, -1])
        torch.cuda.synchronize()
        row["peak_gib"] = round(torch.cuda.max_memory_allocated() / GIB, 2)
        row["declared_gib"] = round(sum(t.numel() * t.element_size() for t in eng.method.buffers().values()
                                        if t is not None) / GIB, 2)
        release(eng)
        del eng
    except torch.cuda.OutOfMemoryError as e:
        row["error"] = "OOM " + str(e).splitlines()[0][:160]
    print(json.dumps(row), flush=True)
    torch.cuda.empty_cache()
