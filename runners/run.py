"""The run loop: validate, load, walk the task's samples, write one row per sample, summarize."""
from __future__ import annotations

import sys
import time

import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

import methods
import tasks
from runners import models
from common.errors import HarnessError
from runners.report import print_table
from runners.results import RunDir, environment
from runners.validate import model_info, model_spec, validate
from runners.wandb_log import WandbLogger


def run(cfg: DictConfig) -> dict | None:
    """Entry point called by run.py. Bad input ends with one line on stderr and exit code 2."""
    try:
        return _run(cfg)
    except HarnessError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)


def _run(cfg: DictConfig) -> dict:
    validate(cfg)
    t0 = time.time()
    torch.manual_seed(int(cfg.runner.seed))
    device = models.resolve_device(cfg.runner.device)
    dtype = models.resolve_dtype(cfg.runner.dtype, device)
    out = RunDir(cfg)
    out.repair()

    model, tokenizer = models.load(cfg.model, device, dtype)
    info = methods.ModelInfo.from_hf_config(model.config)
    _check_arch(cfg, info)
    method = methods.build(cfg.method, info)
    if tokenizer is None:
        raise HarnessError(f"task {cfg.task.name} needs a tokenizer; model.weights=random found none offline "
                           f"(pass model.path=DIR with a tokenizer)")
    task = tasks.build(cfg.task, tokenizer, model_spec(cfg.model, method.cfg))
    from runners.engine import Engine

    engine = Engine(model, method)
    stop_ids = _stop_ids(tokenizer, cfg.model)

    done = out.done_ids()
    # Samples are built lazily: a 1M-token passkey grid would otherwise sit in memory whole.
    todo = (s for s in task.limited() if s.id not in done)
    common = {"task": cfg.task.name, "model": cfg.model.name, "method": cfg.method.name,
              "run_id": out.hash, "weights": cfg.model.get("weights", "pretrained"), "dtype": str(dtype),
              "device": str(device), "semantics": method.semantics(), "protocol": task.describe()}
    limit = cfg.task.get("limit")
    bar = tqdm(total=int(limit) if limit is not None else None, initial=len(done), desc=f"{cfg.method.name}/{cfg.task.name}",
               disable=not cfg.runner.progress, mininterval=1.0, file=sys.stderr)
    for batch in _batches(todo, int(cfg.runner.batch_size)):
        for row in _run_batch(engine, task, batch, tokenizer, stop_ids, info):
            out.append({**common, **row})
            bar.update(1)
    bar.close()

    rows = out.rows()
    summary = {"run_id": out.hash, "task": cfg.task.name, "model": cfg.model.name, "method": cfg.method.name,
               "n_samples": len(rows), "metrics": task.summarize(rows), "timings": _mean_timings(rows),
               "semantics": method.semantics(), "protocol": task.describe(),
               "config": OmegaConf.to_container(cfg, resolve=True), "environment": environment(),
               "wall_s": time.time() - t0, "results_dir": str(out.path)}
    out.write_summary(summary)
    WandbLogger(cfg).log(rows, summary)
    print_table(summary)
    return summary


def _check_arch(cfg, info) -> None:
    expected = model_info(cfg.model)
    for field in ("num_layers", "num_heads", "num_kv_heads", "head_dim"):
        if getattr(info, field) != getattr(expected, field):
            raise HarnessError(f"model {cfg.model.name}: loaded {field}={getattr(info, field)} but its YAML says "
                               f"{getattr(expected, field)}; fix conf/model/{cfg.model.name}.yaml")


def _stop_ids(tokenizer, model_cfg) -> list[int]:
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    vocab = tokenizer.get_vocab()
    for tok in model_cfg.get("stop_tokens") or []:
        if tok in vocab:
            ids.add(int(vocab[tok]))
    return sorted(ids)


def _batches(samples, size):
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


def _run_batch(engine, task, batch, tokenizer, stop_ids, info):
    first = batch[0]
    # Generation must stay within what the method can read (the model's positions, or any length for
    # a bounded cache with in-cache positions: MethodConfig.max_context). NLL runs are exempt on
    # purpose: the Cascading PG-19 protocol streams books longer than the context through a bounded cache.
    limit = engine.method.cfg.max_context(info)
    if task.mode != "nll" and limit is not None and len(first.input_ids) + first.max_new_tokens > limit:
        raise HarnessError(f"sample {first.id}: {len(first.input_ids)} prompt + {first.max_new_tokens} new tokens "
                           f"exceeds the {limit} positions {engine.method.name} can read on this model")
    ids = torch.tensor([s.input_ids for s in batch], dtype=torch.long)
    if task.mode == "nll":
        nll = engine.nll(ids, mode=first.nll_mode, stride=first.stride).cpu()
        for s, row_nll in zip(batch, nll):
            yield {"id": s.id, "params": s.params, "metrics": task.score_nll(s, row_nll),
                   "input_tokens": len(s.input_ids), "nll_mode": s.nll_mode, "stride": s.stride,
                   "nll": [round(float(x), 4) for x in row_nll], "attended": engine.method.stats()}
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


def _mean_timings(rows):
    keys = ("prefill_s", "tail_s", "decode_ms_per_token", "peak_mem_gib")
    out = {}
    for k in keys:
        vals = [r["timings"][k] for r in rows if r.get("timings") and r["timings"].get(k) is not None]
        if vals:
            out[k] = sum(vals) / len(vals)
    return out
