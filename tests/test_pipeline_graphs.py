"""runners/pipeline_graphs.py on DecodeGraph's step (key, static inputs, replay): the segments' graphs
and hand-off copies replay in capture order, and a capture happens only when the key changes. No GPU:
stand-in graphs on device index -1 (torch.cuda.device(-1) is a no-op); the real capture is
tests/test_multigpu.py's (2 GPUs)."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from runners.pipeline_graphs import PipelineGraphs, _Stages


class Graph:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def replay(self):
        self.log.append(self.name)


class Stub(PipelineGraphs):
    def _capture(self, eng, token, key):
        self.captures = getattr(self, "captures", 0) + 1
        self.tok = token.view(-1).clone()
        self.pos = torch.zeros(1, dtype=torch.long)
        self.logits = torch.zeros(1, 4)
        self.hand = (torch.ones(2), torch.zeros(2))
        log = self.log
        self.stages = [(-1, Graph("segment 0", log), []), (-1, Graph("segment 1", log), [self.hand]),
                       (-1, None, [(self.logits.new_full((1, 4), 7.0), self.logits)])]
        self.graph, self.key = _Stages(self.stages), key


class Engine(SimpleNamespace):
    """weakref-able (DecodeGraph holds its engine weakly)."""


def test_stages_replay_in_order_through_decode_graphs_step():
    buf = torch.zeros(3)
    eng = Engine(method=SimpleNamespace(buffers=lambda: {"x": buf}), capacity=8,
                          history=torch.zeros(1), seq_len=5)
    g = Stub(eng)
    g.log = []
    out = g.step(torch.tensor([3]))
    assert g.log == ["segment 0", "segment 1"] and g.captures == 1
    assert torch.equal(g.hand[1], torch.ones(2)) and g.pos.item() == 5 and g.tok.item() == 3
    assert torch.equal(out, torch.full((1, 4), 7.0))        # the last stage's copies ran before the read
    eng.seq_len = 6
    g.step(torch.tensor([4]))
    assert g.captures == 1 and g.pos.item() == 6 and g.tok.item() == 4   # same key: replayed, not captured
    eng.capacity = 16
    g.step(torch.tensor([4]))
    assert g.captures == 2                                   # the key moved: captured again
