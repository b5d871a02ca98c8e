"""A run: validate, build the task's samples, load, then walk the samples (runners/loop.py), one
row per sample, and summarize.

Order matters for a user's first minute: everything that can be wrong with the input (config, task
data, prompt lengths, the model's source) is found before the model loads and before a run
directory exists, and reported as one `error:` line with exit code 2.
"""
from __future__ import annotations

import sys
import time

import torch
from omegaconf import DictConfig

import methods
import tasks
from common.errors import HarnessError
from runners import hub, models
from runners import plan as memory_plan
from runners.loop import RunLoop, Setup
from runners.placement import load_placed
from runners.results import RunDir, environment
from runners.validate import check_loaded, max_position, preflight


def run(cfg: DictConfig, report: bool = True) -> dict | None:
    """Entry point called by run.py. Bad input ends with one line on stderr and exit code 2."""
    try:
        return _run(cfg, report)
    except HarnessError as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        sys.exit(e.exit_code)


def one_line(e: Exception) -> str:
    return hub.plain(" ".join(line.strip() for line in str(e).splitlines() if line.strip()) or type(e).__name__)


def _run(cfg: DictConfig, report: bool) -> dict:
    t0 = time.time()
    # the code this process runs is the tree at its start: a commit made while a long run goes on
    # must not be recorded as the one that produced it
    env = environment()
    hub.offline_if_unreachable()   # before anything asks the hub: fail in one line, not after a minute of retries
    spec = preflight(cfg)          # every input check, all problems in one line (runners/validate.py)
    device = models.resolve_device(cfg.runner.device)
    dtype = models.resolve_dtype(cfg.runner.dtype, device)
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
    model, tokenizer = load_placed(cfg.model, device, dtype, tokenizer=tokenizer, placement=placement)
    if cfg.model.get("max_position") is not None:
        # the engine and methods read the limit from the HF config; RoPE itself takes any position
        model.config.max_position_embeddings = max_position(cfg.model)
    info = methods.ModelInfo.from_hf_config(model.config)
    check_loaded(cfg, info)
    from runners.engine import Engine
    from runners.pipeline import split_engine

    engine = split_engine(Engine(model, methods.build(cfg.method, info)), placement)
    setup = Setup(cfg=cfg, task=task, engine=engine, tokenizer=tokenizer, stop_ids=_stop_ids(tokenizer, cfg.model),
                  info=info, plan=plan, dtype=dtype, device=device, env=env, t0=t0)
    out = RunDir(cfg)
    out.open()
    try:
        return RunLoop(setup, out).run(report)
    finally:
        out.close()


def _stop_ids(tokenizer, model_cfg) -> list[int]:
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    vocab = tokenizer.get_vocab()
    for tok in model_cfg.get("stop_tokens") or []:
        if tok in vocab:
            ids.add(int(vocab[tok]))
    return sorted(ids)
