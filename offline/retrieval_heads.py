"""Retrieval heads (Wu et al. 2024; nightdessert/Retrieval_Head retrieval_head_detection.py): the heads
Ltri-LLM retrieves with (its `retrieval_heads` option; appendix C lists Llama-3-8B-262K's).

On NIAH samples (tasks.niah: the needle's token span comes with each sample) the model decodes greedily
with dense attention, fed as the reference does: the prompt minus its last token is prefilled, then
that token starts decoding. At each step, a (layer, query head) whose top-1 attention over the cache
falls inside the needle, on a token equal to the token just generated ("copy-paste"), scores
1 / needle length. Only answered samples count (the reference: ROUGE-1 recall > 50 against the needle;
here the task's own score: the number was found); a head's score is its mean over them. Heads above
`--threshold` (0.1, as Ltri-LLM) are written, best first, as [layer, head, score] triples.

    python -m offline.retrieval_heads --model smollm2 --lengths 1024 2048 --depths 10 30 50 70 90 \
        --rounds 2 --out results/retrieval_heads/smollm2.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from omegaconf import OmegaConf

import kernels
from methods import ModelInfo
from methods.full import Full
from runners import models
from runners.engine import Engine
from runners.results import git_commit
from tasks.base import ModelSpec
from tasks.niah import NIAH

CONF = Path(__file__).resolve().parents[1] / "conf"


class TopAttention(Full):
    """Dense attention that keeps, per layer, the position each query head attends most in decode."""

    name = ""   # not registered: a probe, not a method users pick

    def setup(self, info, batch, max_len, device, dtype):
        super().setup(info, batch, max_len, device, dtype)
        self.top = {}

    def attend(self, layer, q, k, v, rope):
        if self.step.phase != "decode":
            return super().attend(layer, q, k, v, rope)
        step = self.step
        q = rope.apply(q, step.positions)
        self.store.write(layer, step.positions, rope.apply(k, step.positions), v)
        out, scores = kernels.selection_attention(q[:, :, 0].contiguous(), self.store.k[layer], self.store.v[layer],
                                                  self.lengths, self.info.scaling, max_length=step.end)
        self.top[layer] = scores.argmax(-1)                                   # [B, Hq]
        return out.view(q.shape[0], 1, -1)


def score_sample(engine: Engine, sample, stop_ids) -> tuple[torch.Tensor, list[int]]:
    """(copy-paste score per [layer, head] for this sample, generated tokens)."""
    method, info = engine.method, engine.info
    ids = torch.tensor([sample.input_ids], device=engine.device)
    s, e = sample.params["needle_token"], sample.params["needle_end"]
    score = torch.zeros(info.num_layers, info.num_heads)
    engine.reset(1, ids.shape[1] + sample.max_new_tokens + 1)
    with torch.inference_mode():
        engine.prefill(ids[:, :-1], logits="none")
        token, out = ids[:, -1], []
        for _ in range(sample.max_new_tokens):
            logits = engine.decode(token)
            token = logits.argmax(-1)
            t = int(token)
            out.append(t)
            for layer, top in method.top.items():
                for h, pos in enumerate(top[0].tolist()):
                    if s <= pos < e and sample.input_ids[pos] == t:
                        score[layer, h] += 1.0 / (e - s)
            if t in stop_ids:
                break
    return score, out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048])
    ap.add_argument("--depths", type=float, nargs="+", default=[10, 30, 50, 70, 90])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--haystack", default="noise")
    ap.add_argument("--haystack-dir", default=None)
    ap.add_argument("--threshold", type=float, default=0.1)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    argv = sys.argv[1:] if argv is None else list(argv)
    device = models.resolve_device(args.device)
    mcfg = OmegaConf.load(CONF / "model" / f"{args.model}.yaml")
    model, tokenizer = models.load(mcfg, device, models.resolve_dtype("auto", device))
    info = ModelInfo.from_hf_config(model.config)
    tcfg = OmegaConf.load(CONF / "task" / "niah.yaml")
    tcfg.lengths, tcfg.depths, tcfg.rounds = args.lengths, args.depths, args.rounds
    tcfg.haystack, tcfg.haystack_dir = args.haystack, args.haystack_dir
    spec = ModelSpec(mcfg.name, int(mcfg.max_length), stop_tokens=list(mcfg.get("stop_tokens") or []))
    NIAH.validate(tcfg, spec)
    task = NIAH(tcfg, tokenizer, spec)
    stop_ids = {tokenizer.convert_tokens_to_ids(t) for t in spec.stop_tokens} | {tokenizer.eos_token_id}
    engine = Engine(model, TopAttention({"name": "full"}), use_graphs=False)
    counted, total = [], 0
    for sample in task.samples():
        score, out = score_sample(engine, sample, stop_ids)
        total += 1
        ok = task.score(sample, tokenizer.decode(out, skip_special_tokens=True))["accuracy"]
        print(f"{sample.id}: {'answered' if ok else 'missed'}", flush=True)
        if ok:
            counted.append(score)
    mean = torch.stack(counted).mean(0) if counted else torch.zeros(info.num_layers, info.num_heads)
    ranked = sorted(((l, h, round(float(mean[l, h]), 4)) for l in range(info.num_layers) for h in range(info.num_heads)),
                    key=lambda x: -x[2])
    heads = [list(x) for x in ranked if x[2] > args.threshold]
    result = {"procedure": "retrieval score (Wu et al. 2024, copy-paste top-1 attention)",
              "command": " ".join(["python", "-m", "offline.retrieval_heads", *[a for a in argv]]),
              "commit": git_commit(), "model": args.model, "samples": total,
              "answered": len(counted), "threshold": args.threshold, "retrieval_heads": heads,
              "top20": [list(x) for x in ranked[:20]]}
    print(json.dumps({k: result[k] for k in ("samples", "answered", "retrieval_heads")}))
    if args.out:
        path = Path(args.out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
