"""The decoder-layer loop with fused element-wise kernels and fused projections (CUDA only).

Same math as the HF modules, fewer kernels: q/k/v projections as one GEMM, gate/up as one GEMM
(the original weights become views of the fused ones, so no memory is duplicated), RMSNorm fused
with the residual add, SiLU-mul in one kernel. The CPU path keeps the HF modules untouched, which
is what the exact-parity tests check; the GPU parity tests check this path against HF in fp32.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels import fused


def _fuse(linears: list[torch.nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Concatenate the weights (and biases) of `linears` along the output dim and make each
    module's parameters views of the result."""
    weight = torch.cat([m.weight.data for m in linears], dim=0)
    has_bias = [m.bias is not None for m in linears]
    bias = torch.cat([m.bias.data for m in linears], dim=0) if all(has_bias) else None
    if any(has_bias) and not all(has_bias):
        raise ValueError("cannot fuse projections where only some have a bias")
    row = 0
    for m in linears:
        n = m.weight.shape[0]
        m.weight.data = weight[row:row + n]
        if bias is not None:
            m.bias.data = bias[row:row + n]
        row += n
    return weight, bias


class FusedLayers:
    def __init__(self, model):
        self.layers = model.model.layers
        self.qkv, self.gate_up = [], []
        for layer in self.layers:
            a, mlp = layer.self_attn, layer.mlp
            self.qkv.append(_fuse([a.q_proj, a.k_proj, a.v_proj]))
            if getattr(model.config, "hidden_act", "silu") != "silu" or getattr(mlp, "gate_proj", None) is None:
                raise ValueError("fused layers need a SiLU gated MLP")
            self.gate_up.append(_fuse([mlp.gate_proj, mlp.up_proj]))
        self.eps = float(self.layers[0].input_layernorm.variance_epsilon)

    @classmethod
    def of(cls, model) -> "FusedLayers":
        """One instance per model: fusing again would re-concatenate every weight (16 GB for 8B)."""
        if getattr(model, "_harness_fused", None) is None:
            model._harness_fused = cls(model)
        return model._harness_fused

    @staticmethod
    def supported(model) -> bool:
        return getattr(model.config, "hidden_act", "silu") == "silu" and model.device.type == "cuda"

    def run(self, engine, h: torch.Tensor) -> torch.Tensor:
        n = len(self.layers)
        x = fused.rmsnorm(h, self.layers[0].input_layernorm.weight, self.eps)
        for i, layer in enumerate(self.layers):
            a = self._attention(engine, i, layer, x)
            x, h = fused.rmsnorm(a, layer.post_attention_layernorm.weight, self.eps, residual=h)
            w, b = self.gate_up[i]
            m = layer.mlp.down_proj(fused.silu_mul(F.linear(x, w, b)))
            if i + 1 < n:
                x, h = fused.rmsnorm(m, self.layers[i + 1].input_layernorm.weight, self.eps, residual=h)
            else:
                h = h + m
        return h

    def _attention(self, engine, i: int, layer, x: torch.Tensor) -> torch.Tensor:
        attn = layer.self_attn
        B, T, _ = x.shape
        info = engine.info
        D = info.head_dim
        w, b = self.qkv[i]
        qkv = F.linear(x, w, b).view(B, T, info.num_heads + 2 * info.num_kv_heads, D)
        q, k, v = qkv.split([info.num_heads, info.num_kv_heads, info.num_kv_heads], dim=2)
        if hasattr(attn, "q_norm"):  # Qwen3
            q = fused.rmsnorm(q, attn.q_norm.weight, attn.q_norm.variance_epsilon)
            k = fused.rmsnorm(k, attn.k_norm.weight, attn.k_norm.variance_epsilon)
        out = engine.method.attend(i, q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), engine.rope)
        return attn.o_proj(out)
