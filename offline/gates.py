"""Per-KV-head gates for head identification (LycheeDecode sec. 3.2 and its baselines, Table 3).

  HardKumaGate      LycheeDecode (src/train/kuma/kuma.py, train_kuma.py): a, b per layer x KV head,
                    init 1 (uniform), clamped to [1e-6, 100] before use; z = hardtanh(l + (r - l) s),
                    s = (1 - (1 - u)^(1/b))^(1/a), u ~ U(eps, 1 - eps) with eps = 1e-3, stretch
                    (l, r) = (-0.1, 1.1); density = mean P(z != 0) = mean(1 - F((0 - l) / (r - l))) with
                    the reference's log-CDF clamp to [EPS, 1 - EPS], EPS = 1e-6.
  HardConcreteGate  Louizos et al. (2018), as PruLong (Bhaskar et al. 2025) uses it: log_alpha per
                    head, temperature beta = 2/3, the same stretch; P(z != 0) = sigmoid(log_alpha -
                    beta log(-l / r)).
  DirectGate        DuoAttention's direct optimisation (duo_attn/train.py): a gate value per head in
                    [0, 1] (init 1, clamped after each step) used as z itself, L1-regularised.

`retrieval_prob()` is the per-head value the final set is cut from and what the training curves
(lychee.fig7) plot: HardKuma per `final` (kuma_mean: the un-stretched Kumaraswamy mean, the code's
`sampler.mean()`; p_one: P(z = 1); hard_mean: E[z] of the HardKuma, the paper's text).
"""
from __future__ import annotations

import math

import torch

EPS = 1e-6          # kuma.py EPS (log-CDF clamp)
U_EPS = 1e-3        # kuma.py Kuma.sample eps


