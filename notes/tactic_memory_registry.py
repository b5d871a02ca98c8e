"""CPU live-bytes peaks of every registered method, per phase, against full's (notes/tactic_memory.md).

    PYTHONPATH=.:tests python notes/tactic_memory_registry.py 1024 16 128 [METHOD ...]

A 16-layer Llama (GQA 4: 8/2 heads, head dim 128, hidden 256, fp32), a CONTEXT-token prompt, each
method with its defaults and BUDGET_KNOB at BUDGET; the decode graph's capture as runners/graphs.py
does it (tests/live_bytes.py). CPU paths: a method whose CPU prefill is a reference (dense masks,
materialised scores) or whose offload buffers live in host memory shows more here than on a GPU."""
from __future__ import annotations

import sys

import torch
from live_bytes import LiveBytes, cpu_capture
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM, LlamaConfig

from methods import REGISTRY, ModelInfo, build
from methods.parts.budget import BUDGET_KNOB
from runners.engine import Engine

NEEDS = {"duo": {"heads": "random:0:8"}, "lychee": {"heads": "random:0:8"},
         "minference": {"patterns": "all:vertical_slash:64:64"}, "minference_cascade": {"patterns": "all:vertical_slash:64:64"}}


def main(context: int, layers: int, budget: int, names: list[str]) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=layers, num_attention_heads=8,
                      num_key_value_heads=2, head_dim=128, vocab_size=256, max_position_embeddings=131072)
    cfg._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    info = ModelInfo.from_hf_config(model.config)
    ids = torch.randint(0, 256, (1, context), generator=torch.Generator().manual_seed(0))
    full = None
    for name in ["full"] + [n for n in names or REGISTRY.names() if n != "full"]:
        opts = {**REGISTRY.get(name).Config.defaults(), **BUDGET_KNOB[name](budget), **NEEDS.get(name, {})}
        method = build(OmegaConf.create({"model": {"name": "tiny"}, "method": {"name": name, **opts}}).method, info)
        eng, lb, out = Engine(model, method), LiveBytes(), {}
        with lb:
            eng.reset(1, context + 8)
            out["declared"] = sum(t.numel() * t.element_size() for t in method.buffers().values() if t is not None)
            lb.mark()
            eng.prefill(ids)
            out["prefill"] = lb.peak
            lb.mark()
            if method.graph_safe:
                cpu_capture(eng, ids[:, -1])
            else:
                method.before_decode(eng.seq_len)
            out["capture"] = lb.peak
            eng.seq_len += 1
            lb.mark()
            for _ in range(2):
                eng.decode(ids[:, -1])
            out["decode"] = lb.peak
        out["overall"] = max(out["prefill"], out["capture"], out["decode"])
        full = full or out["overall"]
        mib = " ".join(f"{k} {v / 2**20:.2f}" for k, v in out.items())
        print(f"{name}: MiB {mib}; x full {out['overall'] / full:.3f}; graph_safe {method.graph_safe}, "
              f"decode_idempotent {method.decode_idempotent}", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:])
