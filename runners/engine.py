"""Our own decode loop over the HF model's modules (in the spirit of gpt-fast).

The HF weights and module code (embedding, norms, projections, q/k norms, rotary module, MLP,
head) are reused; attention and the KV cache belong to the method. That is what lets a method
re-rotate keys after eviction, stream a prompt in strides or pick tokens layer to layer, without
the engine knowing which method runs.

Supported families: Llama (incl. Llama-3 / linear / YaRN rope scaling), Mistral, Qwen2 (qkv bias),
Qwen3 (q/k norms). Batches are of equal-length prompts.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from common.errors import ConfigError
from methods.base import Method, ModelInfo, Step
from methods.parts.rope import Rope
from runners.graphs import DecodeGraph
from runners.layer_ops import FusedOps, ModuleOps
from runners.models import SUPPORTED
from runners.sampling import sample_next


class NonFiniteLogits(RuntimeError):
    """A sample's logits held NaN or inf: its answer would be argmax noise (the run records a failed row)."""


@dataclass
class Timings:
    prefill_s: float = 0.0
    tail_s: float = 0.0
    decode_ms_per_token: float | None = None
    decode_steps: int = 0
    peak_mem_gib: float | None = None


@dataclass
class Generation:
    tokens: list[list[int]]                 # generated ids per sequence (stop token excluded)
    stop_reason: list[str]                  # "stop" | "length"
    timings: Timings = field(default_factory=Timings)


