"""CUDA-graph capture of the engine's decode step.

A decode step is ~1500 small kernels for an 8B model; launched one by one from Python they cost
more host time than the GPU needs (measured on the H100: 27 ms of GPU work behind 80 ms of host
time per token at 8K). Captured once and replayed, the step costs one launch. Inputs (token ids,
position) live in static device buffers filled before each replay.

A graph replays raw pointers: it is captured again whenever the batch, the capacity, the history
buffer or any tensor the method declares in `buffers()` has moved.
"""
from __future__ import annotations

import weakref

import torch


class DecodeGraph:
    def __init__(self, engine):
        self._engine = weakref.ref(engine)  # no reference cycle: an engine is freed when dropped
        self.key = None
        self.graph = None

    def key_of(self, engine, token: torch.Tensor) -> tuple:
        buffers = tuple((name, t.data_ptr()) for name, t in engine.method.buffers().items() if t is not None)
        return (token.numel(), engine.capacity, buffers, engine.history.data_ptr())

    @torch.inference_mode()
    def step(self, token: torch.Tensor) -> torch.Tensor:
        """Logits [B, V] of one decode step at the engine's current position (seq_len unchanged)."""
        eng = self._engine()
        key = self.key_of(eng, token)
        if self.key != key:
            self._capture(eng, token, key)
        self.tok.copy_(token.view(-1))
        self.pos.fill_(eng.seq_len)
        self.graph.replay()
        return self.logits.clone()  # the static buffer is overwritten by the next replay

    def _capture(self, eng, token: torch.Tensor, key) -> None:
        self.graph = None  # free the previous graph's pool first
        self.tok = token.view(-1).clone()
        self.pos = torch.full((1,), eng.seq_len, dtype=torch.long, device=eng.device)
        # Warm-up on a side stream (library handles, Triton compilation) runs the step for real:
        # harmless for a method whose step is idempotent at a position, otherwise its declared
        # buffers are saved first and restored after (scores would double, tokens be evicted).
        saved = {} if eng.method.decode_idempotent else {
            name: t.clone() for name, t in eng.method.buffers().items() if t is not None}
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                eng.decode_logits(self.tok, self.pos, graphed=True)
        torch.cuda.current_stream().wait_stream(side)
        for name, t in eng.method.buffers().items():
            if name in saved:
                t.copy_(saved[name])
        del saved
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.logits = eng.decode_logits(self.tok, self.pos, graphed=True)
        self.graph, self.key = graph, key


class PipelineGraphs:
    """The decode step of a model split over GPUs (runners/pipeline.py): one CUDA graph per segment
    (a capture belongs to one device), captured in order; between two replays the hand-off copies
    recorded at capture (the hidden state, the method's step state) run as plain cross-device copies,
    which order the two GPUs' streams. Re-captured, like DecodeGraph, when a declared buffer moves."""

    def __init__(self, engine):
        self._engine = weakref.ref(engine)
        self.key = None
        self.stages = []     # [(device, graph, copies before it)]

    def key_of(self, engine, token):
        return DecodeGraph.key_of(self, engine, token)

    @torch.inference_mode()
    def step(self, token: torch.Tensor) -> torch.Tensor:
        eng = self._engine()
        key = self.key_of(eng, token)
        if self.key != key:
            self._capture(eng, token, key)
        self.tok.copy_(token.view(-1))
        self.pos.fill_(eng.seq_len)
        for device, graph, copies in self.stages:
            with torch.cuda.device(device):
                for src, dst in copies:
                    dst.copy_(src, non_blocking=True)
                if graph is not None:
                    graph.replay()
        return self.logits.clone()

    def _stream(self, device) -> torch.cuda.Stream:
        """A capture stream of `device` (torch.cuda.graph's default one is made once, on whichever GPU
        was current then: a capture for another GPU on it records nothing)."""
        streams = self.__dict__.setdefault("streams", {})
        if device not in streams:
            streams[device] = torch.cuda.Stream(device=device)
        return streams[device]

    def _capture(self, eng, token, key) -> None:
        p = eng.pipeline
        self.stages, self.graph = [], None
        self.tok = token.view(-1).clone()
        self.pos = torch.full((1,), eng.seq_len, dtype=torch.long, device=eng.device)
        saved = {} if eng.method.decode_idempotent else {
            name: t.clone() for name, t in eng.method.buffers().items() if t is not None}
        for _ in range(2):   # warm-up, eager (Triton compilation, library handles), on every GPU
            eng.decode_logits(self.tok, self.pos, graphed=True)
        for i in range(torch.cuda.device_count()):
            torch.cuda.synchronize(i)
        for name, t in eng.method.buffers().items():
            if name in saved:
                t.copy_(saved[name])
        del saved
        ids = self.tok.view(-1, 1)
        p.goto(0)
        log, first = [], p.segments[0].device
        g = torch.cuda.CUDAGraph()
        with torch.cuda.device(first), torch.cuda.graph(g, stream=self._stream(first)):
            h, mlp = p.first(eng, ids, "decode", eng.seq_len, self.pos, graphed=True)
            h, mlp = p.segment(eng, 0, h, mlp)
        self.stages.append((first, g, log))
        for k in range(1, len(p.segments)):
            dev = p.segments[k].device
            log = []
            p.goto(k, log)
            h_in, mlp_in = h.to(dev), mlp.to(dev)         # static inputs of this segment's graph
            log += [(h, h_in), (mlp, mlp_in)]
            g = torch.cuda.CUDAGraph()
            with torch.cuda.device(dev), torch.cuda.graph(g, stream=self._stream(dev)):
                h, mlp = p.segment(eng, k, h_in, mlp_in)
            self.stages.append((dev, g, log))
        h_head = h.to(first)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.device(first), torch.cuda.graph(g, stream=self._stream(first)):
            self.logits = eng.lm_head(eng.norm(h_head[:, -1])).float()
        self.stages.append((first, g, [(h, h_head)]))
        back = []
        p.goto(0, back)                                   # state that outlives the step goes home
        self.stages.append((first, None, back))
        self.key = key
