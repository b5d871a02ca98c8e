"""One model's layers over several GPUs of one host (a pipeline of contiguous layer segments).

Each segment (a GPU and its layers a..b-1) holds those layers' weights (placed by runners.models),
its own copy of the rotary module, and its own instance of the method, set up on that GPU: every
tensor the method's `setup` allocates with the model's layer count as its first dimension is
allocated for the segment's layers only (a `LayerWindow`: indexed by absolute layer ids, holding
b - a layers). So a method file never learns about devices: it allocates `[num_layers, ...]` on the
`device` it is handed and indexes `store.k[layer]`, as on one GPU.

The method's per-step state (what flows from layer to layer: TidalDecode's selected tokens,
LycheeDecode's sets, the step itself, lengths) follows the hidden state: at each boundary every
attribute of the previous segment's instance that is not its storage is handed to the next one,
its tensors copied to the next GPU (a few small tensors per boundary; a large one is refused,
see MAX_HANDOFF). After the last segment the state goes back to the first for the next step,
so the instances behave as one method.

Kernels of a segment run under `torch.cuda.device(segment's GPU)` (Triton launches on the current
device). The single-GPU engine never enters this module.
"""
from __future__ import annotations

import copy
import dataclasses
from contextlib import nullcontext

import torch
from torch.overrides import TorchFunctionMode

from methods.base import Step
from runners.engine import Engine

MAX_HANDOFF = 64 * 2 ** 20     # bytes: per-step state is small; a bigger tensor is storage someone forgot to declare
SHARED = ("_attended",)        # host dicts every segment writes into (the method's per-layer stats)
KEEP = ("cfg", "info")
FACTORIES = {torch.empty, torch.zeros, torch.ones, torch.full}
LIKE = {torch.empty_like, torch.zeros_like, torch.ones_like, torch.full_like}


class LayerWindow(torch.Tensor):
    """A layer-stacked tensor holding layers first..first+n-1 of the model, indexed by absolute layer."""

    __torch_function__ = torch._C._disabled_torch_function_impl   # ops return plain tensors
    _first = 0

    def _shift(self, idx):
        head, rest = (idx[0], idx[1:]) if isinstance(idx, tuple) else (idx, None)
        if isinstance(head, int):
            local = head - self._first
            if not 0 <= local < self.shape[0]:
                raise IndexError(f"layer {head} is not on this GPU (it holds layers {self._first}-"
                                 f"{self._first + self.shape[0] - 1})")
            head = local
        elif not (isinstance(head, slice) and head == slice(None)):
            raise NotImplementedError(f"a layer-stacked buffer split over GPUs is indexed by layer id; got {head!r}")
        return head if rest is None else (head, *rest)

    def __getitem__(self, idx):
        return torch.Tensor.__getitem__(self.as_subclass(torch.Tensor), self._shift(idx))

    def __setitem__(self, idx, value):
        torch.Tensor.__setitem__(self.as_subclass(torch.Tensor), self._shift(idx), value)


def window(t: torch.Tensor, first: int) -> LayerWindow:
    w = t.as_subclass(LayerWindow)
    w._first = first
    return w


class _Windowed(TorchFunctionMode):
    """During a segment's `setup`: a tensor created with `layers` as its first dimension holds
    only the segment's layers."""

    def __init__(self, layers: int, first: int, end: int):
        super().__init__()
        self.layers, self.first, self.n = layers, first, end - first

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in FACTORIES:
            args = list(args)
            shape = args[0] if args and isinstance(args[0], (tuple, list, torch.Size)) else None
            if shape is None and "size" in kwargs:
                shape = kwargs["size"]
            if shape is not None and len(shape) >= 1 and shape[0] == self.layers:
                new = (self.n, *shape[1:])
                if "size" in kwargs:
                    kwargs["size"] = new
                else:
                    args[0] = new
                return window(func(*args, **kwargs), self.first)
            if shape is None and args and isinstance(args[0], int) and func is not torch.full and args[0] == self.layers:
                return window(func(self.n, *args[1:], **kwargs), self.first)
            return func(*args, **kwargs)
        if func is torch.Tensor.copy_ and isinstance(args[0], LayerWindow) and isinstance(args[1], torch.Tensor) \
                and args[1].dim() and args[1].shape[0] == self.layers != args[0].shape[0]:
            args = (args[0], args[1][self.first:self.first + self.n], *args[2:])   # a whole-model table: our rows
        out = func(*args, **kwargs)
        if func in LIKE and args and isinstance(args[0], LayerWindow):
            return window(out, args[0]._first)
        return out


@dataclasses.dataclass
class Segment:
    device: torch.device
    first: int
    end: int
    method: object
    rope: object
    owned: frozenset = frozenset()
    streams: list = dataclasses.field(default_factory=list)


