"""Tactic diagnostics (`method.diagnostics=true`): per decode step and layer, what the selection
obtained against the exact attention, for the paper's motivation and estimation figures.

Per query head, from the exact probabilities of the full cache (one extra dense pass per layer):
  mass_obtained   attention probability of the tokens the head attended (Fig. 7: vs the target P)
  mass_abs_error  |mass_obtained - P|, per head and step (then averaged)
  budget_tactic   tokens the head attended (its row's set: list tokens K + the exact set E)
  budget_cluster  the "clustering optimal" (Fig. 8): E + the fewest list tokens, in the row's cluster
                  order, whose exact probability reaches P together with E
  budget_global   the "global optimal" (Figs. 5, 8): the fewest tokens, by descending probability,
                  whose probability reaches P (no forced set)
  z_ratio         Tactic's estimated softmax denominator / the exact one (fit mode only)
  cdf@k           cumulative probability of the k most attended tokens, k = 1, 2, 4, ... (Fig. 1);
                  over all layers and heads, or `probe_layer` / `probe_head` when set
The sums run on the host (one sync per layer): diagnostics run eagerly, never in a CUDA graph.
`metrics()` gives per-sample means over every recorded step, layer and head, the first step's
values (`*_first`: Fig. 5 reads the first decoding step) and the CDF per step for steps 1, 2, 4, ..
(`cdf_t<step>@k`).
"""
from __future__ import annotations

from collections import defaultdict

import torch

from methods.parts.tactic_rules import per_row, top_p_sorted

KEYS = ("mass_obtained", "mass_abs_error", "budget_tactic", "budget_cluster", "budget_global", "z_ratio")


def reach(base: torch.Tensor, cum: torch.Tensor, target: float, n: int) -> torch.Tensor:
    """Fewest leading items of `cum` (cumulative probabilities [..., n]) that, added to `base`
    [...], reach `target`: 0 when base already does, n when nothing does."""
    need = ((base.unsqueeze(-1) + cum) < target).sum(-1) + 1
    return torch.where(base >= target, torch.zeros_like(need), need.clamp(max=n))


class Probe:
    def __init__(self, target: float, probe_layer: int | None, probe_head: int | None):
        self.target, self.layer, self.head = target, probe_layer, probe_head
        self.reset()

    def reset(self) -> None:
        self.sums: dict[str, float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)
        self.first: dict[str, list[float]] = defaultdict(list)
        self.cdf_sum: dict[int, dict[int, float]] = defaultdict(lambda: defaultdict(float))
        self.cdf_n: dict[int, int] = defaultdict(int)
        self.step = 0

    def new_step(self) -> None:
        self.step += 1

    def record(self, layer: int, probs: torch.Tensor, lengths: torch.Tensor, attended: torch.Tensor,
               mass: torch.Tensor, list_probs: torch.Tensor | None, e_mass: torch.Tensor | None,
               n_e: torch.Tensor | None, z_ratio: torch.Tensor | None) -> None:
        """One layer of one step. probs [B, Hq, S] exact; attended [B, Hq] tokens each head attended;
        mass [B, Hq] their probability; list_probs [B, Hq, n] exact probabilities along the head's
        sorted list and e_mass/n_e the exact set's mass [B, Hq] and size [B] (None without clusters);
        z_ratio [B, Hq] or None."""
        P = self.target
        srt = probs.sort(-1, descending=True).values
        cum = srt.cumsum(-1)
        L = int(lengths.max())
        vals = {"mass_obtained": mass, "mass_abs_error": (mass - P).abs(), "budget_tactic": attended.float(),
                "budget_global": torch.minimum(reach(torch.zeros_like(mass), cum, P, srt.shape[-1]),
                                               lengths.view(-1, 1).long()).float()}
        if list_probs is not None:
            k = reach(e_mass, list_probs.cumsum(-1), P, list_probs.shape[-1])
            vals["budget_cluster"] = (k + n_e.view(-1, 1)).float()
        if z_ratio is not None:
            vals["z_ratio"] = z_ratio
        for key, v in vals.items():
            m = float(v.float().mean())
            self.sums[key] += m
            self.counts[key] += 1
            if self.step == 1:
                self.first[key].append(m)
        if self.layer is None or self.layer == layer:
            sel = cum if self.head is None else cum[:, self.head:self.head + 1]
            grid = [1 << i for i in range(L.bit_length()) if (1 << i) <= L]
            self.cdf_n[self.step] += 1
            for k in grid:
                self.cdf_sum[self.step][k] += float(sel[..., k - 1].mean())

    def metrics(self) -> dict[str, float]:
        out = {}
        for key in KEYS:
            if self.counts[key]:
                out[key] = self.sums[key] / self.counts[key]
            if self.first[key]:
                out[f"{key}_first"] = sum(self.first[key]) / len(self.first[key])
        if "mass_obtained" in out:
            out["mass_target"] = self.target
            out["mass_error"] = out["mass_obtained"] - self.target          # signed, mean over heads/steps
            out["mass_rel_error"] = out["mass_abs_error"] / self.target if self.target else 0.0
        steps = sorted(self.cdf_n)
        total: dict[int, float] = defaultdict(float)
        seen: dict[int, int] = defaultdict(int)
        for s in steps:
            for k, v in self.cdf_sum[s].items():
                total[k] += v / self.cdf_n[s]
                seen[k] += 1
                if s & (s - 1) == 0:        # steps 1, 2, 4, ...
                    out[f"cdf_t{s}@{k}"] = v / self.cdf_n[s]
        for k, v in total.items():
            out[f"cdf@{k}"] = v / seen[k]
        out["probe_steps"] = len(steps)
        return out


