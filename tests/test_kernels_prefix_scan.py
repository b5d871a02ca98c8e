"""The sequential prefix-sum kernel (kernels/prefix_scan.py) against its torch reference (the CPU's sequential
cumsum) and numpy's cumsum: the same bits along either axis, on views with offsets and strides (a prefix-sum
table's interior), through Triton's interpreter on the CPU and natively on a GPU."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from triton_env import DEV, needs_triton

from kernels import prefix_scan as PS

pytestmark = needs_triton


@pytest.fixture(autouse=True)
def triton_backend(monkeypatch):
    monkeypatch.setenv("HARNESS_KERNELS", "triton")


def _data(N, n, m, seed):
    g = torch.Generator().manual_seed(seed)
    # magnitudes over many orders: an add's rounding depends on the order, so another association shows
    return (torch.randn(N, n, m, generator=g, dtype=torch.float64) * 10.0 ** torch.randint(-6, 6, (N, n, m), generator=g))


@pytest.mark.parametrize("shape", [(1, 1, 1), (3, 7, 5), (2, 33, 130), (1, 129, 3)])
@pytest.mark.parametrize("axis", [1, 2])
def test_scan_equals_the_sequential_reference(shape, axis):
    x = _data(*shape, seed=sum(shape) + axis)
    want = PS.prefix_sum_reference(x.clone(), axis)
    assert torch.equal(want, torch.from_numpy(np.cumsum(x.numpy(), axis=axis)))
    got = PS.prefix_sum_(x.clone().to(DEV), axis).cpu()
    assert torch.equal(got, want)


def test_two_scans_on_a_view_equal_numpy():
    """A prefix-sum table's interior P[:, 1:, 1:] (offset and strides), rows then columns, as ltri_batch._prefix."""
    x = _data(4, 17, 17, seed=3)
    P = torch.zeros(4, 18, 18, dtype=torch.float64, device=DEV)
    P[:, 1:, 1:] = x.to(DEV)
    PS.prefix_sum_(P[:, 1:, 1:], 1)
    PS.prefix_sum_(P[:, 1:, 1:], 2)
    want = np.cumsum(np.cumsum(x.numpy(), axis=1), axis=2)
    assert torch.equal(P[:, 1:, 1:].cpu(), torch.from_numpy(want))
    assert not P[:, 0].any() and not P[:, :, 0].any()


def test_bad_arguments_raise():
    with pytest.raises(ValueError):
        PS.prefix_sum_(torch.zeros(2, 3), 1)