def kuma_cdf(x: torch.Tensor | float, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return 1.0 - (1.0 - x ** a) ** b


def kuma_mean(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """E[X], X ~ Kuma(a, b): b * B(1 + 1/a, b) (kuma_moments(a, b, 1))."""
    arg = 1.0 + 1.0 / a
    return b * torch.exp(torch.lgamma(arg) + torch.lgamma(b) - torch.lgamma(arg + b))


def kuma_pdf(x: torch.Tensor, a: float, b: float) -> torch.Tensor:
    return a * b * x ** (a - 1) * (1 - x ** a) ** (b - 1)


class HardKumaGate(torch.nn.Module):
    def __init__(self, layers: int, heads: int, a0: float = 1.0, b0: float = 1.0,
                 stretch: tuple[float, float] = (-0.1, 1.1), final: str = "kuma_mean"):
        super().__init__()
        self.a = torch.nn.Parameter(torch.full((layers, heads), float(a0)))
        self.b = torch.nn.Parameter(torch.full((layers, heads), float(b0)))
        self.lo, self.hi = stretch
        self.final = final

    def _ab(self):
        return self.a.clamp(1e-6, 100.0), self.b.clamp(1e-6, 100.0)   # train_kuma.py: NaN guard

    def sample(self, generator: torch.Generator | None = None) -> torch.Tensor:
        a, b = self._ab()
        u = torch.rand(a.shape, generator=generator, device=a.device) * (1 - 2 * U_EPS) + U_EPS
        s = (1.0 - (1.0 - u) ** b.reciprocal()) ** a.reciprocal()
        return torch.nn.functional.hardtanh(s * (self.hi - self.lo) + self.lo, 0.0, 1.0)

    def p_zero(self) -> torch.Tensor:
        """P(z = 0) as the reference computes it (HardBinary.pdf(0) = exp(clamped log CDF))."""
        a, b = self._ab()
        x0 = (0.0 - self.lo) / (self.hi - self.lo)
        log_cdf = torch.log(kuma_cdf(x0, a, b) + EPS).clamp(math.log(EPS), math.log(1 - EPS))
        return log_cdf.exp()

    def p_one(self) -> torch.Tensor:
        a, b = self._ab()
        return 1.0 - kuma_cdf((1.0 - self.lo) / (self.hi - self.lo), a, b)

    def density(self) -> torch.Tensor:
        return (1.0 - self.p_zero()).mean()

    def expected_l0(self) -> torch.Tensor:
        return (1.0 - self.p_zero()).sum()

    @torch.no_grad()
    def hard_mean(self, n: int = 2048) -> torch.Tensor:
        """E[z] of the HardKuma: P(z=1) + E[T; 0 < T < 1], T the stretched variable (midpoint rule)."""
        a, b = self._ab()
        lo, hi = self.lo, self.hi
        x0, x1 = -lo / (hi - lo), (1 - lo) / (hi - lo)
        grid = x0 + (torch.arange(n, device=a.device) + 0.5) / n * (x1 - x0)
        t = grid * (hi - lo) + lo
        dens = a[..., None] * b[..., None] * grid ** (a[..., None] - 1) * (1 - grid ** a[..., None]) ** (b[..., None] - 1)
        return self.p_one() + (t * dens).sum(-1) * (x1 - x0) / n

    @torch.no_grad()
    def retrieval_prob(self) -> torch.Tensor:
        a, b = self._ab()
        if self.final == "kuma_mean":
            return kuma_mean(a, b)
        if self.final == "p_one":
            return self.p_one()
        return self.hard_mean()

    def state(self) -> dict:
        a, b = self._ab()
        return {"a": a.detach().cpu().tolist(), "b": b.detach().cpu().tolist()}


class HardConcreteGate(torch.nn.Module):
    def __init__(self, layers: int, heads: int, log_alpha0: float = 0.0, beta: float = 2 / 3,
                 stretch: tuple[float, float] = (-0.1, 1.1)):
        super().__init__()
        self.log_alpha = torch.nn.Parameter(torch.full((layers, heads), float(log_alpha0)))
        self.beta = beta
        self.lo, self.hi = stretch
        self.final = "deterministic"

    def sample(self, generator: torch.Generator | None = None) -> torch.Tensor:
        u = torch.rand(self.log_alpha.shape, generator=generator, device=self.log_alpha.device).clamp(U_EPS, 1 - U_EPS)
        s = torch.sigmoid((torch.log(u) - torch.log(1 - u) + self.log_alpha) / self.beta)
        return torch.nn.functional.hardtanh(s * (self.hi - self.lo) + self.lo, 0.0, 1.0)

    def p_nonzero(self) -> torch.Tensor:
        return torch.sigmoid(self.log_alpha - self.beta * math.log(-self.lo / self.hi))

    def density(self) -> torch.Tensor:
        return self.p_nonzero().mean()

    def expected_l0(self) -> torch.Tensor:
        return self.p_nonzero().sum()

    @torch.no_grad()
    def retrieval_prob(self) -> torch.Tensor:
        """The test-time gate of Louizos et al.: hardtanh(sigmoid(log_alpha) (r - l) + l)."""
        return torch.nn.functional.hardtanh(torch.sigmoid(self.log_alpha) * (self.hi - self.lo) + self.lo, 0.0, 1.0)

    def state(self) -> dict:
        return {"log_alpha": self.log_alpha.detach().cpu().tolist()}


class DirectGate(torch.nn.Module):
    def __init__(self, layers: int, heads: int, init: float = 1.0):
        super().__init__()
        self.alpha = torch.nn.Parameter(torch.full((layers, heads), float(init)))
        self.final = "top_n"

    def sample(self, generator: torch.Generator | None = None) -> torch.Tensor:
        return self.alpha

    @torch.no_grad()
    def clamp_(self) -> None:
        self.alpha.clamp_(0.0, 1.0)   # duo_attn/train.py: map_full_attention_heads(clamp_(x, 0, 1))

    def density(self) -> torch.Tensor:
        return self.alpha.mean()

    def l1(self) -> torch.Tensor:
        return self.alpha.abs().mean()

    @torch.no_grad()
    def retrieval_prob(self) -> torch.Tensor:
        return self.alpha.detach().clone()

    def state(self) -> dict:
        return {"alpha": self.alpha.detach().cpu().tolist()}


def lr_lambda(num_steps: int):
    """train_kuma.py / duo_attn/train.py schedule: linear warm-up over steps/5, linear decay over the
    last steps/5, never below 0.1 of the base rate."""
    span = max(1, num_steps // 5)
    return lambda step: min(1.0, max((step + 1) / span, 0.1), max((num_steps - step) / span, 0.1))


class Lagrangian:
    """train_kuma.py's sparsity control: c = relu(density - target) through a moving average (the
    value of c is the average, its gradient that of the current c), lambda <- clamp(lambda *
    exp(lr_lambda * c), 1e-12, 20); the penalty is lambda * c (lambda not differentiated).
    Note: with the relu, lambda never decreases (the paper's text says it does below the target)."""

    def __init__(self, target: float, lam0: float = 2.0, lr: float = 0.001, alpha: float = 0.9,
                 lam_min: float = 1e-12, lam_max: float = 20.0):
        self.target, self.lam, self.lr, self.alpha = target, torch.tensor(lam0), lr, alpha
        self.lam_min, self.lam_max = lam_min, lam_max
        self.c_ma = torch.tensor(0.0)

    def penalty(self, density: torch.Tensor) -> torch.Tensor:
        c_hat = torch.relu(density - self.target)
        self.c_ma = self.alpha * self.c_ma + (1 - self.alpha) * c_hat.detach().cpu()
        c = c_hat + (self.c_ma.to(c_hat.device) - c_hat.detach())
        self.lam = (self.lam * torch.exp(self.lr * c.detach().cpu())).clamp(self.lam_min, self.lam_max)
        return self.lam.to(c.device) * c