class Engine:
    def __init__(self, model, method: Method, use_graphs: bool = True, use_fused: bool = True):
        cfg = model.config
        if cfg.model_type not in SUPPORTED:
            raise ConfigError(f"model family {cfg.model_type!r} is not supported by the engine; "
                              f"supported: {', '.join(SUPPORTED)}")
        if getattr(cfg, "use_sliding_window", False) or (cfg.model_type == "mistral" and getattr(cfg, "sliding_window", None)):
            raise ConfigError("sliding-window attention models are not supported by the engine")
        self.model = model
        self.method = method
        self.info = ModelInfo.from_hf_config(cfg)
        inner = model.model
        self.embed = inner.embed_tokens
        self.norm = inner.norm
        self.lm_head = model.lm_head
        self.n_layers = len(inner.layers)
        self.rope = Rope(inner.rotary_emb)
        self.device = self.embed.weight.device
        self.dtype = self.embed.weight.dtype
        self.seq_len = 0      # tokens of the current sequence seen so far
        self.capacity = 0
        # The layer's projections and element-wise ops: fused kernels on CUDA, the HF modules elsewhere.
        fused = use_fused and FusedOps.supported(model)
        self.ops = FusedOps.of(model, self.info) if fused else ModuleOps(model, self.info)
        # Decode steps of graph-safe methods run as one captured CUDA graph (no launch overhead).
        self.graphs = DecodeGraph(self) if (self.device.type == "cuda" and use_graphs and method.graph_safe) else None
        self.history: torch.Tensor | None = None

    # --- sequence life cycle -----------------------------------------------------------------
    def reset(self, batch: int, max_len: int) -> None:
        """Start new sequences; the method allocates storage for up to `max_len` tokens."""
        self.method.setup(self.info, batch, max_len, self.device, self.dtype)
        self.seq_len = 0
        self.capacity = max_len
        # Token ids seen so far: a method's cache correction re-runs some of them (`recompute`).
        if self.history is None or self.history.shape != (batch, max_len):
            self.history = torch.empty(batch, max_len, dtype=torch.long, device=self.device)

    def close(self) -> None:
        """Give back device memory now: the method's buffers, the captured graph, the history.
        (Dropping the last reference does the same: no reference cycle keeps an engine alive.)"""
        self.method.release()
        self.graphs = None
        self.history = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, phase: str, logits: str = "last") -> torch.Tensor | None:
        """Run new tokens `ids` [B, T] through every layer. `logits`: "last" -> [B, V],
        "all" -> [B, T, V], "none" -> None (intermediate prefill chunks skip the head)."""
        B, T = ids.shape
        start = self.seq_len
        if start + T > self.capacity:
            raise RuntimeError(f"sequence of {start + T} tokens exceeds the engine's capacity {self.capacity}")
        positions = torch.arange(start, start + T, device=self.device)
        h = self.layers(ids, phase, start, positions)
        self.seq_len = start + T
        if logits == "none":
            return None
        if logits == "last":
            h = h[:, -1]
        return self.lm_head(self.norm(h)).float()

    def decode_logits(self, token: torch.Tensor, position: torch.Tensor, graphed: bool = False) -> torch.Tensor:
        """One decode step of `token` [B] at `position` (a [1] device tensor): logits [B, V]. Reads no
        host state of the sequence but `seq_len` as the step's nominal start: this is the function a
        CUDA graph captures (runners/graphs.py) and the eager path calls."""
        h = self.layers(token.view(-1, 1), "decode", self.seq_len, position, graphed=graphed)
        return self.lm_head(self.norm(h[:, -1])).float()

    def layers(self, ids: torch.Tensor, phase: str, start: int, positions: torch.Tensor,
               graphed: bool = False) -> torch.Tensor:
        """Tokens `ids` [B, T] at `positions` through every layer; returns hidden states [B, T, H].
        The one layer loop: `self.ops` supplies the projections and norms (fused or HF modules),
        the method supplies attention and owns the KV cache."""
        T = ids.shape[1]
        self.rope.new_step()
        self.method.begin(Step(phase=phase, start=start, length=T, positions=positions, graphed=graphed))
        self.history.index_copy_(1, positions, ids)
        ops, n = self.ops, self.n_layers
        h = self.embed(ids)
        x = ops.norm_in(0, h)
        for i in range(n):
            q, k, v = ops.qkv(i, x)
            a = ops.o_proj(i, self.method.attend(i, q, k, v, self.rope))
            x, h = ops.add_norm(i, a, h, post=True)
            m = ops.mlp(i, x)
            if i + 1 < n:
                x, h = ops.add_norm(i + 1, m, h, post=False)
            else:
                h = h + m
        return h

    @torch.inference_mode()
    def recompute(self, start: int, end: int) -> None:
        """Re-run cached tokens start..end-1 as a phase "correct" step (no logits, seq_len unchanged):
        the method rewrites their KV densely (TidalDecode's cache correction)."""
        ids = self.history[:, start:end].clone()  # layers() writes the history: no self-overlapping copy
        self.layers(ids, "correct", start, torch.arange(start, end, device=self.device))

    # --- prefill / decode ----------------------------------------------------------------------
    def prefill(self, ids: torch.Tensor, logits: str = "last") -> torch.Tensor | None:
        """Prompt in chunks of `method.prefill_chunk` (None = one chunk); each chunk attends to the
        method's cache plus itself, causally."""
        n = ids.shape[1]
        plan = getattr(self.method, "prefill_bounds", None)  # a method may place its chunks (Ltri-LLM's last Q)
        starts = list(plan(n)) if plan else list(range(0, n, self.method.prefill_chunk or n))
        outs = []
        for s, e in zip(starts, starts[1:] + [n]):
            last = e >= n
            want = logits if (last or logits == "all") else "none"
            out = self.forward(ids[:, s:e], "prefill", logits=want)
            if out is not None and (logits == "all" or last):
                outs.append(out)
        if logits == "none":
            return None
        return torch.cat(outs, dim=1) if logits == "all" else outs[-1]

    @torch.inference_mode()
    def decode(self, token: torch.Tensor) -> torch.Tensor:
        """One decode step: token [B] -> logits [B, V]. A method asking for a cache correction
        (`correction_span`) gets it right after the step; its cost counts in the decode time."""
        if self.seq_len + 1 > self.capacity:
            raise RuntimeError(f"sequence of {self.seq_len + 1} tokens exceeds the engine's capacity {self.capacity}")
        self.method.before_decode(self.seq_len)
        if self.graphs is not None:
            logits = self.graphs.step(token)
        else:
            position = torch.arange(self.seq_len, self.seq_len + 1, device=self.device)
            logits = self.decode_logits(token, position)
        self.seq_len += 1
        span = self.method.correction_span(self.seq_len)
        if span is not None:
            self.recompute(*span)
        return logits

    # --- generation ------------------------------------------------------------------------------
    @torch.inference_mode()
    def generate(self, ids: torch.Tensor, max_new_tokens: int, stop_ids=(), temperature: float = 0.0,
                 top_p: float = 1.0, seed: int | None = None, decode_tail: int = 0) -> Generation:
        """Greedy (temperature 0) or sampled generation for a batch of equal-length prompts.

        `decode_tail` feeds the last N prompt tokens one at a time through the decode path (the
        Quest/TidalDecode/LycheeDecode LongBench and passkey protocol)."""
        if ids.dim() == 1:
            ids = ids.unsqueeze(0)
        ids = ids.to(self.device)
        B, T = ids.shape
        tail = min(max(int(decode_tail), 0), T - 1)
        self.reset(B, T + max_new_tokens)
        timer = _Timer(self.device)
        timer.start()
        logits = self.prefill(ids[:, :T - tail])
        timings = Timings(prefill_s=timer.stop())
        timer.start()
        for j in range(T - tail, T):
            logits = self.decode(ids[:, j])
        timings.tail_s = timer.stop()

        gen = torch.Generator(device=self.device)
        if seed is not None:
            gen.manual_seed(int(seed))
        stop = torch.tensor(sorted(set(int(s) for s in stop_ids)) or [-1], device=self.device)
        out = torch.empty(B, max_new_tokens, dtype=torch.long, device=self.device)
        done = torch.zeros(B, dtype=torch.bool, device=self.device)
        finite = torch.ones((), dtype=torch.bool, device=self.device)
        n = 0
        timer.start()
        for n in range(1, max_new_tokens + 1):
            finite &= torch.isfinite(logits).all()  # argmax of NaN logits would answer silently
            token = sample_next(logits, temperature, top_p, gen)
            out[:, n - 1] = token
            done |= torch.isin(token, stop)
            if n == max_new_tokens:
                break
            all_done, ok = torch.stack([done.all(), finite]).tolist()  # one host sync per token
            if not ok or all_done:
                break
            logits = self.decode(token)
        decode_s = timer.stop()
        if not bool(finite):
            raise NonFiniteLogits(f"non-finite logits by generated token {n} (a NaN/inf in the model or "
                                  f"the method): no answer recorded")
        timings.decode_steps = max(n - 1, 0)
        timings.decode_ms_per_token = 1000 * decode_s / timings.decode_steps if timings.decode_steps else None
        timings.peak_mem_gib = _peak_mem(self.device)

        tokens, reasons = [], []
        stop_set = set(stop.tolist())
        for row in out[:, :n].tolist():
            cut = next((i for i, t in enumerate(row) if t in stop_set), None)
            tokens.append(row if cut is None else row[:cut])
            reasons.append("length" if cut is None else "stop")
        return Generation(tokens=tokens, stop_reason=reasons, timings=timings)

    # --- scoring -------------------------------------------------------------------------------
    @torch.inference_mode()
    def nll(self, ids: torch.Tensor, mode: str = "decode", stride: int | None = None) -> torch.Tensor:
        """Per-token negative log-likelihood of tokens 1..T-1, shape [B, T-1] (fp32).

        mode="decode": every token goes one at a time through the decode path (the
        StreamingLLM/Quest/TidalDecode PG-19 protocol; sparse from the first step where the cache
        exceeds the budget). mode="stride": chunks of `stride` tokens (default the method's
        prefill_chunk) through the prefill path, each attending to the method's cache (Cascading)."""
        if ids.dim() == 1:
            ids = ids.unsqueeze(0)
        ids = ids.to(self.device)
        B, T = ids.shape
        self.reset(B, T)
        out = torch.empty(B, T - 1, dtype=torch.float32, device=self.device)
        if mode == "decode":
            for t in range(T - 1):
                logits = self.decode(ids[:, t])
                out[:, t] = torch.nn.functional.cross_entropy(logits, ids[:, t + 1], reduction="none")
        elif mode == "stride":
            chunk = stride or self.method.prefill_chunk or T
            for s in range(0, T - 1, chunk):
                e = min(s + chunk, T - 1)
                logits = self.forward(ids[:, s:e], "prefill", logits="all")
                lp = torch.log_softmax(logits, dim=-1)
                out[:, s:e] = -lp.gather(-1, ids[:, s + 1:e + 1].unsqueeze(-1)).squeeze(-1)
        else:
            raise ConfigError(f"unknown nll mode {mode!r}; use decode or stride")
        return out

    def logits(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits at every position of `ids` [B, T] from a fresh prefill (for parity checks)."""
        ids = ids.to(self.device)
        self.reset(ids.shape[0], ids.shape[1])
        return self.prefill(ids, logits="all")


class _Timer:
    """Wall time on CPU, device events on CUDA (no sync until the region ends)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def start(self):
        if self.cuda:
            self.a = torch.cuda.Event(enable_timing=True)
            self.b = torch.cuda.Event(enable_timing=True)
            self.a.record()
        else:
            self.t = time.perf_counter()

    def stop(self) -> float:
        if self.cuda:
            self.b.record()
            self.b.synchronize()
            return self.a.elapsed_time(self.b) / 1000
        return time.perf_counter() - self.t


def _peak_mem(device: torch.device) -> float | None:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    try:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB (Linux)
    except Exception:  # pragma: no cover
        return None
