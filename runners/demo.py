"""`make run`: the harness in one look, on a CPU in a few minutes.

Full attention beside a sparse method (TidalDecode at a 256-token budget) on passkey retrieval with
the embedded SmolLM2-135M-Instruct, through the same run loop as `run.py` (rows land under
results/runs/ and are reused by a second `make run`). Prints both methods side by side, per sample,
and says where each miss comes from: a miss full attention makes too is the model's, and for those
the demo asks Hugging Face's own `generate` for its answer, so the reader sees the engine is not the
cause.

    make run                                          # the defaults below (.venv/bin/python -m runners.demo)
    .venv/bin/python -m runners.demo method.budget=128   # extra overrides apply to the sparse run
"""
from __future__ import annotations

import sys
from pathlib import Path

from runners import cli
from runners.run import run

TASK = ["task=passkey", "task.lengths=[1024,2048]", "task.depths=[0.5,1.0]"]   # 4 samples per method: minutes on a CPU
FULL = ["method=full"]
SPARSE = ["method=tidal", "method.budget=256"]


def _compose(overrides):
    return cli._compose(overrides)


def main(argv: list[str]) -> None:
    extra = list(argv)
    cli.prevalidate(TASK + SPARSE + extra)     # bad extra input: one line, exit 2, before any load
    full_cfg = _compose(TASK + FULL + [o for o in extra if not o.startswith("method")])
    sparse_cfg = _compose(TASK + SPARSE + extra)
    print(f"[1/2] {full_cfg.method.name}: full attention, every key of the KV cache", file=sys.stderr)
    full = run(full_cfg, report=False)
    budget = sparse_cfg.method.get("budget")
    print(f"[2/2] {sparse_cfg.method.name}: sparse attention, {budget} keys per step in its sparse layers",
          file=sys.stderr)
    sparse = run(sparse_cfg, report=False)
    from runners.results import RunDir

    show(full_cfg, RunDir(full_cfg).rows(), sparse_cfg, RunDir(sparse_cfg).rows(), full, sparse)


def _mark(row, metric) -> str:
    if row is None:
        return "(failed)"
    ok = row["metrics"].get(metric, 0) >= 1
    return ("ok   " if ok else "MISS ") + repr(row["prediction"].strip()[:28])


def show(full_cfg, full_rows, sparse_cfg, sparse_rows, full_summary, sparse_summary, metric="accuracy") -> None:
    f_by, s_by = {r["id"]: r for r in full_rows}, {r["id"]: r for r in sparse_rows}
    ids = [i for i in f_by if i in s_by] + [i for i in s_by if i not in f_by]
    name = f"{sparse_cfg.method.name} k={sparse_cfg.method.get('budget')}"
    print(f"\npasskey retrieval on {full_cfg.model.name} ({full_cfg.model.get('hub_id')}), "
          f"{full_rows[0]['device'] if full_rows else ''}: the key's 5 digits must come back")
    print(f"  {'length':>6} {'depth':>5}  {'key':>6}  {'full':<36} {name}")
    both, sparse_only, full_only = [], [], []
    for i in ids:
        f, s = f_by.get(i), s_by.get(i)
        r = f or s
        p = r["params"]
        print(f"  {p.get('length'):>6} {p.get('depth'):>5}  {r['references'][0]:>6}  {_mark(f, metric):<36} "
              f"{_mark(s, metric)}")
        f_ok = f is not None and f["metrics"].get(metric, 0) >= 1
        s_ok = s is not None and s["metrics"].get(metric, 0) >= 1
        if not f_ok:
            (both if not s_ok else full_only).append(f or s)
        elif not s_ok:
            sparse_only.append(s or f)
    fa, sa = full_summary["metrics"].get(metric), sparse_summary["metrics"].get(metric)
    print(f"  {'accuracy':>14}          {fa:<36.2f} {sa:.2f}")
    print()
    if both or full_only:
        print(f"{len(both) + len(full_only)} miss(es) of full attention: the 135M model's own (it is tiny), not the "
              f"harness's" + (f"; {name} misses {len(both)} of them too" if both else "") + ".")
        _hf_check(full_cfg, (both + full_only)[:2])
    if full_only:
        print(f"{name} gets {len(full_only)} of them right: with a model this small, attending a different set "
              f"of keys can tip a borderline answer either way.")
    if sparse_only:
        print(f"{len(sparse_only)} miss(es) of {name} alone: the cost of attending {sparse_cfg.method.get('budget')} "
              f"keys per step instead of all of them (try method.budget=512: `{_python()} -m "
              f"runners.demo method.budget=512`).")
    if not (both or full_only or sparse_only):
        print(f"No misses: {name} matches full attention here.")
    print(f"Rows: {full_summary['results_dir']} and {sparse_summary['results_dir']}. "
          f"Next: README 'Running' (run.py, sweeps, paper tables).")


def _python() -> str:
    """How to call this interpreter from the repository root: the venv's path when it is one (a bare
    `python` on a fresh machine is the system's, without torch)."""
    exe = Path(sys.executable)
    if sys.prefix == sys.base_prefix:
        return "python"       # not a venv: the user's own interpreter, which has torch
    try:
        return str(exe.relative_to(Path.cwd()))    # .venv/bin/python
    except ValueError:
        return str(exe)


def _hf_check(cfg, rows) -> None:
    """Hugging Face's generate on the same prompts: the reference the engine is tested against."""
    import torch

    import tasks
    from runners import models
    from runners.validate import model_spec

    print("  Hugging Face's own generate on the same prompt answers:")
    model, tok = models.load(cfg.model, torch.device("cpu"), torch.float32)
    task = tasks.build(cfg.task, tok, model_spec(cfg.model))
    wanted = {r["id"]: r for r in rows}
    for s in task.limited():
        if s.id not in wanted:
            continue
        with torch.inference_mode():
            out = model.generate(torch.tensor([s.input_ids]), max_new_tokens=s.max_new_tokens, do_sample=False,
                                 pad_token_id=tok.eos_token_id)
        text = tok.decode(out[0, len(s.input_ids):], skip_special_tokens=True)
        same = "the same" if text == wanted[s.id]["prediction"] else "differently"
        print(f"    {s.id}: {text.strip()[:40]!r} ({same} as the harness's full attention)")


if __name__ == "__main__":
    main(sys.argv[1:])
