"""Per-head diagnosis of Tactic's fitted budget at the first decoding step (notes/tactic_ruler.md).

    python -m bench.tactic_heads OUT.json [run.py overrides ...]   (method=tactic method.diagnostics=true)

Runs run.py with two read-only taps: the fitted curve of Algorithm 1 (kernels.tactic_fit.fit_curve, which
only the torch reference of the fit calls: the tap sets HARNESS_KERNELS=torch, as on the CPU) and
the diagnostics probe (methods.parts.tactic_probe.Probe.record, which has the exact probabilities along each
head's cluster-sorted list). For every layer and query head of the first sample's first decoding step
it writes: the mass the head obtained, Tactic's estimated / exact softmax denominator (z_ratio), the
tokens attended, the cluster-optimal count, the exact set's mass, the curve (a, b, window means), the
exact mass of the list's first 128 tokens and of the rest, and the list rank and probability of the
head's heaviest token. Only batch 1 is read (the taps keep row 0).
"""
from __future__ import annotations

import json
import os
import runpy
import sys

import methods.parts.tactic_probe as probe
from kernels import tactic_fit

_fit, _record, _last, rows, seen = tactic_fit.fit_curve, probe.Probe.record, {}, [], set()


def fit_curve(u1, mu1, u2, mu2, rising="flat"):
    a, b = _fit(u1, mu1, u2, mu2, rising=rising)
    _last["curve"] = (a[0].float().cpu(), b[0].float().cpu(), mu1[0].float().cpu(), mu2[0].float().cpu())
    return a, b


def record(self, layer, probs, lengths, attended, mass, list_probs, e_mass, n_e, z_ratio):
    _record(self, layer, probs, lengths, attended, mass, list_probs, e_mass, n_e, z_ratio)
    curve = _last.pop("curve", None)   # this layer's fit (none where the list fits in the exact head)
    if self.step != 1 or list_probs is None or z_ratio is None or curve is None or layer in seen:
        return         # the first sample's first step only (the probe restarts its steps per sample)
    seen.add(layer)
    a, b, mu1, mu2 = curve
    lp = list_probs[0].float().cpu()
    for h in range(lp.shape[0]):
        e = float(e_mass[0, h])
        rows.append({"layer": layer, "head": h, "mass": float(mass[0, h]), "z_ratio": float(z_ratio[0, h]),
                     "attended": int(attended[0, h]),
                     "k_cluster": int(((e + lp[h].cumsum(-1)) < self.target).sum()) + 1 + int(n_e[0]),
                     "e_mass": e, "a": float(a[h]), "b": float(b[h]), "mu1": float(mu1[h]), "mu2": float(mu2[h]),
                     "head_mass": float(lp[h, :128].sum()), "tail_mass": float(lp[h, 128:].sum()),
                     "top_rank": int(lp[h].argmax()), "top_p": float(lp[h].max())})


def main(out: str, overrides: list[str]) -> None:
    os.environ["HARNESS_KERNELS"] = "torch"   # the fit kernel computes the curve inside: no tap there
    tactic_fit.fit_curve, probe.Probe.record = fit_curve, record
    sys.argv = ["run.py", *overrides]
    try:
        runpy.run_path("run.py", run_name="__main__")
    except SystemExit as e:
        if e.code:
            raise
    with open(out, "w") as f:
        json.dump(rows, f)
    print(f"{len(rows)} heads -> {out}")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python -m bench.tactic_heads OUT.json [run.py overrides ...]")
    main(sys.argv[1], sys.argv[2:])
