"""The span NMS kernel (kernels/span_nms.py) against its torch reference (ltri_batch.nms's operations in torch) and
the per-map reference (ltri_spans.nms_1d): the same kept spans in the same order, with tied scores, -inf scores, a
step count past the live candidates (not ok:
index 0, as numpy's argmax of a dead row) and IoU thresholds at 0 and 1; in Triton's interpreter on the CPU."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from triton_env import DEV, needs_triton

from kernels import span_nms as SN
from methods.parts import ltri_spans as LS

pytestmark = needs_triton


@pytest.fixture(autouse=True)
def triton_backend(monkeypatch):
    monkeypatch.setenv("HARNESS_KERNELS", "triton")


def _cands(N, n, seed, ties):
    g = torch.Generator().manual_seed(seed)
    s = torch.arange(2 * n - 1).view(1, -1).expand(N, -1)
    lo = (s - n + 1).clamp(min=0)
    hi = s // 2
    x = lo + (torch.rand(N, 2 * n - 1, generator=g) * (hi - lo + 1)).long()
    sc = torch.randn(N, 2 * n - 1, generator=g, dtype=torch.float64)
    if ties:
        sc = sc.round()
        sc[:, ::7] = float("-inf")
    return x, s - x, sc


@pytest.mark.parametrize("n,steps,iou,ties", [(1, 1, 0.1, False), (7, 3, 0.1, True), (23, 6, 0.0, True),
                                              (40, 10, 0.5, False), (128, 4, 0.1, True), (64, 127, 1.0, True)])
def test_kernel_equals_the_references(n, steps, iou, ties):
    x, y, sc = _cands(5, n, n + steps, ties)
    want = SN.nms_reference(x, y, sc, iou, steps)
    got = SN.nms(x.to(DEV), y.to(DEV), sc.to(DEV), iou, steps)
    for w, v in zip(want, got):
        assert torch.equal(v.cpu(), w)
    for i in range(5 if not ties else 0):   # finite scores (the span rule's): nms_1d's spans, in its order
        keep = LS.nms_1d(x[i].numpy(), y[i].numpy(), sc[i].numpy(), iou, steps)
        ok = want[2][i].numpy()
        assert [(int(x[i, k]), int(y[i, k])) for k in keep] == list(zip(want[0][i].numpy()[ok], want[1][i].numpy()[ok]))
        assert ok.sum() == len(keep) and np.all(ok[:len(keep)])
