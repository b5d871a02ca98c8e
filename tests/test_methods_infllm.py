"""InfLLM oracle: on random q, k, v (Driver) the method's outputs, retrieved blocks and block
representatives equal a plain-loop simulation of thunlp/InfLLM's ContextManager:

- the remainder/init/blocks bookkeeping is append_global's literal loop (a token becomes a sink once the
  remainder exceeds n_local; a block forms while n_local tokens stay behind it), run after each chunk;
- each query attends ONE softmax over the union of its local window (keys at their real positions) and
  the memory (sinks, retrieved blocks, remainder), the memory keys placed at position p - d: the
  fixed distance stated the other way round from the method's (query rotated by d, keys un-rotated),
  so the test checks the distance, not a shared formula, and that the two-part merge equals the union;
- a token's score is the joint-softmax probability it received as a local key, summed over queries;
  a block's representative per query head is the mean of its repr_topk best keys;
- retrieval = top-k of (chunk-mean memory query . representative) summed over heads (or per KV group).
Plus the LRU cache mechanics of BlockMemory (which blocks are resident, eviction order, transfers)."""
from __future__ import annotations

import pytest
import torch
from test_methods_common import Driver, make, one_thread, rope_for  # noqa: F401
from tiny_models import tiny

from methods.stores_blocks import BlockMemory


