"""InfLLM / Ltri-LLM's device path (methods/parts/infllm_device.py), every token in a positional store on
the device (offload=false) or in host memory with a step's memory staged on the device (offload=true):

- its parts against plain loops: the memory's token positions (sinks | retrieved blocks | remainder) and
  the device retrieval (selection.top_first's set);
- both attend what the host path (the evidence options: LRU cache, contiguous buffer) attends: same
  outputs up to float rounding, same retrievals, same representatives; offloaded and resident the same floats;
- the engine's CUDA-graph protocol (before_decode, the step run three times at one position as warm-up and
  capture, no Python in between, correction_span after) gives the eager path's logits, and a decode step run
  twice at one position leaves the buffers of running it once (decode_idempotent), on the CPU."""
from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf
from test_methods_common import Driver, make, one_thread, rope_for, tiny_model  # noqa: F401
from tiny_models import tiny

from methods import ModelInfo, build
from methods.parts.infllm_device import Geometry, memory_index, select_blocks
from methods.parts.selection import top_first
from runners.engine import Engine


def _plain_positions(a, T, ids, counts, n_init, n_local, bs):
    """Memory positions of one (sequence, unit) as the host path lays them out (blocks sorted)."""
    init_len = min(n_init, max(0, a - n_local))
    nb = max(0, a - n_local - n_init) // bs
    rem_start = init_len + nb * bs
    rem_len = max(a - rem_start + T - n_local, 0)
    out = list(range(init_len))
    for blk in sorted(ids[:counts]):
        out += list(range(n_init + blk * bs, n_init + (blk + 1) * bs))
    return out + list(range(rem_start, rem_start + rem_len))


@pytest.mark.parametrize("device_ints", [False, True])
def test_memory_index_equals_plain_layout(device_ints):
    g = torch.Generator().manual_seed(0)
    n_init, n_local, bs, topk, Hkv = 3, 7, 4, 3, 2
    for a in range(60):
        T = 1 if device_ints else int(torch.randint(1, 6, (1,), generator=g))
        nb = max(0, a - n_local - n_init) // bs
        k = min(nb, topk)
        ids = torch.zeros(2, 2, topk, dtype=torch.int32)
        for b in range(2):
            for u in range(2):
                ids[b, u, :k] = torch.randperm(max(nb, 1), generator=g)[:k].sort().values
        counts = torch.full((2, 2), k, dtype=torch.int32)
        first = torch.tensor([a]) if device_ints else a
        geo = Geometry.of(first, T, n_init, n_local, bs)
        width = n_init + topk * bs + bs + 5
        pos, n = memory_index(geo, ids, counts, n_init, bs, width, Hkv, 1000)
        for b in range(2):
            for u in range(2):
                want = _plain_positions(a, T, ids[b, u].tolist(), k, n_init, n_local, bs)
                assert int(n[b, u]) == len(want)
                assert sorted(pos[b, u, :len(want)].tolist()) == want, (a, T)


def test_select_blocks_equals_top_first_over_formed_blocks():
    g = torch.Generator().manual_seed(1)
    B, Hq, D, N = 2, 4, 8, 13
    reprs = torch.randn(B, N, Hq, D, generator=g)
    reprs[:, 5] = reprs[:, 2]                                             # an exact tie: the lower block wins
    qm = torch.randn(B, Hq, D, generator=g)
    for units in (1, 2):
        for nb in (0, 2, 3, 9, 13):
            ids, cnt = select_blocks(qm, reprs, nb, units, topk=3)
            s = torch.einsum("bhd,bnhd->bhn", qm, reprs[:, :nb]).unflatten(1, (units, -1)).sum(2)
            want = top_first(s, 3).sort(-1).values if nb else torch.zeros(B, units, 0, dtype=torch.long)
            assert cnt.tolist() == [[min(nb, 3)] * units] * B
            assert ids[..., :min(nb, 3)].tolist() == want.tolist(), (units, nb)


INFLLM = {"name": "infllm", "n_init": 3, "n_local": 6, "block_size": 4, "topk": 2, "repr_topk": 2,
          "exc_block_size": 5, "max_cached_block": 4}
LTRI = {"name": "ltri", "n_init": 3, "n_local": 6, "block_size": 4, "topk": 2, "exc_block_size": 5,
        "max_cached_block": 3, "spans_per_block": 2, "max_vectors": 5, "last_chunk": 3}


@pytest.mark.parametrize("cfg", [INFLLM, {**INFLLM, "per_head": True, "max_cached_block": 4},
                                 LTRI, {**LTRI, "persistent": False}])
