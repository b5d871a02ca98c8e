"""What every kernel test module needs before it touches Triton: the interpreter on a machine without
CUDA (conftest.py sets TRITON_INTERPRET=1 before anything imports triton), the device the tests run
on, and the skip mark for a machine where the Triton path cannot run."""
from __future__ import annotations

import pytest
import torch

import kernels
from kernels import _common

DEV = "cuda" if torch.cuda.is_available() else "cpu"
needs_triton = pytest.mark.skipif(
    not (kernels.HAVE_TRITON and (torch.cuda.is_available() or _common.interpreter_active())),
    reason="triton missing, or imported before TRITON_INTERPRET=1 could be set (see tests/conftest.py)")
