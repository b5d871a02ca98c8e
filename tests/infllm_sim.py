"""A plain-loop simulation of thunlp/InfLLM's ContextManager, the oracle of tests/test_methods_infllm.py
and (with its hooks `choose` and `on_block` replaced) of tests/test_methods_ltri.py:

- the remainder/init/blocks bookkeeping is append_global's literal loop (a token becomes a sink once the
  remainder exceeds n_local; a block forms while n_local tokens stay behind it), run after each chunk;
- each query attends ONE softmax over the union of its local window (keys at their real positions) and
  the memory (sinks, retrieved blocks, remainder), the memory keys placed at position p - d;
- a token's score is the joint-softmax probability it received as a local key, summed over queries
  (per query head), and `map` keeps each (query, local key) probability summed over heads."""
from __future__ import annotations

import torch


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
        self.map = [[{} for _ in range(B)] for _ in range(L)]    # (query, local key) -> probability, heads summed

    def rot(self, x, p):  # x [B, H, D] rotated to position p
        return self.rope.apply(x.unsqueeze(2), torch.tensor([p])).squeeze(2).double()

    def step(self, layer, a, T, q, K, V, phase="prefill"):
        """q [B, Hq, T, D]; K, V [B, Hkv, N, D] every key so far (un-rotated) -> out [B, T, Hq*D]."""
        c, info, B = self.c, self.info, self.B
        g, Hq, D = info.group, info.num_heads, info.head_dim
        n_local = c["n_local"]
        rem_st = self.rem_st[layer]
        grl = max(a - rem_st + T - n_local, 0)
        remainder = list(range(rem_st, rem_st + grl))
        nb = len(self.blocks[layer])
        units = info.num_kv_heads if c.get("per_head") else 1
        sel = self.choose(layer, a, T, q, K, nb, units, phase) if nb else None
        self.selected[layer] = sel
        out = self.attend(layer, a, T, q, K, V, sel, remainder, units)
        self.append_global(layer, a + T, K)
        return out

    def choose(self, layer, a, T, q, K, nb, units, phase):
        """InfLLM: every block while there are at most topk, else top-k of chunk-mean memory query . repr."""
        c, info, B = self.c, self.info, self.B
        g, Hq = info.group, info.num_heads
        if nb <= c["topk"]:
            return [[list(range(nb))] * units for _ in range(B)]
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
        return sel

    def attend(self, layer, a, T, q, K, V, sel, remainder, units):
        """One softmax per query over its local window and the memory; scores and the map recorded."""
        c, info, B = self.c, self.info, self.B
        g, Hq, D = info.group, info.num_heads, info.head_dim
        n_local = c["n_local"]
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
                            self.map[layer][b][p, j] = self.map[layer][b].get((p, j), 0.0) + pj
        return out.reshape(B, T, Hq * D)

    def on_block(self, layer, pos, K):
        """InfLLM's representative per query head: mean of the repr_topk keys with the highest score."""
        c, g = self.c, self.info.group
        sc = torch.stack([self.score[layer][j] for j in pos], -1)            # [B, Hq, bs]
        top = sc.topk(c["repr_topk"], -1).indices
        rep = torch.zeros(self.B, self.info.num_heads, self.info.head_dim, dtype=torch.float64)
        for b in range(self.B):
            for h in range(self.info.num_heads):
                rep[b, h] = torch.stack([K[b, h // g, pos[i]].double() for i in top[b, h]]).mean(0)
        self.reprs[layer].append(rep)

    def append_global(self, layer, E, K):
        c = self.c
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
            self.on_block(layer, pos, K)
            st += c["block_size"]
            length -= c["block_size"]
        self.rem_st[layer] = st
