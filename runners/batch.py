"""One batch of samples through the engine -> result rows; a batch that raises becomes failed rows."""
from __future__ import annotations

import time
import traceback

import torch

from common.errors import HarnessError


def batches(samples, size):
    """Consecutive samples of equal prompt length and generation settings, up to `size`."""
    batch = []
    for s in samples:
        key = (len(s.input_ids), s.max_new_tokens, s.decode_tail, s.temperature, s.top_p, s.seed, s.nll_mode,
               tuple(s.stop_ids))
        if batch and (len(batch) == size or key != batch[0][0]):
            yield [b for _, b in batch]
            batch = []
        batch.append((key, s))
    if batch:
        yield [b for _, b in batch]


def run_batch_safely(engine, task, batch, tokenizer, stop_ids, info, on_error: str) -> list[dict]:
    """Rows of the batch, each with status "ok"; when the batch raises (a CUDA OOM, NaN logits, a
    tokenizer or scorer error), one "failed" row per sample with the error, and the run goes on.
    A HarnessError is the user's input, not the sample's: it stops the run (one line, exit 2)."""
    try:
        rows = list(run_batch(engine, task, batch, tokenizer, stop_ids, info))
    except HarnessError:
        raise
    except Exception as e:
        if on_error == "raise":
            raise
        error = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:500]}"
        tb = traceback.format_exc()[-4000:]
        _free_device_memory(engine)
        return [{"id": s.id, "status": "failed", "error": error, "traceback": tb, "params": s.params,
                 "references": s.references, "input_tokens": len(s.input_ids), "batch_size": len(batch),
                 "timestamp": time.time()} for s in batch]
    return [{**r, "status": "ok"} for r in rows]


def _free_device_memory(engine) -> None:
    """After an OOM the failed sample's tensors are garbage: give their memory back before the next."""
    if torch.cuda.is_available() and getattr(engine, "device", torch.device("cpu")).type == "cuda":
        torch.cuda.empty_cache()


def run_batch(engine, task, batch, tokenizer, stop_ids, info):
    first = batch[0]
    # Generation must stay within what the method can read (the model's positions, or any length for
    # a bounded cache with in-cache positions: MethodConfig.max_context). NLL runs are exempt on
    # purpose: the Cascading PG-19 protocol streams books longer than the context through a bounded cache.
    limit = engine.method.cfg.max_context(info) if task.mode != "nll" else None
    if limit is not None and len(first.input_ids) + first.max_new_tokens > limit:
        raise HarnessError(f"sample {first.id}: {len(first.input_ids)} prompt + {first.max_new_tokens} new tokens "
                           f"exceeds the {limit} positions {engine.method.name} can read on this model")
    ids = torch.tensor([s.input_ids for s in batch], dtype=torch.long)
    if task.mode == "nll":
        t0 = time.perf_counter()
        nll = engine.nll(ids, mode=first.nll_mode, stride=first.stride).cpu()
        elapsed = time.perf_counter() - t0
        if not torch.isfinite(nll).all():   # NaN/inf logits would poison every mean downstream
            bad = int((~torch.isfinite(nll)).sum())
            raise FloatingPointError(f"{bad} non-finite token NLL(s): NaN or inf logits")
        for s, row_nll in zip(batch, nll):
            yield {"id": s.id, "params": s.params, "metrics": task.score_nll(s, row_nll),
                   "input_tokens": len(s.input_ids), "nll_mode": s.nll_mode, "stride": s.stride,
                   "nll": [round(float(x), 4) for x in row_nll], "attended": engine.method.stats(),
                   "timings": {"nll_s": elapsed}, "batch_size": len(batch), "timestamp": time.time()}
        return
    gen = engine.generate(ids, max_new_tokens=first.max_new_tokens, stop_ids=[*stop_ids, *first.stop_ids],
                          temperature=first.temperature, top_p=first.top_p, seed=first.seed,
                          decode_tail=first.decode_tail)
    timings = vars(gen.timings)
    for s, toks, reason in zip(batch, gen.tokens, gen.stop_reason):
        text = tokenizer.decode(toks, skip_special_tokens=True)
        yield {"id": s.id, "params": s.params, "prediction": text, "references": s.references,
               "metrics": task.score(s, text), "input_tokens": len(s.input_ids), "output_tokens": len(toks),
               "stop_reason": reason, "seed": s.seed, "timings": timings, "attended": engine.method.stats(),
               "batch_size": len(batch), "timestamp": time.time()}


def mean_timings(rows):
    keys = ("prefill_s", "tail_s", "decode_ms_per_token", "nll_s", "peak_mem_gib")
    out = {}
    for k in keys:
        vals = [r["timings"][k] for r in rows if r.get("timings") and r["timings"].get(k) is not None]
        if vals:
            out[k] = sum(vals) / len(vals)
    return out
