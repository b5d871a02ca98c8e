"""`python -m analysis bench KEY|FILE`: run, on a GPU machine, the one command that writes each
benchmark file a latency item renders from (the command the catalogue declares, so the file records
exactly it), for the files that are missing or flawed (all of them with --force).

The file must record the commit the numbers were measured at: from git, or from HARNESS_COMMIT on a
copy of the tree without .git (the device machine); without either it refuses to run."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

from analysis import catalogue, provenance
from analysis.catalogue import BenchFile

ROOT = Path(__file__).resolve().parents[1]
ENGINE_CODE = ("bench/engine.py", "runners/engine.py", "runners/graphs.py", "runners/layer_ops.py",
               "runners/models.py", "methods/full.py", "methods/base.py", "methods/config.py", "methods/parts/stores.py",
               "methods/parts/rope.py", "kernels/_common.py", "kernels/attention.py", "kernels/prefill.py", "kernels/fused.py")
TACTIC_CODE = ENGINE_CODE + ("bench/tactic.py", "methods/tactic.py", "methods/parts/tactic_rules.py",
                             "kernels/tactic_select.py", "kernels/tactic_fit.py", "methods/parts/cluster_keys.py", "kernels/kmeans.py", "methods/quest.py",
                             "methods/tidal.py")
MULTIGPU_CODE = ENGINE_CODE + ("bench/multigpu.py", "runners/pipeline.py", "runners/pipeline_graphs.py",
                               "runners/placement.py", "runners/plan.py", "methods/tidal.py", "methods/quest.py")
LTRI_SPAN_CODE = ("bench/ltri_span_work.py", "methods/ltri.py", "methods/parts/ltri_spans.py", "methods/parts/ltri_batch.py",
                  "methods/infllm.py", "methods/parts/ltri_device.py", "kernels/prefix_scan.py", "kernels/span_nms.py")
# Benchmark files that no catalogue item renders but the README or an issue's bar quotes (engine vs HF
# StaticCache; bounded-cache decode at 1M vs full at the cache size; Tactic's clustering cost and decode).
HARNESS_FILES = [
    BenchFile("bounded_llama31_8b_h100.json", "python -m bench.bounded --model llama31_8b --weights random --caches "
              "4096 32768 --context 1048576 --steps 32 --methods h2o tova streaming_llm",
              ENGINE_CODE + ("bench/bounded.py", "methods/h2o.py", "methods/tova.py", "methods/parts/eviction.py",
              "methods/parts/rope_rows.py", "methods/streaming_llm.py")),
    BenchFile("tactic_h100.json", "python -m bench.tactic --model llama31_8b --layers 4 --context 32768 --steps 32 "
              "--repeat 3 --budget 1024",
              TACTIC_CODE),
    # the paper's range is 32K-128K: at 32K full attention reads 128 MB per layer (~45 us), less than the
    # selection's fixed kernel cost; 128K is where a 1024-token budget has the most to save
    BenchFile("tactic_128k_h100.json", "python -m bench.tactic --model llama31_8b --layers 4 --context 131072 "
              "--steps 32 --repeat 3 --budget 1024",
              TACTIC_CODE),
    BenchFile("engine_llama3_h100.json", "python -m bench.engine --model llama3 --weights random --lengths 8192 "
              "32768 131072 --steps 32 --repeat 2", ENGINE_CODE),
    # issue 35: decode of a model split over the GPUs of one host beside the pipeline floor
    *[BenchFile(name, f"python -m bench.multigpu {args}", MULTIGPU_CODE) for name, args in (
        ("multigpu_llama3_70b_h100x4.json", ("--model llama3_70b --contexts 32768 102400 --methods full tidal quest "
                                            "--budget 512 --devices 4")),
        ("multigpu_llama3_1m_h100x2.json", "--model llama3 --contexts 524288 1048576 --methods full --devices 2"),
        ("multigpu_llama3_1m_h100x4.json", "--model llama3 --contexts 524288 1048576 --methods full --devices 4"),
        ("multigpu_llama3_256k_h100x1.json", ("--model llama3 --contexts 262144 --methods full tidal quest --budget 512 "
                                             "--devices 1")),
        ("multigpu_llama3_256k_h100x2.json", ("--model llama3 --contexts 262144 --methods full tidal quest --budget 512 "
                                             "--devices 2")))],
    BenchFile("engine_smollm2_cpu.json", "python -m bench.engine --lengths 4096 --steps 16 --repeat 1", ENGINE_CODE,
              gpu=False),
    # issue 33/34: Ltri-LLM's span work (host, fp64) batched vs the per-map reference, in one process
    *[BenchFile(name, f"python -m bench.ltri_span_work {args}", LTRI_SPAN_CODE, gpu=False) for name, args in (
        ("ltri_span_work_cpu.json", "--prompt 8192"),
        ("ltri_span_work_prefill_cpu.json", "--skip maps --prompt 8192 --repeat 2"))],
]


def all_files() -> dict:
    """Every declared benchmark file by name: the latency items' and HARNESS_FILES."""
    files = {f.name: f for it in catalogue.items().values() if it.impl and it.impl.bench for f in it.impl.bench.files}
    return {**files, **{f.name: f for f in HARNESS_FILES}}


def declared(key: str) -> list:
    """The BenchFiles of an item, or the one named (with or without its results/bench/ prefix)."""
    name = Path(key).name
    files = all_files()
    if name in files:
        return [files[name]]
    item = catalogue.get(key)
    if not (item.require().bench):
        raise ValueError(f"{item.key} is not a latency item: `python -m analysis make {item.key}` runs its sweep")
    return item.impl.bench.files


def _commit_known() -> bool:
    if os.environ.get("HARNESS_COMMIT"):
        return True
    r = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], check=False, capture_output=True,
                       text=True)
    return r.returncode == 0


def run_files(key: str, bench_dir: str, force: bool = False, dry_run: bool = False) -> int:
    todo = []
    for f in declared(key):
        src = provenance.load(f, bench_dir)
        if force or src.problems:
            todo.append((f, src))
        else:
            print(f"ok {src.path} (commit {src.commit}); --force to re-run")
    if not todo:
        return 0
    if not dry_run:
        import torch

        if any(f.gpu for f, _ in todo) and not torch.cuda.is_available():
            raise ValueError("bench: these benchmarks need a CUDA GPU and this machine has none; "
                             "--dry-run prints the commands")
        if not _commit_known():
            raise ValueError("bench: cannot tell the commit of this tree (no git here); set HARNESS_COMMIT "
                             "to the commit it is a copy of, so the files record it")
    failed = 0
    for f, src in todo:
        words = shlex.split(f.command) + ["--out", str(Path(bench_dir) / f.name)]
        if words[0] in ("python", "python3"):
            words[0] = sys.executable
        print(f"$ {f.command} --out {Path(bench_dir) / f.name}   # {src.short()}", flush=True)
        if dry_run:
            continue
        Path(bench_dir).mkdir(parents=True, exist_ok=True)
        rc = subprocess.run(words, cwd=ROOT, check=False).returncode
        if rc:
            failed += 1
            print(f"  -> exit code {rc}", file=sys.stderr, flush=True)
    return 1 if failed else 0