def test_resident_attends_what_the_host_path_attends(cfg):
    model = tiny("llama")
    rope = rope_for(model)
    runs = []
    # the host path (evidence record with no needle set: nothing recorded, the host path's retrieval), the
    # device path with the store in host memory (offload=true, the default), the device path all on the device
    for extra, path in (({"offload": True, "evidence": "record"}, "host (LRU cache)"),
                        ({"offload": True}, "device, offloaded"), ({"offload": False}, "device, resident")):
        method, info = make({**cfg, **extra}, model)
        assert method.device_path is (path != "host (LRU cache)")
        d = Driver(method, info, rope, max_len=70, batch=2, seed=3)
        outs, sels = [], []
        for T, phase in [(5, "prefill")] * 6 + [(1, "decode")] * 18:
            _, o = d.step(T, phase)
            outs.append(torch.stack(o))
            sels.append([None if s is None else [[sorted(u) for u in per] for per in s] for s in method.selected])
        assert method.stats()["path"] == path
        runs.append((outs, sels, method))
    (o1, s1, m1) = runs[0]
    for o2, s2, m2 in runs[1:]:
        assert m2.formed_blocks == m1.formed_blocks >= 8
        for host, res in zip(s1, s2):   # the host path keeps None until a layer first retrieves
            assert [h for h in host if h is not None] == [r for h, r in zip(host, res) if h is not None]
        assert any(h is not None for host in s1 for h in host)
        for a, b in zip(o1, o2):
            assert (a - b).abs().max().item() <= 1e-5            # the memory's keys in another order: rounding
        if cfg["name"] == "infllm":
            n = m1.formed_blocks
            assert torch.allclose(m1.reprs[:, :, :n].float(), m2.reprs[:, :, :n], atol=1e-6)
    (o2, _, m2), (o3, _, m3) = runs[1:]
    assert all(torch.equal(a, b) for a, b in zip(o2, o3))    # staged rows, the same order: the same floats
    assert m2.stats()["block_loads"] > 0 and m2.stats()["host_bytes"] > 0 and m3.stats()["host_bytes"] == 0


def _graph_protocol(eng, token):
    """Engine.decode as runners/graphs.DecodeGraph runs it, on the CPU: the host hook, the step three times
    at one position (two warm-ups and the capture), seq_len moved on, the host hook after the step."""
    m = eng.method
    m.before_decode(eng.seq_len)
    pos = torch.tensor([eng.seq_len])
    for _ in range(3):
        logits = eng.decode_logits(token, pos, graphed=True)
    eng.seq_len += 1
    assert m.correction_span(eng.seq_len) is None
    return logits


@pytest.mark.parametrize("offload", [False, True])
@pytest.mark.parametrize("cfg", [INFLLM, {**INFLLM, "per_head": True}, LTRI])
def test_graph_protocol_equals_eager_decode(cfg, offload):
    model = tiny_model(4)
    info = ModelInfo.from_hf_config(model.config)
    cfg = {**cfg, "offload": offload}
    ids = torch.randint(0, 128, (2, 70), generator=torch.Generator().manual_seed(5))
    got = []
    for graphed in (False, True):
        method = build(OmegaConf.create(cfg), info)
        assert method.graph_safe and method.decode_idempotent
        eng = Engine(model, method)
        eng.reset(2, 70)
        with torch.inference_mode():
            out = [eng.prefill(ids[:, :23])]
            for t in range(23, 70):
                out.append(_graph_protocol(eng, ids[:, t]) if graphed else eng.decode(ids[:, t]))
        got.append((torch.stack(out, 1), method.formed_blocks, method.reprs if cfg["name"] == "infllm" else None))
    (a, fa, ra), (b, fb, rb) = got
    assert fa == fb >= 10
    assert (a - b).abs().max().item() <= 1e-5
    if ra is not None:
        assert torch.equal(ra[:, :, :fa], rb[:, :, :fa])


@pytest.mark.parametrize("offload", [False, True])
@pytest.mark.parametrize("cfg", [INFLLM, LTRI])
def test_device_path_decode_step_is_idempotent_at_a_position(cfg, offload):
    model = tiny_model(4)
    method = build(OmegaConf.create({**cfg, "offload": offload}), ModelInfo.from_hf_config(model.config))
    eng = Engine(model, method)
    ids = torch.randint(0, 128, (2, 40), generator=torch.Generator().manual_seed(6))
    eng.reset(2, 40)
    with torch.inference_mode():
        eng.prefill(ids[:, :30])
        eng.decode(ids[:, 30])                  # leaves a pending mass for the next step to fold
        states = []
        for _ in range(2):
            eng.decode_logits(ids[:, 31], torch.tensor([31]))
            states.append({k: t.clone() for k, t in method.buffers().items() if t is not None})
    for key in states[0]:
        assert torch.equal(states[0][key].nan_to_num(0), states[1][key].nan_to_num(0)), key
