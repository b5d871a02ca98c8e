"""methods/parts/infllm_stage.py: InfLLM's buffer reuse on the device against the host path's own
(infllm_host.HostPath._arrange, as a plain loop): which slot each retrieved block takes, that only blocks new
to a slot are gathered from the store (a repeated retrieval moves nothing), that the buffer's columns the
decode reads hold exactly [sinks | retrieved blocks in block order | remainder] of the store and the ring,
and that an offloaded Ltri-LLM (persistent decode) moves no block in decode after its first step."""
from __future__ import annotations

import torch
from omegaconf import OmegaConf
from test_methods_common import tiny_model

from methods import ModelInfo, build
from methods.parts.infllm_device import Geometry, PositionalStore
from methods.parts.infllm_stage import SlotStage
from runners.engine import Engine

N_INIT, BS, K, D, H, RING = 2, 3, 3, 4, 2, 16


def _arrange(held, blocks):
    """HostPath._arrange's slot choice: a held block stays; a new one takes the first unwanted slot."""
    want, moved = set(blocks), 0
    for blk in sorted(want):
        if blk in held:
            continue
        j = next(i for i, h in enumerate(held) if h is None or h not in want)
        held[j] = blk
        moved += 1
    return moved


def test_slots_follow_infllm_arrange_and_only_new_blocks_move():
    g = torch.Generator().manual_seed(0)
    cap = 200
    store = PositionalStore()
    store.allocate(1, 1, H, cap, D, "cpu", torch.float32)
    store.k.copy_(torch.randn(store.k.shape, generator=g))
    store.v.copy_(torch.randn(store.v.shape, generator=g))
    ring_k, ring_v = torch.randn(1, H, RING, D, generator=g), torch.randn(1, H, RING, D, generator=g)
    st = SlotStage()
    st.allocate(1, 1, H, 1, N_INIT, K, BS, N_INIT + K * BS + BS + 4, D, "cpu", torch.float32)
    st.k[0, 0, :, :N_INIT] = store.k[0, 0, :, :N_INIT]            # the sinks, as write_sinks leaves them
    st.v[0, 0, :, :N_INIT] = store.v[0, 0, :, :N_INIT]
    held, moved = [None] * K, 0
    a = 150
    for sel in ([4, 9], [1, 4, 9], [1, 4, 9], [2, 7, 9], [0, 3, 5], [3, 5], [3, 5, 8], [3, 5, 8]):
        geo = Geometry.of(torch.tensor([a]), 1, N_INIT, 100, BS)
        ids = torch.zeros(1, 1, K, dtype=torch.int32)
        ids[0, 0, :len(sel)] = torch.tensor(sel, dtype=torch.int32)
        counts = torch.tensor([[len(sel)]], dtype=torch.int32)
        width = N_INIT + K * BS + BS
        idx, n = st.decode(0, store, ring_k, ring_v, ids, counts, geo, RING, st.layout(geo, width, "cpu"))
        moved += _arrange(held, sel)
        assert st.tags[0, 0, 0].tolist() == [-1 if h is None else h for h in held]
        assert int(st.moved) == moved
        # what the decode reads: sinks, the blocks in block order, the remainder (from the ring)
        init_len, rem_start, rem_len = int(geo.init_len), int(geo.rem_start), int(geo.rem_len)
        want = list(range(init_len)) + [N_INIT + b * BS + t for b in sel for t in range(BS)]
        assert int(n[0, 0]) == len(want) + rem_len
        cols = idx[0, :, :int(n[0, 0])].long()
        for h in range(H):
            got_k = st.k[0, 0, h, cols[h]]
            assert torch.equal(got_k[:len(want)], store.k[0, 0, h, want])
            ring_rows = [(rem_start + i) % RING for i in range(rem_len)]
            assert torch.equal(got_k[len(want):], ring_k[0, h, ring_rows])
            assert torch.equal(st.v[0, 0, h, cols[h]][:len(want)], store.v[0, 0, h, want])
        a += 1


def test_offloaded_ltri_persistent_decode_moves_no_block_after_its_first_step():
    model = tiny_model(4)
    cfg = {"name": "ltri", "n_init": 3, "n_local": 6, "block_size": 4, "topk": 2, "exc_block_size": 5,
           "spans_per_block": 2, "max_vectors": 5, "last_chunk": 3, "offload": True}
    method = build(OmegaConf.create(cfg), ModelInfo.from_hf_config(model.config))
    assert method.offloaded and method.graph_safe
    eng = Engine(model, method)
    ids = torch.randint(0, 128, (2, 60), generator=torch.Generator().manual_seed(7))
    eng.reset(2, 60)
    with torch.inference_mode():
        eng.prefill(ids[:, :40])
        eng.decode(ids[:, 40])
        first = int(method.stage.moved)
        for t in range(41, 60):
            eng.decode(ids[:, t])
    assert int(method.stage.moved) == first     # the prefill's slots hold the persisted retrieval already
    assert method.stats()["staged_bytes"] > 0 and method.stats()["path"] == "device, offloaded"
