"""Attention-matrix reconstructions of the Cascading KV cache and StreamingLLM (the paper's Figs. 10 and
17): the first `--tokens` tokens of the first PG-19 test book streamed with a strided prefill through
the bounded cache; for chosen layers and heads, every query's attention probabilities over the keys
it can see (sinks, cached entries mapped back to their positions in the book, its chunk) are
accumulated into a grid x grid matrix (mean probability per block), so the cache's pattern and what
it keeps far behind the window show. StreamingLLM = the same cache with one cascade.

    python -m bench.cascade_attnmap --model smollm2 --data data/pg19_books/pg19_books.jsonl

Writes one JSON (with its command and commit) that analysis/papers/cascade_attnmap.py renders.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from omegaconf import OmegaConf

from bench.engine import CONF, provenance
from kernels.fused import rope as rotate
from methods import ModelInfo
from methods.cascade import Cascade
from runners import models
from runners.engine import Engine
from runners.results import environment
from tasks import datafiles


class Probe(Cascade):
    """The cascade method, recording the attention of some (layer, head) pairs on prefill chunks."""

    def __init__(self, cfg, pairs, grid: int, tokens: int):
        super().__init__(cfg)
        self.pairs, self.grid, self.tokens = pairs, grid, tokens
        self.mass = {p: torch.zeros(grid, grid, dtype=torch.float64) for p in pairs}

    def _prefill(self, layer, q, k, v, rope):
        heads = [h for (l, h) in self.pairs if l == layer]
        if heads:
            S, n, g = self.store, self.n_old, self.info.group
            cs, ss, cq, sq = self._rotations(rope, q)
            qr, kr = rotate(q, cq, sq), rotate(k, cq, sq)
            old = rotate(S.k[layer, :, :, :n], cs, ss) if n else kr[:, :, :0]
            T = q.shape[2]
            causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
            mask = torch.cat([torch.ones(T, n, dtype=torch.bool, device=q.device), causal], 1)
            qb = (self.step.positions * self.grid // self.tokens).cpu()
            for h in heads:
                keys = torch.cat([old[0, h // g], kr[0, h // g]], 0).float()
                s = (qr[0, h].float() @ keys.T) * self.info.scaling
                p = torch.softmax(s.masked_fill(~mask, float("-inf")), -1).double().cpu()
                kpos = torch.cat([S.tok[layer, 0, h // g, :n], self.step.positions]).cpu()
                kb = (kpos * self.grid // self.tokens).clamp(0, self.grid - 1)
                flat = (qb.view(-1, 1) * self.grid + kb.view(1, -1)).flatten()
                self.mass[layer, h].view(-1).index_add_(0, flat, p.flatten())
        return super()._prefill(layer, q, k, v, rope)


def first_book(path: str, tokenizer, n: int) -> list[int]:
    with datafiles.open_text(path) as f:       # data/ stores it as .jsonl.xz
        for line in f:
            row = json.loads(line)
            if row.get("pg19_split", "test") == "test":
                return tokenizer(row["text"])["input_ids"][:n]
    raise SystemExit(f"error: no PG-19 test book in {path}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--data", default="data/pg19_books/pg19_books.jsonl")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--cache", type=int, default=2048)
    ap.add_argument("--cascades", type=int, default=4)
    ap.add_argument("--stride", type=int, default=256)
    ap.add_argument("--layers", type=int, nargs="+", default=None, help="default: first, middle, last")
    ap.add_argument("--heads", type=int, nargs="+", default=[0])
    ap.add_argument("--grid", type=int, default=128)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    argv = sys.argv[1:] if argv is None else list(argv)
    device = models.resolve_device(args.device)
    dtype = models.resolve_dtype(args.dtype, device)
    model, tokenizer = models.load(OmegaConf.load(CONF / "model" / f"{args.model}.yaml"), device, dtype)
    info = ModelInfo.from_hf_config(model.config)
    layers = args.layers or [0, info.num_layers // 2, info.num_layers - 1]
    ids = torch.tensor([first_book(args.data, tokenizer, args.tokens)], device=device)
    N = ids.shape[1]
    maps = []
    for name, cascades in (("streaming", 1), ("cascade", args.cascades)):
        cfg = Cascade.Config.parse({"sink": 64, "cache_size": args.cache, "cascades": cascades, "stride": args.stride},
                                   info)
        probe = Probe(cfg, [(l, h) for l in layers for h in args.heads], args.grid, N)
        eng = Engine(model, probe)
        eng.reset(1, N)
        with torch.inference_mode():
            eng.prefill(ids, logits="none")
        per_block = torch.bincount((torch.arange(N) * args.grid // N), minlength=args.grid).double().view(-1, 1)
        for (l, h), m in probe.mass.items():
            maps.append({"method": name, "layer": l, "head": h,
                         "mean_prob": [[round(float(x), 7) for x in row] for row in (m / per_block).tolist()]})
        print(f"{name}: done", flush=True)
    out = {**provenance("bench.cascade_attnmap", argv), "device": environment().get("gpu", "cpu"),
           "model": args.model, "dtype": str(dtype), "tokens": N, "rows": [],
           "settings": {k: v for k, v in vars(args).items() if k != "out"} | {"layers": layers}, "maps": maps}
    text = json.dumps(out)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
        print(f"wrote {args.out}")
    else:
        print(text[:2000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