class Sim:
    def __init__(self, cfg, info, rope, B):
        self.c, self.info, self.rope, self.B = cfg, info, rope, B
        self.dist = cfg["n_local"] - 1 if cfg.get("memory_distance") is None else cfg["memory_distance"]
        L = info.num_layers
        self.init = [[] for _ in range(L)]
        self.blocks = [[] for _ in range(L)]         # positions of each block
        self.rem_st = [0] * L
        self.score = [{} for _ in range(L)]          # position -> [B, Hq] fp64
        self.reprs = [[] for _ in range(L)]          # per block [B, Hq, D]
        self.selected = [None] * L

    def rot(self, x, p):  # x [B, H, D] rotated to position p
        return self.rope.apply(x.unsqueeze(2), torch.tensor([p])).squeeze(2).double()

    def step(self, layer, a, T, q, K, V):
        """q [B, Hq, T, D]; K, V [B, Hkv, N, D] every key so far (un-rotated) -> out [B, T, Hq*D]."""
        c, info, B = self.c, self.info, self.B
        g, Hq, D = info.group, info.num_heads, info.head_dim
        n_local, bs = c["n_local"], c["block_size"]
        rem_st = self.rem_st[layer]
        grl = max(a - rem_st + T - n_local, 0)
        remainder = list(range(rem_st, rem_st + grl))
        # retrieval: one per chunk, memory query = q rotated by d, mean over the chunk
        nb = len(self.blocks[layer])
        units = info.num_kv_heads if c.get("per_head") else 1
        if nb and nb <= c["topk"]:
            sel = [[list(range(nb))] * units for _ in range(B)]
        elif nb:
            qm = torch.stack([self.rope.apply(q[:, :, t:t + 1], torch.tensor([self.dist]))[:, :, 0] for t in range(T)],
                             2).double().mean(2)
            sel = []
            for b in range(B):
                per = []
                for u in range(units):
                    heads = range(Hq) if units == 1 else range(u * g, (u + 1) * g)
                    s = [sum(float(qm[b, h] @ self.reprs[layer][i][b, h].double()) for h in heads) for i in range(nb)]
                    per.append(sorted(sorted(range(nb), key=lambda i: -s[i])[:c["topk"]]))
                sel.append(per)
        else:
            sel = None
        self.selected[layer] = sel
        out = torch.zeros(B, T, Hq, D, dtype=torch.float64)
        for t in range(T):
            p = a + t
            local = list(range(max(0, p - n_local + 1), p + 1))
            for b in range(B):
                for h in range(Hq):
                    kvh, u = h // g, (h // g if units > 1 else 0)
                    mem = list(self.init[layer])
                    if sel is not None:
                        for i in sel[b][u]:
                            mem += self.blocks[layer][i]
                    rem = [j for j in remainder if c.get("remainder_visibility") != "query" or p - j >= n_local]
                    qv = self.rot(q[b:b + 1, h:h + 1, t], p)[0, 0]
                    logits, vals, who = [], [], []
                    for j in local:
                        logits.append(float(qv @ self.rot(K[b:b + 1, kvh:kvh + 1, j], j)[0, 0]))
                        vals.append(V[b, kvh, j].double())
                        who.append(j)
                    for j in mem + rem:
                        logits.append(float(qv @ self.rot(K[b:b + 1, kvh:kvh + 1, j], p - self.dist)[0, 0]))
                        vals.append(V[b, kvh, j].double())
                        who.append(None)
                    pr = torch.softmax(torch.tensor(logits, dtype=torch.float64) * info.scaling, 0)
                    out[b, t, h] = (pr.unsqueeze(-1) * torch.stack(vals)).sum(0)
                    for j, pj in zip(who, pr.tolist()):
                        if j is not None:
                            self.score[layer].setdefault(j, torch.zeros(B, Hq, dtype=torch.float64))[b, h] += pj
        self.append_global(layer, a + T, K)
        return out.reshape(B, T, Hq * D)

    def append_global(self, layer, E, K):
        c, g = self.c, self.info.group
        st = self.rem_st[layer]
        length = E - st
        init = self.init[layer]
        if len(init) < c["n_init"] and length > c["n_local"]:
            add = min(c["n_init"] - len(init), length - c["n_local"])
            init += list(range(st, st + add))
            st += add
            length -= add
        while length - c["block_size"] >= c["n_local"]:
            pos = list(range(st, st + c["block_size"]))
            self.blocks[layer].append(pos)
            sc = torch.stack([self.score[layer][j] for j in pos], -1)            # [B, Hq, bs]
            top = sc.topk(c["repr_topk"], -1).indices
            rep = torch.zeros(self.B, self.info.num_heads, self.info.head_dim, dtype=torch.float64)
            for b in range(self.B):
                for h in range(self.info.num_heads):
                    rep[b, h] = torch.stack([K[b, h // g, pos[i]].double() for i in top[b, h]]).mean(0)
            self.reprs[layer].append(rep)
            st += c["block_size"]
            length -= c["block_size"]
        self.rem_st[layer] = st


BASE = {"name": "infllm", "n_init": 3, "n_local": 6, "block_size": 4, "topk": 2, "repr_topk": 2,
        "exc_block_size": 5, "max_cached_block": 3}


@pytest.mark.parametrize("extra", [
    {},
    {"per_head": True, "max_cached_block": 4, "remainder_visibility": "query"},
    {"offload": False, "memory_distance": 9, "n_init": 0},
    {"topk": 1, "repr_topk": 4, "max_cached_block": 1, "remainder_visibility": "query"},
])
def test_outputs_retrieval_and_representatives_match_simulation(extra):
    cfg = {**BASE, **extra}
    model = tiny("llama")
    rope = rope_for(model)
    method, info = make(cfg, model)
    d = Driver(method, info, rope, max_len=60, batch=2, seed=1)
    sim = Sim(cfg, info, rope, d.B)
    steps = [(5, "prefill")] * 5 + [(3, "prefill")] + [(1, "decode")] * 14
    saw_retrieval = saw_memory = False
    for T, phase in steps:
        a = d.seen
        qs, outs = d.step(T, phase)
        for layer in range(info.num_layers):
            want = sim.step(layer, a, T, qs[layer], d.k[layer], d.v[layer])
            assert (outs[layer].double() - want).abs().max().item() <= 1e-5, (a, phase, layer)
            sel = sim.selected[layer]
            if sel is not None:
                saw_memory = True
                got = [[sorted(u) for u in per] for per in method.selected[layer]]
                assert got == sel, (a, layer)
                saw_retrieval |= len(sim.blocks[layer]) > cfg["topk"]
            for i, rep in enumerate(sim.reprs[layer]):
                assert (method.reprs[layer, :, i].double() - rep).abs().max().item() <= 1e-5, (a, layer, i)
    assert saw_memory and saw_retrieval          # the run really went through a top-k retrieval
    assert method.formed_blocks == len(sim.blocks[0]) >= 5


def test_block_memory_lru_residency_and_transfers():
    m = BlockMemory()
    m.allocate(1, 1, 1, 2, 4, 10, offload=True, budget=3, device="cpu", dtype=torch.float32)
    for i in range(6):
        m.put(0, i, torch.full((1, 1, 2, 4), float(i)), torch.full((1, 1, 2, 4), -float(i)))
    assert m.stores == 6 and m.transfers == 0 and m.resident(0, 0) == []
    slots = m.ensure(0, 0, [4, 1])
    assert m.transfers == 2 and m.resident(0, 0) == [4, 1]        # same stamp: first-cached order
    assert (m.cache_k[0, 0, slots[4]] == 4).all() and (m.cache_v[0, 0, slots[1]] == -1).all()
    m.ensure(0, 0, [2])
    assert m.transfers == 3 and m.resident(0, 0) == [4, 1, 2]
    m.ensure(0, 0, [1, 5])            # 1 is a hit (re-stamped), 5 evicts the LRU block, 4
    assert m.transfers == 4 and m.resident(0, 0) == [2, 1, 5]
    slots = m.ensure(0, 0, [4, 2, 1])  # 4 again: loaded back from the host tier, evicting 5
    assert m.transfers == 5 and sorted(m.resident(0, 0)) == [1, 2, 4]
    assert (m.cache_k[0, 0, slots[4]] == 4).all() and (m.cache_k[0, 0, slots[2]] == 2).all()
    with pytest.raises(RuntimeError, match="device cache holds 3"):
        m.ensure(0, 0, [0, 3, 5, 1])
    # no offload: every block device-resident, nothing transferred
    m.allocate(1, 1, 1, 2, 4, 10, offload=False, budget=3, device="cpu", dtype=torch.float32)
    m.put(0, 0, torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2, 4))
    assert m.ensure(0, 0, [0]) == {0: 0} and m.transfers == 0 and m.host_k
