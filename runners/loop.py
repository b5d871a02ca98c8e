"""Walking a run's samples: resume, one row per sample, progress, W&B, the summary.

`RunLoop(setup, out).run()` is the whole walk; each of its parts is a method named for what it does
(`resume`, `walk`, `summarize`, `announce`), and everything the run set up before it (task, engine,
tokenizer ...) comes in one `Setup` (runners/run.py builds it).
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any

from omegaconf import OmegaConf
from tqdm import tqdm

from runners import coverage
from runners.batch import batches, mean_timings, run_batch_safely
from runners.report import print_table
from runners.results import RunDir
from runners.wandb_log import WandbLogger

MAX_WARNINGS = 5          # failed samples announced one by one; the rest are counted in the summary
PREFILL_BAR_TOKENS = 32768   # prompts at least this long show a prefill bar in tokens


@dataclass
class Setup:
    """What the run built before its loop: validated config, task, loaded engine and what rows record."""
    cfg: Any
    task: Any
    engine: Any
    tokenizer: Any
    stop_ids: list[int]
    info: Any
    plan: list[str]             # the sample ids this run covers, in order
    dtype: Any
    device: Any
    env: dict
    t0: float = field(default_factory=time.time)

    @property
    def method(self):
        return self.engine.method


class RunLoop:
    def __init__(self, s: Setup, out: RunDir):
        self.s, self.out, self.cfg = s, out, s.cfg
        self.planned = set(s.plan)
        self.failed_now = 0

    def run(self, report: bool = True) -> dict:
        kept = self.resume()
        previous = self.out.previous_summary()
        before = self.out.rows() + self.out.failures()   # what an offline W&B rerun logs again (wandb_log.py)
        logger = WandbLogger(self.cfg, self.out.hash, base_step=self.wandb_base(previous), history=lambda: before)
        self.walk(logger, kept)
        summary = self.summarize()
        summary["wandb"] = logger.finish(self.out.rows(), self.out.failures(), summary, previous)
        self.out.write_summary(summary)
        self.announce(summary, report)
        return summary

    def resume(self) -> int:
        """Say what an earlier process left (kept rows, failures to retry); the number kept."""
        done = self.out.done_ids()
        plan = self.s.plan
        kept = sum(1 for i in plan if i in done)
        retry = [f["id"] for f in self.out.failures() if f["id"] in self.planned]
        if kept or retry:
            print(f"resuming {self.out.path}: {kept} of {len(plan)} samples kept, {len(plan) - kept} to run"
                  + (f" ({len(retry)} failed before: retrying them)" if retry else ""), file=sys.stderr)
        return kept

    def wandb_base(self, previous: dict | None) -> int:
        """W&B steps must grow across reruns: start above every step a previous process can have logged
        (each logged row is a line on disk, and only a finished run compacts, recording its steps)."""
        return int(((previous or {}).get("wandb") or {}).get("steps") or 0) + self.out.line_count()

    def common(self) -> dict:
        """The fields every row of this run carries."""
        s, cfg = self.s, self.cfg
        return {"task": cfg.task.name, "model": cfg.model.name, "method": cfg.method.name, "run_id": self.out.hash,
                "weights": cfg.model.get("weights", "pretrained"), "dtype": str(s.dtype), "device": str(s.device),
                "semantics": s.method.semantics(), "protocol": s.task.describe(), "writer": self.out.store.writer}

    def walk(self, logger: WandbLogger, kept: int) -> None:
        """Every sample not yet done (nor claimed by another writer): a row each, as it lands."""
        s, cfg = self.s, self.cfg
        common = self.common()
        todo = (x for x in s.task.limited() if self.out.claim(x.id))
        bar = tqdm(total=len(s.plan), initial=kept, desc=f"{cfg.method.name}/{cfg.task.name}",
                   disable=not cfg.runner.progress, mininterval=1.0, file=sys.stderr)
        prefill = PrefillBar(enabled=bool(cfg.runner.progress))
        detach = prefill.attach(s.engine)
        try:
            for batch in batches(todo, int(cfg.runner.batch_size)):
                prefill.start(len(batch[0].input_ids))
                for row in run_batch_safely(s.engine, s.task, batch, s.tokenizer, s.stop_ids, s.info,
                                            cfg.runner.on_error):
                    self.land({**common, **row}, logger, bar)
        finally:
            detach()
            prefill.close()
            bar.close()

    def land(self, row: dict, logger: WandbLogger, bar) -> None:
        if row["status"] == "ok":
            if not self.out.append(row):
                return   # another writer finished it first: its row stands
        else:
            self.out.record_failure(row)
            self.failed_now += 1
            if self.failed_now <= MAX_WARNINGS:
                more = "; further failures are only counted" if self.failed_now == MAX_WARNINGS else ""
                bar.write(f"warning: sample {row['id']} failed ({row['error']}); recorded in "
                          f"{self.out.failed_path.name}, the run goes on{more}", file=sys.stderr)
        logger.row(row)
        bar.update(1)

    def summarize(self) -> dict:
        s, cfg, out = self.s, self.cfg, self.out
        rows, failures = out.rows(), out.failures()
        semantics = s.method.semantics()
        summary = {"run_id": out.hash, "task": cfg.task.name, "model": cfg.model.name, "method": cfg.method.name,
                   "n_samples": len(rows), "n_failed": len(failures), "n_planned": len(s.plan),
                   "complete": not failures and self.planned <= {r["id"] for r in rows},
                   "failed": [{"id": f["id"], "error": f["error"]} for f in failures[:50]],
                   "metrics": s.task.summarize(rows), "timings": mean_timings(rows),
                   "attended": coverage.summarize(rows, cfg.method.name, semantics),
                   "semantics": semantics, "protocol": s.task.describe(),
                   "config": OmegaConf.to_container(cfg, resolve=True), "environment": s.env,
                   "wall_s": time.time() - s.t0, "results_dir": str(out.path)}
        elsewhere = out.store.pending_elsewhere()
        if elsewhere:
            summary["pending_elsewhere"] = len(elsewhere)
        return summary

    def announce(self, summary: dict, report: bool) -> None:
        """The table, then what the user must know: other writers, failures, a run that measured nothing."""
        if report:
            print_table(summary)
        if summary.get("pending_elsewhere"):
            print(f"note: {summary['pending_elsewhere']} sample(s) are being computed by another process on "
                  f"{self.out.path}; its summary will include them", file=sys.stderr)
        if summary["n_failed"]:
            first = summary["failed"][0]
            print(f"warning: {summary['n_failed']} of {len(self.s.plan)} samples failed (first: {first['id']}: "
                  f"{first['error']}); errors in {self.out.failed_path}; rerun the same command to retry them",
                  file=sys.stderr)
        warning = (summary.get("attended") or {}).get("warning")
        if warning:
            print(f"warning: {warning}", file=sys.stderr)


class PrefillBar:
    """Prefill progress in tokens for prompts long enough that one sample's prefill takes minutes (a
    1M-token cascade run sat at 0/1): the engine's prefill feeds the prompt through `forward(ids,
    "prefill")` chunk by chunk (method.prefill_chunk), and `attach` counts the chunks' tokens there.
    It wraps the engine object's method rather than adding a hook to runners/engine.py: that file
    is code the latency benchmarks measure (a change to it marks their files stale), and counting
    needs nothing from inside it."""

    def __init__(self, enabled: bool = True, min_tokens: int = PREFILL_BAR_TOKENS):
        self.enabled, self.min_tokens, self.bar = enabled, min_tokens, None
        self.total, self.done = 0, 0

    def attach(self, engine):
        """Count prefill chunks through `engine.forward`; returns the function that undoes it."""
        forward = engine.forward

        def counted(ids, phase, *args, **kwargs):
            out = forward(ids, phase, *args, **kwargs)
            if phase == "prefill":
                self(min(self.done + int(ids.shape[1]), self.total), self.total)
            return out

        engine.forward = counted
        return lambda: vars(engine).pop("forward", None)

    def start(self, total: int) -> None:
        """A new batch: its prompt length is the bar's total."""
        self.close()
        self.total, self.done = int(total), 0

    def __call__(self, done: int, total: int) -> None:
        self.done = done
        if not self.enabled or total < self.min_tokens:
            return
        if self.bar is None:
            self.bar = tqdm(total=total, desc="prefill", unit="tok", unit_scale=True, leave=False, position=1,
                            mininterval=1.0, file=sys.stderr)
        self.bar.update(done - self.bar.n)
        if done >= total:
            self.close()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
