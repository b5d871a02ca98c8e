"""Per-head top-k overlap between adjacent layers (LycheeDecode Fig. 1 and Figs. 10-13, appendix E.3):
"For each attention head, we calculate the attention scores of the final answer token with respect to
all previous tokens and identify the top-k crucial tokens with the highest scores. Subsequently, we
compute the overlap rate of these crucial tokens for each attention head with those of the
corresponding head in the adjacent layer" (k = 5).

Input: the paper's prompt (raw text, no chat template, as the reference runs Llama-3) followed by the
answer the paper reports for Llama-3 ("circle", "banana", ...); the query is the last token of that
answer. Per layer and query head, the top-k keys of that query's attention (full attention, the
model's own eager attention), and per adjacent pair of layers, |top(l) ∩ top(l+1)| / k. The model's
own greedy answer to the prompt is recorded beside (it may differ from Llama-3's; SmolLM2-Instruct
ends at once, <|im_end|>, on most of these raw prompts). Writes one JSON
(command, commit) that analysis/papers/lychee_overlap.py renders.

    python -m bench.lychee_overlap --model smollm2 --out results/bench/lychee_overlap_smollm2.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from omegaconf import OmegaConf

from bench.engine import CONF, provenance
from runners import models
from runners.results import environment

LEAD = "Please directly output the final answer based on the given question. Question: "
# figure -> (question, Llama-3's answer in the paper)
PROMPTS = {
    "fig1": ("In a world containing only squares, circles, and triangles, one shape is defined by having no angles "
             "and being perfectly symmetrical from every point on its perimeter. What is the single name of the "
             "only shape that fits this description?", "circle"),
    "fig10": ("There are only two kinds of fruit in a box: apples and bananas. All apples are sour, and all bananas "
              "are sweet. I took a fruit from the box and tasted it. It was sweet. What is this fruit?", "banana"),
    "fig11": ("If you walk 10 meters north from a starting point, then 10 meters east, and finally 10 meters west, "
              "what direction are you from the original position?", "north"),
    "fig12": ("You start facing east. You turn left 90 degrees, then turn right 180 degrees, and finally turn left "
              "90 degrees. What direction are you facing now?", "east"),
    "fig13": ("If two days ago was Monday, what day is tomorrow?", "Thursday"),
}


def overlap(top: torch.Tensor) -> torch.Tensor:
    """top [L, H, k] key indices -> [L-1, H] share of layer l's top-k found in layer l+1's (same head)."""
    k = top.shape[-1]
    hits = (top[:-1].unsqueeze(-1) == top[1:].unsqueeze(-2)).any(-1)      # [L-1, H, k]
    return hits.sum(-1).float() / k


def top_keys(model, ids: torch.Tensor, k: int) -> torch.Tensor:
    """[L, H, k] the last query's k most-attended keys per layer and query head (eager attention)."""
    with torch.inference_mode():
        out = model(ids, output_attentions=True, use_cache=False)
    att = torch.stack([a[0, :, -1].float() for a in out.attentions])      # [L, H, T]
    return att.topk(k, dim=-1).indices


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="float32", help="eager attention weights; float32 by default")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    argv = sys.argv[1:] if argv is None else list(argv)
    device = models.resolve_device(args.device)
    dtype = models.resolve_dtype(args.dtype, device)
    model, tokenizer = models.load(OmegaConf.load(CONF / "model" / f"{args.model}.yaml"), device, dtype)
    model.config._attn_implementation = "eager"          # attention weights need the eager path
    cases = []
    for fig, (question, answer) in PROMPTS.items():
        prompt = LEAD + question + " Answer:"
        ids = tokenizer(prompt + " " + answer, return_tensors="pt")["input_ids"].to(device)
        p_ids = tokenizer(prompt, return_tensors="pt")["input_ids"].to(device)
        with torch.inference_mode():
            gen = model.generate(p_ids, max_new_tokens=8, do_sample=False)
        top = top_keys(model, ids, args.k)
        ov = overlap(top)
        cases.append({"figure": fig, "prompt": prompt, "answer": answer, "tokens": int(ids.shape[1]),
                      "model_answer": tokenizer.decode(gen[0, p_ids.shape[1]:]).strip(),   # special tokens kept
                      "query_token": tokenizer.decode(ids[0, -1:]), "overlap": [[round(float(x), 4) for x in r]
                                                                               for r in ov.tolist()]})
        print(f"{fig}: {ids.shape[1]} tokens, mean overlap {float(ov.mean()):.3f}, "
              f"{float((ov == 0).float().mean()) * 100:.0f}% of heads 0, {float((ov == 1).float().mean()) * 100:.0f}% 1; "
              f"model says {cases[-1]['model_answer']!r}", flush=True)
    out = {**provenance("bench.lychee_overlap", argv), "device": environment().get("gpu", "cpu"),
           "model": args.model, "dtype": str(dtype), "k": args.k, "cases": cases}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
