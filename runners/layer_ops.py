"""The projections and element-wise ops of a decoder layer, in two interchangeable flavours that the
engine's one layer loop calls:

  ModuleOps  the HF modules as they are (every device): the exact reference the parity tests check.
  FusedOps   CUDA only: q/k/v and gate/up as one GEMM each (the original weights become views of
             the fused ones, so no memory is duplicated), RMSNorm fused with the residual add, RoPE
             and SiLU-mul as Triton kernels (kernels/fused.py). Same math, fewer kernels: in a decode
             step of an 8B model the element-wise kernels took ~2.5 ms of ~9 ms (launch-bound).

Both bound prefill memory: the MLP of a long prompt runs in row chunks (its intermediate is ~3.5x
the hidden size: 8 x 32K tokens of Llama-3-8B would need a 14 GiB intermediate at once).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

MLP_ROWS = 16384  # tokens per MLP chunk in long prefills (a row's result does not depend on the chunk)


def _chunked(fn, x: torch.Tensor, rows: int = MLP_ROWS) -> torch.Tensor:
    """fn over the tokens of x [B, T, H] in chunks of `rows` tokens when T is long."""
    B, T, H = x.shape
    if B * T <= rows:
        return fn(x)
    flat = x.reshape(B * T, H)
    first = fn(flat[:rows])
    out = first.new_empty(B * T, first.shape[-1])
    out[:rows] = first
    for r in range(rows, B * T, rows):
        out[r:r + rows] = fn(flat[r:r + rows])
    return out.view(B, T, -1)


class ModuleOps:
    """The HF modules, untouched."""

    def __init__(self, model, info):
        self.layers = model.model.layers
        self.info = info

    def norm_in(self, i: int, h: torch.Tensor) -> torch.Tensor:
        return self.layers[i].input_layernorm(h)

    def add_norm(self, i: int, out: torch.Tensor, h: torch.Tensor, post: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """h = h + out, then the post-attention (post=True) or next input (post=False) norm of layer i."""
        h = h + out
        layer = self.layers[i]
        return (layer.post_attention_layernorm if post else layer.input_layernorm)(h), h

    def qkv(self, i: int, x: torch.Tensor):
        attn = self.layers[i].self_attn
        B, T, _ = x.shape
        D = self.info.head_dim
        q = attn.q_proj(x).view(B, T, -1, D)
        k = attn.k_proj(x).view(B, T, -1, D)
        v = attn.v_proj(x).view(B, T, -1, D)
        if hasattr(attn, "q_norm"):  # Qwen3: RMSNorm over head_dim before RoPE
            q, k = attn.q_norm(q), attn.k_norm(k)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def o_proj(self, i: int, out: torch.Tensor) -> torch.Tensor:
        return self.layers[i].self_attn.o_proj(out)

    def mlp(self, i: int, x: torch.Tensor) -> torch.Tensor:
        return _chunked(self.layers[i].mlp, x)


def _fuse(linears: list[torch.nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Concatenate the weights (and biases) of `linears` along the output dim and make each
    module's parameters views of the result."""
    weight = torch.cat([m.weight.data for m in linears], dim=0)
    has_bias = [m.bias is not None for m in linears]
    if any(has_bias) and not all(has_bias):
        raise ValueError("cannot fuse projections where only some have a bias")
    bias = torch.cat([m.bias.data for m in linears], dim=0) if all(has_bias) else None
    row = 0
    for m in linears:
        n = m.weight.shape[0]
        m.weight.data = weight[row:row + n]
        if bias is not None:
            m.bias.data = bias[row:row + n]
        row += n
    return weight, bias


class FusedOps(ModuleOps):
    """Fused GEMMs and Triton element-wise kernels (CUDA)."""

    def __init__(self, model, info):
        super().__init__(model, info)
        self.qkv_w, self.gate_up = [], []
        for layer in self.layers:
            a, mlp = layer.self_attn, layer.mlp
            self.qkv_w.append(_fuse([a.q_proj, a.k_proj, a.v_proj]))
            self.gate_up.append(_fuse([mlp.gate_proj, mlp.up_proj]))
        self.eps = float(self.layers[0].input_layernorm.variance_epsilon)

    @classmethod
    def of(cls, model, info) -> "FusedOps":
        """One instance per model: fusing again would re-concatenate every weight (16 GB for 8B)."""
        if getattr(model, "_harness_fused", None) is None:
            model._harness_fused = cls(model, info)
        return model._harness_fused

    @staticmethod
    def supported(model) -> bool:
        mlp = model.model.layers[0].mlp
        return (getattr(model.config, "hidden_act", "silu") == "silu" and getattr(mlp, "gate_proj", None) is not None
                and model.device.type == "cuda")

    def norm_in(self, i, h):
        from kernels import fused

        return fused.rmsnorm(h, self.layers[i].input_layernorm.weight, self.eps)

    def add_norm(self, i, out, h, post):
        from kernels import fused

        layer = self.layers[i]
        w = (layer.post_attention_layernorm if post else layer.input_layernorm).weight
        return fused.rmsnorm(out, w, self.eps, residual=h)

    def qkv(self, i, x):
        from kernels import fused

        attn, info = self.layers[i].self_attn, self.info
        B, T, _ = x.shape
        w, b = self.qkv_w[i]
        qkv = F.linear(x, w, b).view(B, T, info.num_heads + 2 * info.num_kv_heads, info.head_dim)
        q, k, v = qkv.split([info.num_heads, info.num_kv_heads, info.num_kv_heads], dim=2)
        if hasattr(attn, "q_norm"):  # Qwen3
            q = fused.rmsnorm(q, attn.q_norm.weight, attn.q_norm.variance_epsilon)
            k = fused.rmsnorm(k, attn.k_norm.weight, attn.k_norm.variance_epsilon)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def mlp(self, i, x):
        from kernels import fused

        w, b = self.gate_up[i]
        down = self.layers[i].mlp.down_proj
        return _chunked(lambda t: down(fused.silu_mul(F.linear(t, w, b))), x)
