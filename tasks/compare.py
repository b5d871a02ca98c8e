"""Compare mode's protocol: two engines side by side on the same tokens, the method's and a dense
reference (method `full`) on the same model, for tasks of mode "compare" (tasks/pg19_compare.py;
Tactic Figs. 9-10). The runner builds the reference engine and the rows (runners/batch.py
`reference_for`, `compare_rows`); what is measured on the two engines is here.

The reference engine shares the model's weights; each engine owns its KV cache. Per sample:
  kl     both prefill ids[:, :prefix], then both are fed ids[:, prefix + t] for t < steps (teacher
         forcing); each step's KL(full || method) of the next-token distributions, fp32;
  match  each engine prefills ids[:, :prefix] and decodes greedily for `steps` tokens on its own, no
         stop token; match_len = tokens before the first difference.
"""
from __future__ import annotations

import torch


def kl_full_vs_method(full_logits: torch.Tensor, method_logits: torch.Tensor) -> torch.Tensor:
    """KL(p_full || p_method) per row: cross-entropy(full, method) - entropy(full), [B] fp32."""
    lf = torch.log_softmax(full_logits.float(), -1)
    lm = torch.log_softmax(method_logits.float(), -1)
    return (lf.exp() * (lf - lm)).sum(-1)


@torch.inference_mode()
def kl_steps(engine, reference, ids: torch.Tensor, prefix: int, steps: int) -> torch.Tensor:
    """[B, steps] KL per decode step (teacher forced on ids[:, prefix:prefix + steps])."""
    B = ids.shape[0]
    out = torch.empty(B, steps, dtype=torch.float32)
    for eng in (engine, reference):
        eng.reset(B, prefix + steps)
        eng.prefill(ids[:, :prefix])
    for t in range(steps):
        token = ids[:, prefix + t]
        out[:, t] = kl_full_vs_method(reference.decode(token), engine.decode(token)).cpu()
    return out


def match_lengths(engine, reference, ids: torch.Tensor, prefix: int, steps: int) -> list[int]:
    """Greedy tokens each row generates before its first difference from full attention's."""
    ref = reference.generate(ids[:, :prefix], max_new_tokens=steps).tokens
    got = engine.generate(ids[:, :prefix], max_new_tokens=steps).tokens
    out = []
    for a, b in zip(ref, got):
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        out.append(n)
    return out


def compare(engine, reference, ids: torch.Tensor, protocol: str, prefix: int, steps: int) -> list[dict]:
    """One result dict per row: {"kl": [steps floats]} or {"match_len": n}."""
    ids = ids.to(engine.device)
    if protocol == "kl":
        return [{"kl": [float(x) for x in row]} for row in kl_steps(engine, reference, ids, prefix, steps)]
    if protocol == "match":
        return [{"match_len": n} for n in match_lengths(engine, reference, ids, prefix, steps)]
    raise ValueError(f"unknown compare protocol {protocol!r}")
