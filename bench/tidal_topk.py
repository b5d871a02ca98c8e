"""Exact per-layer top-k tokens at one decode step (TidalDecode Figs. 1 and 3), through the engine.

The probe is dense attention (method `full`) that, at a decode step, also takes the UNSCALED scores
q.k of every layer from the same kernel TidalDecode selects with (kernels.selection_attention) and keeps
each layer's top-k positions by methods.parts.selection.top_tokens, TidalDecode's own selection rule. Sets are
per QUERY head, as the reference selects (after repeat_kv) and as our tidal method does by default
(select=query_head): a query head's set at a selection layer is what the same head index attends in the
later layers. `fig3` also keeps one set per KV head (select=kv_head: the group's summed probabilities).
The step analysed is the first decode step: the prompt is prefilled densely, its greedy next token is
fed back, and that token's queries attend the whole cache (itself included, Algorithm 1 appends before
attending): the first step where TidalDecode's sparse layers would act.

  fig1  the paper's prompt (raw text), k = 5, head 0: which tokens each layer's top-5 holds.
  fig3  NIAH prompts (tasks/niah.py, TidalDecode's needle protocol), k = 256: (a) overlap between every
        pair of layers, |T_i ∩ T_j| / k per query head, averaged over heads, then over prompts; (b) the
        recall of TidalDecode's reused sets against each layer's own top-k, per choice of re-selection
        layer r: every layer after the first selection layer (dense_layers, 2) that is not a selection
        layer attends the set of the latest selection layer before it (the first one's up to r, r's
        after), recall = |T_src ∩ T_layer| / k averaged over those layers and heads; "none" = one
        selection layer. These are oracle recalls on full-attention hidden states (the paper: "compute
        full attention, and analyze the top 256 tokens").

    python -m bench.tidal_topk fig1 --model smollm2 --out results/bench/tidal_topk_fig1_smollm2.json
    python -m bench.tidal_topk fig3 --model smollm2 --rounds 2 --out results/bench/tidal_topk_fig3_smollm2.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from omegaconf import OmegaConf

import kernels
from bench.engine import CONF, provenance
from methods import ModelInfo
from methods.parts import selection
from methods.full import Full
from runners import models
from runners.engine import Engine
from runners.results import environment

# Fig. 1's prompt, verbatim from the caption (the paper's "<—begin_of_text—>" is Llama-3's BOS text)
FIG1_PROMPT = ("Use only the provided search results to write a high-quality, concise answer to the question.\n"
               "<|begin_of_text|>\n The magic number is: 15213. \n\n\n Question: What is the magic number? Keep the "
               "response short and direct. Answer: ")
DENSE_LAYERS = 2          # TidalDecode's first selection layer (method default dense_layers)


class TopK(Full):
    """Dense attention that keeps, at the first decode step after `setup`, every layer's exact top-k
    positions per query head (and per KV head when `kv_sets`), and optionally the scores themselves."""

    name = ""   # not registered: a probe, not a method users pick

    def __init__(self, k: int, kv_sets: bool = False, keep_scores: bool = False):
        super().__init__({"name": "full"})
        self.k, self.kv_sets, self.keep_scores = k, kv_sets, keep_scores

    def setup(self, info, batch, max_len, device, dtype):
        super().setup(info, batch, max_len, device, dtype)
        self.top, self.top_kv, self.scores = {}, {}, {}

    def attend(self, layer, q, k, v, rope):
        if self.step.phase != "decode" or layer in self.top:    # only the first decode step is analysed
            return super().attend(layer, q, k, v, rope)
        step, info = self.step, self.info
        q = rope.apply(q, step.positions)
        self.store.write(layer, step.positions, rope.apply(k, step.positions), v)
        out, scores = kernels.selection_attention(q[:, :, 0].contiguous(), self.store.k[layer], self.store.v[layer],
                                                  self.lengths, info.scaling, max_length=step.end)
        self.top[layer] = selection.marked(*selection.top_tokens(scores, self.lengths, self.k))[0].cpu()
        if self.kv_sets:
            grouped = selection.group_reduce(scores, info.num_kv_heads, "softmax_sum", info.scaling)
            self.top_kv[layer] = selection.marked(*selection.top_tokens(grouped, self.lengths, self.k))[0].cpu()
        if self.keep_scores:
            self.scores[layer] = scores[0].float().cpu()
        return out.view(q.shape[0], 1, -1)


def stack(sets: dict) -> torch.Tensor:
    """{layer: [H, k]} -> [L, H, k] in layer order."""
    return torch.stack([sets[layer] for layer in sorted(sets)])


def pair_overlap(top: torch.Tensor, n_keys: int) -> torch.Tensor:
    """top [L, H, k] positions (-1 = empty slot) -> [L, L, H]: |T_i,h ∩ T_j,h| / k for every layer pair."""
    L, H, k = top.shape
    member = torch.zeros(L, H, n_keys + 1)
    member.scatter_(-1, torch.where(top < 0, n_keys, top).long(), 1.0)   # empty slots land in a spare column
    member = member[..., :n_keys]
    return torch.einsum("ahs,bhs->abh", member, member) / k


def sources(num_layers: int, first: int, reselect: int | None) -> dict[int, int]:
    """Sparse layer -> the selection layer whose set it attends (TidalDecode with these two layers)."""
    return {layer: (reselect if reselect is not None and layer > reselect else first)
            for layer in range(first + 1, num_layers) if layer != reselect}


def recall(pair: torch.Tensor, first: int, reselect: int | None) -> float:
    """Mean over the sparse layers and heads of |T_src ∩ T_layer| / k (pair: [L, L, H] from pair_overlap)."""
    src = sources(pair.shape[0], first, reselect)
    return float(torch.stack([pair[s, layer] for layer, s in src.items()]).mean())


def reselect_choices(num_layers: int, first: int = DENSE_LAYERS) -> list[int | None]:
    return [None, *range(first + 1, num_layers)]


def first_step(engine: Engine, ids: torch.Tensor, answer_tokens: int, stop_ids) -> list[int]:
    """Dense prefill of `ids` [1, T], then greedy decoding: the probe records every layer's sets at the
    first decode step (the prompt's greedy next token fed back; fed even when it is a stop token, so the
    step is always analysed). Returns the greedy tokens (up to and including a stop token)."""
    engine.reset(1, ids.shape[1] + answer_tokens + 1)
    out = []
    with torch.inference_mode():
        logits = engine.prefill(ids)
        for i in range(answer_tokens):
            token = logits.argmax(-1)
            out.append(int(token))
            if i and int(token) in stop_ids:
                break
            logits = engine.decode(token)
            if int(token) in stop_ids:
                break
    return out


def _r(x, d=4):
    return [_r(v, d) for v in x] if isinstance(x, list) else round(float(x), d)


def fig1(engine, tokenizer, args, stop_ids) -> dict:
    probe = engine.method
    ids = tokenizer(FIG1_PROMPT, return_tensors="pt")["input_ids"].to(engine.device)
    answer = first_step(engine, ids, 8, stop_ids)
    token = answer[0]
    top = stack(probe.top)                                            # [L, Hq, k]
    n_keys = ids.shape[1] + 1
    info = engine.info
    probs = torch.stack([torch.softmax(probe.scores[layer][args.head, :n_keys] * info.scaling, -1)
                         for layer in sorted(probe.scores)])          # [L, S] the head's attention
    share = torch.zeros(top.shape[0], n_keys)
    for layer in range(top.shape[0]):
        share[layer] = torch.bincount(top[layer].flatten().clamp(min=0).long(), minlength=n_keys)[:n_keys] / top.shape[1]
    pair = pair_overlap(top, n_keys)
    adjacent = torch.stack([pair[i, i + 1] for i in range(top.shape[0] - 1)])      # [L-1, Hq]
    print(f"fig1: {ids.shape[1]} prompt tokens, answer {tokenizer.decode(answer)!r}, adjacent top-{args.k} overlap "
          f"head {args.head} {float(adjacent[:, args.head].mean()):.3f}, all heads {float(adjacent.mean()):.3f}")
    return {"prompt": FIG1_PROMPT, "tokens": [tokenizer.decode([t]) for t in ids[0].tolist()] + [tokenizer.decode([token])],
            "prompt_tokens": int(ids.shape[1]), "query_token": tokenizer.decode([token]),
            "model_answer": tokenizer.decode(answer), "head": args.head,
            "top": top[:, args.head].tolist(), "head_probs": _r(probs.tolist()), "head_share": _r(share.tolist()),
            "adjacent": _r(adjacent.tolist())}


def niah_samples(tokenizer, mcfg, args):
    from tasks.base import ModelSpec
    from tasks.niah import NIAH

    tcfg = OmegaConf.load(CONF / "task" / "niah.yaml")
    tcfg.lengths, tcfg.depths, tcfg.rounds = [args.length], args.depths, args.rounds
    tcfg.haystack, tcfg.haystack_dir = args.haystack, args.haystack_dir
    spec = ModelSpec(mcfg.name, int(mcfg.max_length), stop_tokens=list(mcfg.get("stop_tokens") or []))
    NIAH.validate(tcfg, spec)
    task = NIAH(tcfg, tokenizer, spec)
    return task, list(task.samples())


def fig3(engine, tokenizer, mcfg, args, stop_ids) -> dict:
    probe, L = engine.method, engine.info.num_layers
    task, samples = niah_samples(tokenizer, mcfg, args)
    choices = reselect_choices(L)
    rows, overlaps = [], []
    for s in samples[: args.limit or None]:
        ids = torch.tensor([s.input_ids], device=engine.device)
        out = first_step(engine, ids, args.answer_tokens, stop_ids)
        n_keys = ids.shape[1] + 1
        pair_q = pair_overlap(stack(probe.top), n_keys)
        pair_kv = pair_overlap(stack(probe.top_kv), n_keys)
        overlaps.append(pair_q.mean(-1))
        answered = task.score(s, tokenizer.decode(out, skip_special_tokens=True))["accuracy"]
        rows.append({"id": s.id, "tokens": int(ids.shape[1]), "answered": answered,
                     "recall_query_head": _r([recall(pair_q, DENSE_LAYERS, r) for r in choices]),
                     "recall_kv_head": _r([recall(pair_kv, DENSE_LAYERS, r) for r in choices])})
        best = max(range(1, len(choices)), key=lambda i: rows[-1]["recall_query_head"][i])
        print(f"{s.id}: answered {answered}, recall none {rows[-1]['recall_query_head'][0]:.3f}, best L{choices[best]} "
              f"{rows[-1]['recall_query_head'][best]:.3f}", flush=True)
    ov = torch.stack(overlaps)
    return {"k": args.k, "first_layer": DENSE_LAYERS, "reselect": ["none" if r is None else r for r in choices],
            "haystack": args.haystack, "length": args.length, "samples": rows,
            "overlap_mean": _r(ov.mean(0).tolist()), "overlap_sd": _r(ov.std(0).tolist() if len(ov) > 1 else
                                                                       torch.zeros_like(ov[0]).tolist())}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("figure", choices=["fig1", "fig3"])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--hub-id", default=None, help="another checkpoint of the model's architecture (Fig. 1: "
                                                   "meta-llama/Meta-Llama-3-8B-Instruct)")
    ap.add_argument("--k", type=int, default=None, help="top-k (default: fig1 5, fig3 256)")
    ap.add_argument("--head", type=int, default=0, help="fig1: the query head drawn (the paper: the first)")
    ap.add_argument("--length", type=int, default=4096, help="fig3: NIAH prompt tokens")
    ap.add_argument("--depths", type=float, nargs="+", default=[0, 11, 22, 33, 44, 56, 67, 78, 89, 100])
    ap.add_argument("--rounds", type=int, default=5, help="fig3: prompts per depth")
    ap.add_argument("--haystack", default="noise", help="fig3: noise (built in) | pg19 | essays (tasks/niah.py)")
    ap.add_argument("--haystack-dir", default=None)
    ap.add_argument("--limit", type=int, default=None, help="fig3: first N prompts only")
    ap.add_argument("--answer-tokens", type=int, default=16)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="float32", help="float32 (default): exact sets on any device; the paper "
                                                       "model at 100K needs bfloat16")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    argv = sys.argv[1:] if argv is None else list(argv)
    args.k = args.k or (5 if args.figure == "fig1" else 256)
    device = models.resolve_device(args.device)
    dtype = models.resolve_dtype(args.dtype, device)
    mcfg = OmegaConf.load(CONF / "model" / f"{args.model}.yaml")
    if args.hub_id:
        mcfg.hub_id, mcfg.gguf = args.hub_id, None
    model, tokenizer = models.load(mcfg, device, dtype)
    probe = TopK(args.k, kv_sets=args.figure == "fig3", keep_scores=args.figure == "fig1")
    engine = Engine(model, probe, use_graphs=False)
    stop_ids = {tokenizer.convert_tokens_to_ids(t) for t in (mcfg.get("stop_tokens") or [])} | {tokenizer.eos_token_id}
    info = ModelInfo.from_hf_config(model.config)
    body = fig1(engine, tokenizer, args, stop_ids) if args.figure == "fig1" else fig3(engine, tokenizer, mcfg, args,
                                                                                       stop_ids)
    out = {**provenance("bench.tidal_topk", argv), "device": environment().get("gpu", "cpu"), "model": args.model,
           "hub_id": str(mcfg.hub_id), "dtype": str(dtype), "figure": args.figure, "k": args.k,
           "layers": info.num_layers, "query_heads": info.num_heads, "kv_heads": info.num_kv_heads, "rows": [], **body}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
