"""CUDA-graph capture of the decode step of a model split over GPUs (runners/pipeline.py): one graph
per segment. Kept beside, not in, runners/graphs.py: the one-GPU capture is measured code of every
engine benchmark, and the split adds nothing to its path."""
from __future__ import annotations

import torch

from runners.graphs import DecodeGraph


class _Stages:
    """The segments' graphs replayed as one graph: each after the hand-off copies recorded before it."""

    def __init__(self, stages):
        self.stages = stages             # [(device, graph or None, copies before it)]

    def replay(self) -> None:
        for device, graph, copies in self.stages:
            with torch.cuda.device(device):
                for src, dst in copies:
                    dst.copy_(src, non_blocking=True)
                if graph is not None:
                    graph.replay()


class PipelineGraphs(DecodeGraph):
    """The decode step of a model split over GPUs (runners/pipeline.py): one CUDA graph per segment
    (a capture belongs to one device), captured in order; between two replays the hand-off copies
    recorded at capture (the hidden state, the method's step state) run as plain cross-device copies,
    which order the two GPUs' streams. DecodeGraph's own: the key (re-captured when a declared buffer
    moves) and the step (static inputs filled, the graph replayed: here the stages, `_Stages`)."""

    def _stream(self, device) -> torch.cuda.Stream:
        """A capture stream of `device` (torch.cuda.graph's default one is made once, on whichever GPU
        was current then: a capture for another GPU on it records nothing)."""
        streams = self.__dict__.setdefault("streams", {})
        if device not in streams:
            streams[device] = torch.cuda.Stream(device=device)
        return streams[device]

    def _capture(self, eng, token, key) -> None:
        p = eng.pipeline
        self.stages, self.graph = [], None  # free the previous graphs' pools first
        self.tok = token.view(-1).clone()
        self.pos = torch.full((1,), eng.seq_len, dtype=torch.long, device=eng.device)
        def warm():   # eager (Triton compilation, library handles), on every GPU
            for _ in range(2):
                eng.decode_logits(self.tok, self.pos, graphed=True)
            for i in range(torch.cuda.device_count()):
                torch.cuda.synchronize(i)

        self.warm_up(eng, warm)
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
        self.graph, self.key = _Stages(self.stages), key
