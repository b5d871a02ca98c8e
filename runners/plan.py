"""The memory plan: before any weight loads, does the run fit the GPUs present, and how is it split?

Numbers come from what the run will really allocate, not from a table: the model's weights per
layer from the HF model built on the `meta` device (its real shapes, no memory), the method's own
storage from its `setup` on the `meta` device at the run's batch and length (exactly the tensors
it declares in `buffers()`), and each GPU's free memory. The split is contiguous layers per GPU
(pipeline order; GPU 0 also holds the embedding, the final norm and the head: the engine samples there), balanced so
that every GPU is filled to the same fraction of what it can hold.

`split` and `advice` are pure functions over numbers (unit-tested with fake GPU inventories);
`footprint` and `inventory` measure; `for_run` is what the run loop calls: it prints one line and
raises a ConfigError (exit 2) when the run cannot fit.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from common.errors import ConfigError

GIB = 2 ** 30
MARGIN = int(1.5 * GIB)   # per GPU: CUDA context, cuBLAS/Triton workspaces, allocator fragmentation
MLP_ROWS = 16384          # runners.layer_ops.MLP_ROWS: the MLP of a long prefill runs in row chunks


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    free: int      # bytes free now
    total: int


@dataclass(frozen=True)
class Footprint:
    """Bytes a run needs. `layers[i]` = layer i's weights + the method's storage for layer i."""

    layers: tuple[int, ...]
    embed: int            # first GPU: input embedding
    head: int             # first GPU too: final norm + lm_head (+ the logits)
    shared: int           # every GPU: method state not stacked by layer (each segment holds its own)
    activations: int      # every GPU: workspace of the largest step (a prefill chunk)
    weights: int          # totals, for the message
    state: int
    what: str = ""        # "llama3_70b, full, batch 1 x 131072 tokens"

    @property
    def total(self) -> int:
        return sum(self.layers) + self.embed + self.head


@dataclass(frozen=True)
class Plan:
    fits: bool
    segments: tuple[tuple[int, int, int, int], ...]   # (gpu index, first layer, end layer, bytes)
    gpus: tuple[Gpu, ...]
    line: str = ""
    advice: tuple[str, ...] = field(default_factory=tuple)


def _usable(g: Gpu) -> int:
    return max(0, g.free - MARGIN)


def _fill(fp: Footprint, gpus: list[Gpu], ratio: float) -> list[tuple[int, int, int, int]] | None:
    """Contiguous layers per GPU, each GPU filled up to `ratio` of its usable memory (None: they do not all fit)."""
    segs, i, n = [], 0, len(fp.layers)
    for k, g in enumerate(gpus):
        cap = ratio * _usable(g)
        used = fp.shared + fp.activations + (fp.embed + fp.head if k == 0 else 0)
        start = i
        while i < n and used + fp.layers[i] <= cap:
            used += fp.layers[i]
            i += 1
        if used > cap:
            return None
        segs.append((g.index, start, i, used))
    return segs if i == n else None


def split(fp: Footprint, gpus: list[Gpu]) -> list[tuple[int, int, int, int]] | None:
    """The balanced split over exactly these GPUs (every GPU gets at least one layer), or None."""
    if not gpus or len(gpus) > len(fp.layers):
        return None
    if _fill(fp, gpus, 1.0) is None:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(40):                       # the smallest common fill ratio that places every layer
        mid = (lo + hi) / 2
        if _fill(fp, gpus, mid) is None:
            lo = mid
        else:
            hi = mid
    segs = _fill(fp, gpus, hi)
    if segs is None or any(s[1] == s[2] for s in segs):
        return None
    return segs


def fewest(fp: Footprint, like: Gpu, limit: int = 64) -> int | None:
    """How many GPUs like `like` the run needs at least (None: more than `limit`)."""
    for n in range(1, min(limit, len(fp.layers)) + 1):
        if split(fp, [replace(like, index=i) for i in range(n)]) is not None:
            return n
    return None


def plan(fp: Footprint, gpus: list[Gpu], devices: int | str = 1, batch: int = 1, length: int = 0,
         length_slope: float | None = None) -> Plan:
    """Place the run on `devices` GPUs of `gpus` (an int N: the first N; "auto": the fewest that fit).
    `length_slope` (bytes per token of the method's storage, all layers) lets the advice name the
    longest length that would fit."""
    if devices == "auto":
        chosen = next((gpus[:n] for n in range(1, len(gpus) + 1) if split(fp, gpus[:n]) is not None), gpus)
    else:
        n = int(devices)
        if n < 1:
            raise ConfigError(f"runner.devices must be >= 1 or auto, got {devices}")
        if n > len(gpus):
            raise ConfigError(f"runner.devices={n} but this machine has {len(gpus)} GPU(s)")
        chosen = gpus[:n]
    segs = split(fp, chosen)
    if segs is not None:
        parts = ", ".join(f"layers {a}-{b - 1} -> cuda:{g} {used / GIB:.1f}/{_usable(_by(chosen, g)) / GIB:.1f} GiB"
                          for g, a, b, used in segs)
        line = (f"plan: fits on {len(chosen)} x {_name(chosen)} ({parts}; weights {fp.weights / GIB:.1f} GiB, "
                f"method state {fp.state / GIB:.1f} GiB: {fp.what})")
        return Plan(True, tuple(segs), tuple(chosen), line)
    tips = advice(fp, gpus, chosen, batch, length, length_slope)
    have = sum(_usable(g) for g in chosen)
    line = (f"plan: {fp.what} needs {fp.weights / GIB:.1f} GiB of weights + {fp.state / GIB:.1f} GiB of method "
            f"state + {fp.activations / GIB:.1f} GiB of workspace per GPU, more than {len(chosen)} x "
            f"{_name(chosen)} hold ({have / GIB:.1f} GiB usable); to fit: {'; or '.join(tips)}")
    return Plan(False, (), tuple(chosen), line, tuple(tips))


def advice(fp: Footprint, gpus: list[Gpu], chosen: list[Gpu], batch: int, length: int,
           length_slope: float | None) -> list[str]:
    """What to change, most direct first: more GPUs, a smaller batch, a shorter length, a smaller
    prefill chunk, a bounded or offloading method."""
    tips = []
    like = max(chosen, key=lambda g: g.free) if chosen else None
    if like is not None and fp.activations > _usable(like) / 4:
        tips.append("a smaller method.prefill_chunk (the step's workspace grows with it)")
    if like is not None:
        need = fewest(fp, like, limit=8)   # one host
        if need is not None and need <= len(gpus) and need > len(chosen):
            tips.append(f"runner.devices={need}")
        elif need is not None and need > len(chosen):
            tips.append(f"runner.devices={need} on a host with {need} x {like.name} (this one has {len(gpus)}; "
                        f"Slurm: model.gpus={need})")
    state_layers = fp.state - fp.shared * len(chosen)
    if batch > 1 and chosen:
        per_seq = state_layers / batch
        for b in range(batch - 1, 0, -1):
            if split(replace(fp, layers=_scaled(fp, per_seq * (b - batch))), chosen) is not None:
                tips.append(f"runner.batch_size={b}")
                break
    if length_slope and length and chosen:
        lo, hi = 0, length
        while hi - lo > 1024:
            mid = (lo + hi) // 2
            ok = split(replace(fp, layers=_scaled(fp, length_slope * (mid - length))), chosen) is not None
            lo, hi = (mid, hi) if ok else (lo, mid)
        if lo >= 1024:
            tips.append(f"a length <= {lo // 1024}K tokens")
    tips.append("a bounded-memory method or offload (e.g. method=infllm, its blocks in host memory)")
    return tips


def _scaled(fp: Footprint, delta_total: float) -> tuple[int, ...]:
    """Per-layer bytes with the method's storage changed by `delta_total` bytes, spread over the layers."""
    n = len(fp.layers)
    return tuple(max(0, int(b + delta_total / n)) for b in fp.layers)


def _by(gpus, index):
    return next(g for g in gpus if g.index == index)


def _name(gpus) -> str:
    g = gpus[0] if gpus else None
    return f"{g.name} ({g.total / GIB:.0f} GiB)" if g else "no GPU"


# --- measuring (meta device, CUDA) --------------------------------------------------------------------
def inventory() -> list[Gpu]:
    """The visible CUDA GPUs with their free memory now."""
    out = []
    for i in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
        free, total = torch.cuda.mem_get_info(i)
        out.append(Gpu(i, torch.cuda.get_device_name(i), int(free), int(total)))
    return out


def state_bytes(method_cls_or_obj, info, batch: int, length: int, dtype) -> tuple[list[int], int]:
    """(per-layer bytes, bytes not stacked by layer) of the method's declared storage at `batch` x
    `length`, from its setup on the meta device (nothing allocated)."""
    m = method_cls_or_obj
    m.setup(info, batch, length, torch.device("meta"), dtype)
    per_layer, shared = [0] * info.num_layers, 0
    for t in m.buffers().values():
        if t is None:
            continue
        n = t.numel() * t.element_size()
        if t.dim() >= 1 and t.shape[0] == info.num_layers:
            for i in range(info.num_layers):
                per_layer[i] += n // info.num_layers
        else:
            shared += n
    m.release()
    return per_layer, shared


def weight_bytes(hf_config, dtype) -> tuple[list[int], int, int]:
    """(per-layer, embedding, final norm + head) bytes of the model's weights, from the model built
    on the meta device (a tied head is counted once, on the first GPU)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype)
    def size(mod):
        return sum(p.numel() * p.element_size() for p in mod.parameters())

    layers = [size(layer) for layer in model.model.layers]
    embed = size(model.model.embed_tokens)
    head = size(model.model.norm)
    if model.lm_head.weight is not model.model.embed_tokens.weight:
        head += size(model.lm_head)
    return layers, embed, head


def activation_bytes(info, intermediate: int, batch: int, chunk: int, dtype) -> int:
    """Workspace of one step of `chunk` new tokens per sequence: hidden states, q/k/v, the rotated
    copies, the attention output, and the MLP intermediate of one row chunk."""
    elt = torch.finfo(dtype).bits // 8
    tokens = batch * chunk
    H, Hq, Hkv, D = info.hidden_size, info.num_heads, info.num_kv_heads, info.head_dim
    per_token = 4 * H + 2 * (Hq + 2 * Hkv) * D + Hq * D
    return elt * (tokens * per_token + min(tokens, MLP_ROWS) * 3 * intermediate)


def footprint(hf_config, method, info, batch: int, length: int, dtype, what: str = "") -> tuple[Footprint, float]:
    """(Footprint, bytes of method storage per extra token) of `method` (a built Method) on this model."""
    w_layers, embed, head = weight_bytes(hf_config, dtype)
    s_layers, shared = state_bytes(method, info, batch, length, dtype)
    half_layers, _ = state_bytes(method, info, batch, max(1, length // 2), dtype)
    slope = (sum(s_layers) - sum(half_layers)) / max(1, length - max(1, length // 2))
    chunk = min(length, method.prefill_chunk or length)
    act = activation_bytes(info, int(getattr(hf_config, "intermediate_size", 4 * info.hidden_size)), batch, chunk, dtype)
    head += batch * info.vocab_size * 4 * 2          # fp32 logits and their copy
    fp = Footprint(layers=tuple(a + b for a, b in zip(w_layers, s_layers)), embed=embed, head=head, shared=shared,
                   activations=act, weights=sum(w_layers) + embed + head, state=sum(s_layers) + shared, what=what)
    return fp, slope


def for_run(cfg, device: torch.device, dtype, batch: int, length: int):
    """The placement [(device, first layer, end layer)] of a CUDA run, from its plan (printed in one
    line; ConfigError, exit 2, when it cannot fit: a 1M-token cache on one GPU is refused before any
    weight loads). None on CPU/MPS, where nothing is planned."""
    import methods
    from runners.models import config_from_arch
    from runners.validate import model_info

    devices = cfg.runner.get("devices", 1)
    devices = "auto" if devices == "auto" else int(devices if devices is not None else 1)
    if device.type != "cuda":
        if devices not in (1, "auto"):
            raise ConfigError(f"runner.devices={devices} needs CUDA GPUs (this run is on {device.type})")
        return None
    info = model_info(cfg.model)
    gpus = inventory()
    if device.index is not None:     # runner.device=cuda:K: K first
        gpus = [g for g in gpus if g.index == device.index] + [g for g in gpus if g.index != device.index]
    what = f"{cfg.model.name}, {cfg.method.name}, batch {batch} x {length} tokens"
    try:
        fp, slope = footprint(config_from_arch(cfg.model.arch), methods.build(cfg.method, info), info, batch,
                              length, dtype, what)
    except Exception as e:  # noqa: BLE001 -- a method whose setup cannot run on meta: said, not hidden
        if devices != 1:
            raise ConfigError(f"plan: cannot size {cfg.method.name}'s storage on the meta device "
                              f"({type(e).__name__}: {e}); a split needs the plan: use runner.devices=1") from None
        import sys

        print(f"warning: plan: cannot size {cfg.method.name}'s storage on the meta device ({type(e).__name__}); "
              f"the run goes on one GPU unchecked", file=sys.stderr)
        return None
    p = plan(fp, gpus, devices, batch, length, slope)
    if not p.fits:
        raise ConfigError(p.line)
    import sys

    print(p.line, file=sys.stderr)
    return [(f"cuda:{g}", a, b) for g, a, b, _ in p.segments]
