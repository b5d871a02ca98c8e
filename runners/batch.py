"""One batch of samples through the engine -> result rows; a batch that raises becomes failed rows."""
from __future__ import annotations

import time
import traceback
import weakref

import torch
from omegaconf import OmegaConf

import methods
from common.errors import HarnessError
from tasks.compare import compare

_REFERENCES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


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
    limit = None if task.mode == "nll" else engine.method.cfg.max_context(info)
    if limit is not None and len(first.input_ids) + first.max_new_tokens > limit:
        raise HarnessError(f"sample {first.id}: {len(first.input_ids)} prompt + {first.max_new_tokens} new tokens "
                           f"exceeds the {limit} positions {engine.method.name} can read on this model")
    if task.mode == "compare":   # the method beside a dense reference engine (Tactic Figs. 9-10)
        yield from compare_rows(engine, task, batch, method_metrics)
        return
    ids = torch.tensor([s.input_ids for s in batch], dtype=torch.long)
    hook = getattr(engine.method, "set_samples", None)   # per-sample facts a method may use (InfLLM's needle span)
    if hook is not None:
        hook([s.params for s in batch])
    if task.mode == "choice":   # the next-token distribution after the prompt (MMLU): no generation
        yield from _choice_rows(engine, task, batch, ids)
        return
    if task.mode == "nll":
        t0 = time.perf_counter()
        nll = engine.nll(ids, mode=first.nll_mode, stride=first.stride).cpu()
        elapsed = time.perf_counter() - t0
        if not torch.isfinite(nll).all():   # NaN/inf logits would poison every mean downstream
            bad = int((~torch.isfinite(nll)).sum())
            raise FloatingPointError(f"{bad} non-finite token NLL(s): NaN or inf logits")
        extra = method_metrics(engine.method)
        for s, row_nll in zip(batch, nll):
            yield {"id": s.id, "params": s.params, "metrics": {**task.score_nll(s, row_nll), **extra},
                   "input_tokens": len(s.input_ids), "nll_mode": s.nll_mode, "stride": s.stride,
                   "nll": [round(float(x), 4) for x in row_nll], "attended": engine.method.stats(),
                   "timings": {"nll_s": elapsed}, "batch_size": len(batch), "timestamp": time.time()}
        return
    gen = engine.generate(ids, max_new_tokens=first.max_new_tokens, stop_ids=[*stop_ids, *first.stop_ids],
                          temperature=first.temperature, top_p=first.top_p, seed=first.seed,
                          decode_tail=first.decode_tail)
    timings = vars(gen.timings)
    extra = method_metrics(engine.method)
    for s, toks, reason in zip(batch, gen.tokens, gen.stop_reason):
        text = tokenizer.decode(toks, skip_special_tokens=True)
        yield {"id": s.id, "params": s.params, "prediction": text, "references": s.references,
               "metrics": {**task.score(s, text), **extra}, "input_tokens": len(s.input_ids), "output_tokens": len(toks),
               "stop_reason": reason, "seed": s.seed, "timings": timings, "attended": engine.method.stats(),
               "batch_size": len(batch), "timestamp": time.time()}


def _choice_rows(engine, task, batch, ids):
    t0 = time.perf_counter()
    with torch.inference_mode():
        engine.reset(ids.shape[0], ids.shape[1])
        logits = engine.prefill(ids.to(engine.device), logits="last")
        probs = torch.softmax(logits.float(), dim=-1).cpu()
    elapsed = time.perf_counter() - t0
    if not torch.isfinite(probs).all():
        raise FloatingPointError("non-finite next-token probabilities: NaN or inf logits")
    extra = method_metrics(engine.method)
    for s, p in zip(batch, probs):
        metrics = task.score_choice(s, p)
        yield {"id": s.id, "params": s.params, "references": s.references, "metrics": {**metrics, **extra},
               "input_tokens": len(s.input_ids), "attended": engine.method.stats(),
               "timings": {"prefill_s": elapsed}, "batch_size": len(batch), "timestamp": time.time()}


def method_metrics(method) -> dict:
    """A method's per-sample scalars (`sample_metrics` in its stats: Tactic's mean attended tokens,
    obtained mass, oracle budgets), as row metrics `method_<name>` so compact rows keep them."""
    sample = method.stats().get("sample_metrics") or {}
    return {f"method_{k}": v for k, v in sample.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def mean_timings(rows):
    keys = ("prefill_s", "tail_s", "decode_ms_per_token", "nll_s", "peak_mem_gib")
    out = {}
    for k in keys:
        vals = [r["timings"][k] for r in rows if r.get("timings") and r["timings"].get(k) is not None]
        if vals:
            out[k] = sum(vals) / len(vals)
    return out


def reference_for(engine):
    """The dense engine beside `engine` (same model and weights, its own KV cache), built once."""
    ref = _REFERENCES.get(engine)
    if ref is None:
        from runners.engine import Engine

        full = methods.build(OmegaConf.create({"name": "full"}), engine.info)
        ref = _REFERENCES[engine] = Engine(engine.model, full)
    return ref


def compare_rows(engine, task, batch, method_metrics=lambda m: {}):
    """Rows of a compare-mode batch (run_batch dispatches here): the task scores each
    sample's result with `score_compare`; the method's own per-sample metrics ride along."""
    first = batch[0]
    p = first.params
    ids = torch.tensor([s.input_ids for s in batch], dtype=torch.long)
    t0 = time.perf_counter()
    results = compare(engine, reference_for(engine), ids, p["protocol"], int(p["prefix"]), int(p["steps"]))
    elapsed = time.perf_counter() - t0
    extra = method_metrics(engine.method)
    for s, res in zip(batch, results):
        yield {"id": s.id, "params": s.params, "metrics": {**task.score_compare(s, res), **extra},
               "input_tokens": len(s.input_ids), "compare": res, "attended": engine.method.stats(),
               "timings": {"compare_s": elapsed}, "batch_size": len(batch), "timestamp": time.time()}