class Pipeline:
    def __init__(self, engine, bounds, method):
        """`bounds`: [(device, first, end)] covering the layers in order; `method`: the built method,
        used for the first segment (the others are copies of it before any setup)."""
        from methods.parts.rope import Rope

        self.info = engine.info
        self.segments = []
        for k, (dev, a, b) in enumerate(bounds):
            m = method if k == 0 else copy.deepcopy(method)
            rot = engine.model.model.rotary_emb
            rope = engine.rope if k == 0 else Rope(copy.deepcopy(rot).to(dev))
            self.segments.append(Segment(torch.device(dev), a, b, m, rope))
        self.at = 0     # the segment whose instance holds the method's current step state

    def _ctx(self, seg):
        return torch.cuda.device(seg.device) if seg.device.type == "cuda" else nullcontext()

    def setup(self, batch: int, max_len: int, dtype) -> None:
        shared = {}
        for seg in self.segments:
            seg.method.release()    # the old windows go back before the new ones are made
            with self._ctx(seg), _Windowed(self.info.num_layers, seg.first, seg.end):
                seg.method.setup(self.info, batch, max_len, seg.device, dtype)
            seg.owned = frozenset(_owned(seg.method))
            seg.streams = [v for v in vars(seg.method).values() if isinstance(v, torch.cuda.Stream)]
            for name in SHARED:
                shared.setdefault(name, getattr(seg.method, name, {}))
                setattr(seg.method, name, shared[name])
        self.at = 0

    def release(self) -> None:
        for seg in self.segments:
            seg.method.release()

    def goto(self, k: int, log: list | None = None) -> None:
        """Hand the method's step state to segment k's instance (from the one holding it). `log`
        collects the (source, destination) tensor copies made, which a captured decode replays."""
        if k == self.at:
            return
        src, dst = self.segments[self.at].method, self.segments[k]
        for st in self.segments[self.at].streams:   # a method's side streams (Lychee's selection) finish first
            torch.cuda.current_stream(self.segments[self.at].device).wait_stream(st)
        # a declared buffer not stacked by layer is the whole model's state (LycheeDecode's step sets,
        # a slot table): it follows the hidden state too, into the next instance's own buffer
        same = {}
        theirs = dst.method.buffers()
        for name, t in src.buffers().items():
            if t is not None and not _stacked(t, self.info.num_layers) and theirs.get(name) is not None:
                theirs[name].copy_(t, non_blocking=True)
                same[id(t)] = theirs[name]
                if log is not None:
                    log.append((t, theirs[name]))
        for name, value in vars(src).items():
            if name in src_owned(self, self.at) or name in dst.owned or name in KEEP or name in SHARED:
                continue
            setattr(dst.method, name, _move(value, dst.device, same, log))
        self.at = k

    def before_decode(self, seq_len: int) -> None:
        from methods.base import Method

        if type(self.segments[0].method).before_decode is Method.before_decode:
            return   # the method has no such hook: no hand-off around the GPUs before every step
        for k, seg in enumerate(self.segments):
            self.goto(k)
            with self._ctx(seg):
                seg.method.before_decode(seq_len)

    def correction_span(self, seq_len: int):
        return self.segments[self.at].method.correction_span(seq_len)

    def layers(self, engine, ids, phase, start, positions, graphed=False):
        """The engine's layer loop, segment by segment: the hidden state moves once per boundary."""
        self.goto(0)
        h, mlp = self.first(engine, ids, phase, start, positions, graphed)
        for k in range(len(self.segments)):
            self.goto(k)
            h, mlp = self.segment(engine, k, h, mlp)
        return h.to(self.segments[0].device, non_blocking=True)   # the final norm and the head sit with the embedding

    def first(self, engine, ids, phase, start, positions, graphed=False):
        """The step's start on the first GPU: the method's begin, the history, the embedding."""
        first = self.segments[0]
        with self._ctx(first):
            first.rope.new_step()
            first.method.begin(Step(phase=phase, start=start, length=ids.shape[1], positions=positions, graphed=graphed))
            engine.history.index_copy_(1, positions, ids)
            return engine.embed(ids), None

    def segment(self, engine, k, h, mlp):
        """Segment k's layers (its instance must hold the step state: goto(k)); `h`, `mlp`: the residual
        and the last MLP output of the segment before (mlp None for the first)."""
        ops, n, seg = engine.ops, engine.n_layers, self.segments[k]
        m = seg.method
        with self._ctx(seg):
            if k == 0:
                x = ops.norm_in(0, h)
            else:   # the boundary: the residual and the last MLP output move; the add+norm runs here,
                seg.rope.new_step()           # as the one-GPU loop runs it (same kernel, same bits)
                h, mlp = h.to(seg.device, non_blocking=True), mlp.to(seg.device, non_blocking=True)
                x, h = ops.add_norm(seg.first, mlp, h, post=False)
            for i in range(seg.first, seg.end):
                q, k_, v = ops.qkv(i, x)
                a = ops.o_proj(i, m.attend(i, q, k_, v, seg.rope))
                x, h = ops.add_norm(i, a, h, post=True)
                mlp = ops.mlp(i, x)
                if i + 1 < seg.end:
                    x, h = ops.add_norm(i + 1, mlp, h, post=False)
                elif i + 1 == n:
                    h = h + mlp
            for st in seg.streams:   # a side stream's work (Lychee's selection) joins before the hand-off:
                torch.cuda.current_stream().wait_stream(st)   # inside a capture, an unjoined fork is an error
        return h, mlp

    def stats(self) -> dict:
        return self.segments[self.at].method.stats()


