"""The run loop: validate, build the task's samples, load, walk the samples, write one row per
sample, summarize.

Order matters for a user's first minute: everything that can be wrong with the input (config, task
data, prompt lengths, the model's source) is found before the model loads and before a run
directory exists, and reported as one `error:` line with exit code 2.
"""
from __future__ import annotations

import sys
import time

import torch
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

import methods
import tasks
from common.errors import HarnessError
from runners import hub, models
from runners import plan as memory_plan
from runners.batch import batches, mean_timings, run_batch_safely
from runners.report import print_table
from runners.results import RunDir, environment
from runners.validate import max_position, model_info, model_spec, validate
from runners.wandb_log import WandbLogger

MAX_WARNINGS = 5    # failed samples announced one by one; the rest are counted in the summary


def run(cfg: DictConfig, report: bool = True) -> dict | None:
    """Entry point called by run.py. Bad input ends with one line on stderr and exit code 2."""
    try:
        return _run(cfg, report)
    except HarnessError as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        sys.exit(e.exit_code)


def one_line(e: Exception) -> str:
    return " ".join(line.strip() for line in str(e).splitlines() if line.strip()) or type(e).__name__


def _run(cfg: DictConfig, report: bool) -> dict:
    validate(cfg)
    t0 = time.time()
    # the code this process runs is the tree at its start: a commit made while a long run goes on
    # must not be recorded as the one that produced it
    env = environment()
    device = models.resolve_device(cfg.runner.device)
    dtype = models.resolve_dtype(cfg.runner.dtype, device)
    hub.offline_if_unreachable()   # before anything asks the hub: fail in one line, not after a minute of retries
    # The task sees the model as the method reads it: a bounded cache with in-cache positions
    # (MethodConfig.max_context None) may take lengths past the model's positions.
    spec = model_spec(cfg.model, methods.get(cfg.method.name).validate(cfg.method, model_info(cfg.model)))
    tasks.get(cfg.task.name).check_data(cfg.task, spec)
    tokenizer = models.load_tokenizer(cfg.model)
    if tokenizer is None:
        raise HarnessError(f"task {cfg.task.name} needs a tokenizer; model.weights=random found none offline "
                           f"(pass model.path=DIR with a tokenizer)")
    task = tasks.build(cfg.task, tokenizer, spec)
    # Build every prompt once before the model loads: a length too short for the prompt or missing
    # data fails here, and the count is the progress bar's total. (Samples are built again, lazily,
    # in the loop: a 1M-token grid never sits in memory whole.)
    plan, longest = [], 0
    for s in task.limited():
        plan.append(s.id)
        longest = max(longest, len(s.input_ids) + s.max_new_tokens)
    if len(set(plan)) != len(plan):
        raise HarnessError(f"task {cfg.task.name} yields duplicate sample ids; rows are keyed by id")

    # the memory plan, before any weight loads: one line; a run that cannot fit stops here (exit 2)
    placement = memory_plan.for_run(cfg, device, dtype, min(int(cfg.runner.batch_size), len(plan)) or 1, longest)
    torch.manual_seed(int(cfg.runner.seed))
    model, tokenizer = models.load(cfg.model, device, dtype, tokenizer=tokenizer, placement=placement)
    if cfg.model.get("max_position") is not None:
        # the engine and methods read the limit from the HF config; RoPE itself takes any position
        model.config.max_position_embeddings = max_position(cfg.model)
    info = methods.ModelInfo.from_hf_config(model.config)
    _check_arch(cfg, info)
    method = methods.build(cfg.method, info)
    from runners.engine import Engine

    engine = Engine(model, method, placement=placement)
    stop_ids = _stop_ids(tokenizer, cfg.model)

    out = RunDir(cfg)
    out.open()
    try:
        return _loop(cfg, out, task, engine, tokenizer, stop_ids, info, method, plan, dtype, device, t0, env,
                     report)
    finally:
        out.close()


def _loop(cfg, out, task, engine, tokenizer, stop_ids, info, method, plan, dtype, device, t0, env,
          report) -> dict:
    done = out.done_ids()
    kept = sum(1 for i in plan if i in done)
    planned = set(plan)
    retry = [f["id"] for f in out.failures() if f["id"] in planned]
    if kept or retry:
        print(f"resuming {out.path}: {kept} of {len(plan)} samples kept, {len(plan) - kept} to run"
              + (f" ({len(retry)} failed before: retrying them)" if retry else ""), file=sys.stderr)
    common = {"task": cfg.task.name, "model": cfg.model.name, "method": cfg.method.name,
              "run_id": out.hash, "weights": cfg.model.get("weights", "pretrained"), "dtype": str(dtype),
              "device": str(device), "semantics": method.semantics(), "protocol": task.describe(),
              "writer": out.store.writer}
    previous = out.previous_summary()
    # W&B steps must grow across reruns: start above every step a previous process can have logged
    # (each logged row is a line on disk, and only a finished run compacts, recording its steps).
    base = int(((previous or {}).get("wandb") or {}).get("steps") or 0) + out.line_count()
    logger = WandbLogger(cfg, out.hash, base_step=base)
    todo = (s for s in task.limited() if out.claim(s.id))   # skips finished ids and other writers' samples
    bar = tqdm(total=len(plan), initial=kept, desc=f"{cfg.method.name}/{cfg.task.name}",
               disable=not cfg.runner.progress, mininterval=1.0, file=sys.stderr)
    failed_now = 0
    try:
        for batch in batches(todo, int(cfg.runner.batch_size)):
            for row in run_batch_safely(engine, task, batch, tokenizer, stop_ids, info, cfg.runner.on_error):
                row = {**common, **row}
                if row["status"] == "ok":
                    if not out.append(row):
                        continue   # another writer finished it first: its row stands
                else:
                    out.record_failure(row)
                    failed_now += 1
                    if failed_now <= MAX_WARNINGS:
                        more = "; further failures are only counted" if failed_now == MAX_WARNINGS else ""
                        bar.write(f"warning: sample {row['id']} failed ({row['error']}); recorded in "
                                  f"{out.failed_path.name}, the run goes on{more}", file=sys.stderr)
                logger.row(row)
                bar.update(1)
    finally:
        bar.close()

    rows = out.rows()
    failures = out.failures()
    elsewhere = out.store.pending_elsewhere()
    summary = {"run_id": out.hash, "task": cfg.task.name, "model": cfg.model.name, "method": cfg.method.name,
               "n_samples": len(rows), "n_failed": len(failures), "n_planned": len(plan),
               "complete": not failures and planned <= {r["id"] for r in rows},
               "failed": [{"id": f["id"], "error": f["error"]} for f in failures[:50]],
               "metrics": task.summarize(rows), "timings": mean_timings(rows),
               "semantics": method.semantics(), "protocol": task.describe(),
               "config": OmegaConf.to_container(cfg, resolve=True), "environment": env,
               "wall_s": time.time() - t0, "results_dir": str(out.path)}
    if elsewhere:
        summary["pending_elsewhere"] = len(elsewhere)
    summary["wandb"] = logger.finish(rows, failures, summary, previous)
    out.write_summary(summary)
    if report:
        print_table(summary)
    if elsewhere:
        print(f"note: {len(elsewhere)} sample(s) are being computed by another process on {out.path}; "
              f"its summary will include them", file=sys.stderr)
    if failures:
        print(f"warning: {len(failures)} of {len(plan)} samples failed (first: {failures[0]['id']}: "
              f"{failures[0]['error']}); errors in {out.failed_path}; rerun the same command to retry them",
              file=sys.stderr)
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
