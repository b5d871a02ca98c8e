"""InfLLM's offload on the GPU (`pytest -m gpu`), on the host path (LRU cache) and on the device path
(positional store in pinned host memory): with offload the device memory the method holds is measured
(torch.cuda.memory_allocated) well below the all-on-GPU variant and does not grow with the context beyond
the representative keys, while the outputs stay the same; blocks really move between host and device
(loads counted, the host memory pinned). Llama-3-8B attention shapes, random q/k/v fed
layer by layer (no model needed)."""
from __future__ import annotations

import gc

import pytest
import torch
from omegaconf import OmegaConf

from methods import ModelInfo, Step, build
from methods.parts.rope import Rope

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

INFO = ModelInfo(arch="llama", num_layers=2, num_heads=32, num_kv_heads=8, head_dim=128, hidden_size=4096,
                 max_position=1 << 20)
CFG = {"name": "infllm", "n_init": 128, "n_local": 4096, "block_size": 128, "topk": 16, "repr_topk": 4,
       "exc_block_size": 512, "max_cached_block": 32}


class _Rot(torch.nn.Module):
    """A plain RoPE module (theta 500000) with the HF rotary module's call signature."""

    def __init__(self):
        super().__init__()
        self.inv = 1.0 / (500000.0 ** (torch.arange(0, 128, 2, device="cuda").float() / 128))

    def forward(self, x, pos):
        f = pos.float().unsqueeze(-1) * self.inv
        e = torch.cat([f, f], -1)
        return e.cos().to(x.dtype), e.sin().to(x.dtype)


def _settle() -> None:
    """Make memory_allocated() count this run's tensors only: collect what earlier tests left in reference
    cycles (freed mid-run, they made a held size negative), and create the cuBLAS workspace before the
    base is read (~32 MiB on Hopper, allocated by the process's first GEMM: it went to whichever run
    came first, 34 MiB found by a gc walk of live CUDA tensors on the H200)."""
    gc.collect()
    for dt in (torch.bfloat16, torch.float32):
        a = torch.ones(64, 64, device="cuda", dtype=dt)
        (a @ a).sum().item()
        torch.bmm(a[None], a[None]).sum().item()
    torch.cuda.empty_cache()


def _run(offload: bool, context: int, decode: int = 8, path: str = "host"):
    """path host: the LRU path (an evidence option takes it; no needle set: nothing recorded); device: the
    device path, the store in pinned host memory with offload."""
    _settle()
    extra = {"evidence": "record"} if path == "host" else {}
    method = build(OmegaConf.create({**CFG, "offload": offload, **extra}), INFO)
    base = torch.cuda.memory_allocated()
    method.setup(INFO, 1, context + decode, torch.device("cuda"), torch.bfloat16)
    rope = Rope(_Rot())
    g = torch.Generator(device="cuda").manual_seed(0)
    outs = []
    with torch.inference_mode():
        seen = 0
        while seen < context + decode:
            T = min(512, context - seen) if seen < context else 1
            phase = "prefill" if seen < context else "decode"
            method.begin(Step(phase, seen, T, torch.arange(seen, seen + T, device="cuda")))
            rope.new_step()
            for layer in range(INFO.num_layers):
                q = torch.randn(1, 32, T, 128, device="cuda", generator=g).bfloat16()
                k = (torch.randn(1, 8, T, 128, device="cuda", generator=g) + 0.3).bfloat16()
                v = torch.randn(1, 8, T, 128, device="cuda", generator=g).bfloat16()
                out = method.attend(layer, q, k, v, rope)
            if phase == "decode":
                outs.append(out.float())
            seen += T
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - base
    reprs = method.reprs.numel() * method.reprs.element_size()
    return held, reprs, torch.cat(outs), method


def _declared_cuda_bytes(method) -> int:
    """Bytes of the distinct CUDA storages a method declares (its buffers())."""
    seen = {}
    for t in method.buffers().values():
        if t is not None and t.is_cuda:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


def test_offload_holds_less_device_memory_flat_in_context_same_outputs():
    on_16k, reprs_16k, out_on, m_on = _run(True, 16384)
    off_16k, _, out_off, m_off = _run(False, 16384, path="device")   # all on the GPU (the resident path)
    assert (out_on - out_off).abs().max().item() <= 2e-2          # same attention, bf16
    assert m_on.memory.transfers > 0 and m_on.memory.host_k[0].is_pinned()
    kv_block = 2 * INFO.num_layers * 8 * 128 * 128 * 2            # bytes of one block (k and v) for all layers
    assert m_off.formed_blocks > 32                               # more blocks than the LRU cache holds
    # the saving measured is the one the two paths declare (their buffers: the resident store against the
    # LRU cache and the memory buffer), and it is most of the resident store
    saving = _declared_cuda_bytes(m_off) - _declared_cuda_bytes(m_on)
    assert off_16k - on_16k >= 0.9 * saving
    assert saving >= 0.3 * m_off.store.device_bytes()
    on_64k, reprs_64k, _, m64 = _run(True, 65536)
    # flat: what grows from 16K to 64K is only the representative keys (64 KiB per block here)
    assert (on_64k - reprs_64k) - (on_16k - reprs_16k) <= 4 << 20
    assert m64.memory.host_bytes() >= m64.formed_blocks * kv_block     # the host path: blocks, no positional store


def test_device_path_offload_holds_less_device_memory_flat_in_context_same_outputs():
    """The device path with offload: the positional store in pinned host memory, a step's memory staged."""
    on_16k, reprs_16k, out_on, m_on = _run(True, 16384, path="device")
    off_16k, _, out_off, m_off = _run(False, 16384, path="device")
    assert (out_on - out_off).abs().max().item() <= 2e-2           # the same rows, read from a staging copy
    assert m_on.store.k.is_pinned() and m_on.stats()["staged_bytes"] > 0 and m_off.store.host_bytes() == 0
    # the store left the GPU; the per-layer staging buffer came (InfLLM's slots: n_init + (topk + 1) blocks + a chunk)
    assert off_16k - on_16k >= 0.9 * (m_on.store.host_bytes() - m_on.stage.device_bytes())
    on_64k, reprs_64k, _, m64 = _run(True, 65536, path="device")
    assert (on_64k - reprs_64k) - (on_16k - reprs_16k) <= 4 << 20
    assert m64.store.host_bytes() >= 65536 * 2 * INFO.num_layers * 8 * 128 * 2