def src_owned(p: Pipeline, k: int) -> frozenset:
    return p.segments[k].owned


def _stacked(t: torch.Tensor, layers: int) -> bool:
    """Per-layer storage (windowed, or stacked by layer though made after setup, e.g. a host tier grown
    in a step: each segment's instance only ever touches its own layers' rows of it)."""
    return isinstance(t, LayerWindow) or (t.dim() > 0 and t.shape[0] == layers)


def _owned(method) -> set[str]:
    """Attributes that hold the instance's storage: its declared buffers and storage objects."""
    ids = {id(t) for t in method.buffers().values() if t is not None}
    out = set()
    def mine(v):
        return isinstance(v, torch.Tensor) and (id(v) in ids or isinstance(v, LayerWindow))

    for name, value in vars(method).items():
        items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
        if mine(value) or hasattr(value, "buffers") or any(mine(v) for v in items) \
                or isinstance(value, (torch.cuda.Stream, torch.cuda.Event)):   # per device, never handed on
            out.add(name)
    return out


def _move(value, device, same=None, log=None):
    """`value` with its tensors on `device` (containers rebuilt only when something moved); a
    tensor that is one of the source's shared buffers becomes the destination's (`same`)."""
    same = same or {}
    if isinstance(value, torch.Tensor):
        if id(value) in same:
            return same[id(value)]
        if value.device == device:
            return value
        if value.numel() * value.element_size() > MAX_HANDOFF:
            raise RuntimeError(f"a method's per-step tensor of {value.numel() * value.element_size() >> 20} MiB "
                               f"would cross GPUs every step: storage must be declared in buffers()")
        moved = value.to(device, non_blocking=True)
        if log is not None:
            log.append((value, moved))
        return moved
    if isinstance(value, Step):
        return dataclasses.replace(value, positions=_move(value.positions, device, same, log))
    if isinstance(value, dict) and all(isinstance(k, int) for k in value):
        # a record per layer (Quest's page sets, TidalDecode's selections: read off the step, for stats):
        # one dict for all segments, each entry left on its layer's GPU. Moving it copied every earlier
        # layer's entry at every boundary: Quest on 2 GPUs took 10.96 ms/token against 8.60 on one
        return value
    if isinstance(value, dict):
        new = {k: _move(v, device, same, log) for k, v in value.items()}
        return value if all(new[k] is value[k] for k in value) else type(value)(new) if type(value) is dict else new
    if isinstance(value, (list, tuple)):
        new = [_move(v, device, same, log) for v in value]
        if all(a is b for a, b in zip(new, value)):
            return value
        return type(value)(new) if isinstance(value, list) or type(value) is tuple else type(value)(*new)
    return value


class PipelineMethod:
    """What the engine and the run loop see of a split method: one method (its config, name,
    stats, hooks), whichever segment's instance holds the step state."""

    def __init__(self, pipeline: Pipeline):
        self._p = pipeline

    def __getattr__(self, name):
        p = self.__dict__["_p"]
        return getattr(p.segments[p.at].method, name)

    def setup(self, info, batch, max_len, device, dtype):
        self._p.setup(batch, max_len, dtype)

    def release(self):
        self._p.release()

    def before_decode(self, seq_len):
        self._p.before_decode(seq_len)

    def correction_span(self, seq_len):
        return self._p.correction_span(seq_len)

    def buffers(self):
        return {f"{k}.{name}": t for k, seg in enumerate(self._p.segments) for name, t in seg.method.buffers().items()}



def split_engine(engine, placement, use_graphs: bool = True):
    """Layers over several GPUs: the engine's method becomes one instance per segment behind a proxy,
    the layer loop goes segment by segment (SplitEngine), a decode step is one CUDA graph per segment
    (runners/pipeline_graphs.py). Applied to a built one-GPU engine; with one segment the engine is
    returned as it is, so the one-GPU path gains no per-step work."""
    if placement is None or len(placement) < 2:
        return engine
    from runners.pipeline_graphs import PipelineGraphs

    engine.pipeline = Pipeline(engine, placement, engine.method)
    engine.method = PipelineMethod(engine.pipeline)
    engine.__class__ = SplitEngine
    cuda = all(torch.device(d).type == "cuda" for d, *_ in placement)
    engine.graphs = PipelineGraphs(engine) if (cuda and use_graphs and engine.method.graph_safe) else None
    return engine


class SplitEngine(Engine):
    """An engine whose layers are split over GPUs (made by split_engine)."""

    def layers(self, ids, phase, start, positions, graphed=False):
        return self.pipeline.layers(self, ids, phase, start, positions, graphed)