def diagnose(m, layer, q1, r, index, counts, est) -> None:
    """Tactic's per-layer diagnostics (m: the method): exact probabilities of the whole cache, the
    mass the attended sets obtained, the clustering-optimal reach and the estimated/true normaliser
    ratio, recorded in m.probe."""
    probs, lse = m._exact(layer, q1)
    _, Hq, S = probs.shape
    g = Hq // m.rows
    idx, cnt = index.long().repeat_interleave(g, 1), counts.long().repeat_interleave(g, 1)
    live = torch.arange(idx.shape[-1], device=idx.device) < cnt.unsqueeze(-1)
    mass = (probs.gather(-1, idx.clamp(max=S - 1)) * live).sum(-1)
    lp = e_mass = None
    if r is not None:
        _, lp, e_mass = m._cluster_k(layer, r, probs)
    z_ratio = None
    if est is not None:
        total, shift = est
        z_ratio = torch.exp(torch.log(total) + shift - lse)
    m.probe.record(layer, probs, m.lengths, cnt, mass, lp, e_mass, m.n_e if r is not None else None, z_ratio)


def report(m, out: dict) -> dict:
    """Tactic's stats (m: the method; out: the base stats): attended tokens per head, the per-sample
    scalars (`sample_metrics`: mean attended, clustering time and events, the probe's metrics) and
    every clustering event."""
    out["attended_per_head"] = {layer: [round(float(x), 2) for x in n.float().mean(0)]
                                for layer, n in sorted(m._heads.items())}
    t = m.tally.tolist()
    sample = {"attended": t[0] / t[1] if t[1] else 0.0,
              "cluster_s": sum(e["seconds"] for e in m.events), "cluster_events": len(m.events)}
    if m.probe is not None:
        sample.update(m.probe.metrics())
    out["sample_metrics"] = sample
    out["clustering"] = m.events
    return out


def global_optimal(m, layer, q1):
    """Tactic's oracle_global mode (m: the method): per row, the fewest tokens by descending true weight
    reaching the target."""
    c = m.cfg
    probs, _ = m._exact(layer, q1)
    B, Hq, S = probs.shape
    rank_by = probs if m.rows == Hq else probs.view(B, m.rows, Hq // m.rows, S).sum(2)
    live = torch.arange(S, device=probs.device).view(1, 1, S) < m.lengths.view(B, 1, 1)
    order = torch.where(live, rank_by, -1.0).sort(dim=-1, descending=True, stable=True).indices  # unwritten last
    if c.target >= 1.0:
        k_row = m.lengths.view(B, 1).expand(B, m.rows).long()
    else:
        along = probs.gather(-1, order.repeat_interleave(Hq // m.rows, 1))
        k_row = per_row(top_p_sorted(along, c.target), m.rows)
    counts = torch.minimum(k_row, m.lengths.view(B, 1).long()).int()
    index = order.int()
    m.selected[layer] = (index, counts)
    if m.probe is not None:
        diagnose(m, layer, q1, None, index, counts, None)
    return index, counts
