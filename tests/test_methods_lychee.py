"""LycheeDecode oracle: on random q, k, v, brute force (written from the reference's mask functions,
independent of the method and the kernels) of what every head must attend in every decode step:
retrieval KV heads attend everything and select from q̄·K (group-averaged query, unscaled, whole
cache); sparse KV heads attend exactly the set most recently written for their KV-head index by an
EARLIER layer of the same step. K accounting: sinks and recent tokens are inside the budget."""
from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf
from test_methods_common import Driver, masked_attention, one_thread, rope_for  # noqa: F401
from tiny_models import tiny
from triton_env import needs_triton

from common.errors import ConfigError
from methods import ModelInfo, build
from methods.lychee import REFERENCE_SCALE

INFO = ModelInfo(arch="llama", num_layers=6, num_heads=4, num_kv_heads=2, head_dim=16, hidden_size=64,
                 max_position=512)
# kv1 of layer 1 reads layer 0's set; kv0 of layer 2 reads layer 1's; layer 3 (all sparse) reads
# kv0 from layer 1 and kv1 from layer 2 (not the previous layer for kv0); layer 4 kv0 still layer 1's.
HEADS = "inline:11/10/01/00/01/11"
ROLES = [[c == "1" for c in row] for row in HEADS[len("inline:"):].split("/")]


def ref_topk_mask(x: torch.Tensor, topk: int, sink: int, recent: int) -> torch.Tensor:
    """utils.py get_sparse_attn_mask_from_topk, restated for one row x [L]."""
    L = x.shape[-1]
    topk = min(topk, L)
    mask = torch.zeros(L, dtype=torch.bool)
    mask[:sink] = True
    if recent > 0:
        mask[-recent:] = True
    if topk - recent - sink <= 0:
        return mask
    rest = x.masked_fill(mask, float("-inf"))
    mask[rest.topk(topk - recent - sink).indices] = True
    return mask


def ref_mask(cfg: dict, x: torch.Tensor) -> torch.Tensor:
    mode = cfg.get("mode", "topk")
    if cfg.get("block_size", 1) > 1:   # block-level path: top budget/B blocks by max-pooled score
        bs, L = cfg["block_size"], x.shape[-1]
        pooled = torch.nn.functional.pad(x, (0, (-L) % bs), value=float("-inf")).view(-1, bs).amax(-1)
        blocks = pooled.topk(min(cfg["budget"] // bs, pooled.numel())).indices
        return (torch.arange(L) // bs).unsqueeze(-1).eq(blocks).any(-1)
    if mode == "topk":
        return ref_topk_mask(x, cfg["budget"], cfg["sink"], cfg["recent"])
    if mode == "ratio":
        return ref_topk_mask(x, int((1 - cfg["ratio"]) * x.shape[-1]), cfg["sink"], cfg["recent"])
    scale = REFERENCE_SCALE if cfg.get("prob_scale", "reference") == "reference" else INFO.scaling
    p = torch.softmax(x.double() * scale, -1)
    if mode == "threshold":
        return p > cfg["threshold"]
    srt, order = p.sort(descending=True)
    keep = (srt.cumsum(-1) - srt) <= cfg["top_p"]
    return torch.zeros_like(keep).scatter_(-1, order, keep)


CASES = [
    {"budget": 14, "sink": 3, "recent": 5},              # forced 8 + 6 chosen
    {"budget": 6, "sink": 3, "recent": 5},               # budget <= sinks + recent: only those (8 > 6)
    {"budget": 100, "sink": 3, "recent": 5},             # budget >= context: everything
    {"mode": "ratio", "ratio": 0.7, "sink": 2, "recent": 3},
    {"mode": "topp", "top_p": 0.5, "sink": 128, "recent": 256},
    {"mode": "threshold", "threshold": 0.02, "prob_scale": "model", "sink": 128, "recent": 256},
    {"block_size": 4, "budget": 12, "sink": 3, "recent": 5},   # 3 blocks, nothing forced
]


@pytest.mark.parametrize("cfg", CASES)
def test_sets_and_reuse_rule_by_brute_force(cfg):
    check_sets_and_reuse(cfg)


@needs_triton
@pytest.mark.parametrize("cfg", [CASES[0], CASES[1], CASES[6]])
@pytest.mark.parametrize("radix_max", [None, 8])
def test_sets_and_reuse_rule_on_the_kernels(cfg, radix_max, monkeypatch):
    """The same oracle on the Triton path (interpreter): the attention kernel writes the forced slots'
    +inf (score_force), the radix top-k (or, past radix_max, torch.topk) selects; same sets."""
    from methods.parts import lychee_sets

    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    if radix_max is not None:
        monkeypatch.setattr(lychee_sets, "RADIX_MAX", radix_max)
    check_sets_and_reuse(cfg)


def check_sets_and_reuse(cfg):
    rope = rope_for(tiny("llama"))
    method = build(OmegaConf.create({"name": "lychee", "heads": HEADS, **cfg}), INFO)
    d = Driver(method, INFO, rope, max_len=40)
    d.step(29, "prefill")
    g = INFO.group
    for _ in range(3):
        qs, outs = d.step(1, "decode")
        L = d.seen
        sets: dict[int, torch.Tensor] = {}          # kv head -> [B, L] bool, latest earlier writer
        writers: dict[int, int] = {}
        for layer in range(INFO.num_layers):
            k = rope.apply(d.k[layer], torch.arange(L))
            q = rope.apply(qs[layer], torch.tensor([L - 1]))
            want = torch.empty(d.B, INFO.num_heads, 1, L, dtype=torch.bool)
            for h in range(INFO.num_heads):
                kv = h // g
                want[:, h, 0] = True if ROLES[layer][kv] else sets[kv]
            ref = masked_attention(q, k, d.v[layer], want, INFO.scaling)
            assert (outs[layer] - ref).abs().max().item() <= 1e-5, (L, layer)
            expected_attended = []
            for kv in range(INFO.num_kv_heads):
                bs = cfg.get("block_size", 1)
                if ROLES[layer][kv]:
                    expected_attended.append(L)
                elif bs == 1:
                    expected_attended.append(sets[kv].sum(-1).float())
                else:  # stats count whole blocks (a partial last block as full), capped at the length
                    n_blocks = torch.tensor([len((torch.nonzero(m).flatten() // bs).unique()) for m in sets[kv]])
                    expected_attended.append(torch.clamp(n_blocks * bs, max=L).float())
            if layer == INFO.num_layers - 1:
                final = dict(sets)                  # the last layer writes no sets: none would read them
            for kv in range(INFO.num_kv_heads):     # this layer's writes, visible to later layers only
                if ROLES[layer][kv]:
                    qbar = q[:, kv * g:(kv + 1) * g, 0].mean(1)                 # [B, D]
                    s = torch.einsum("bd,bld->bl", qbar, k[:, kv])             # unscaled, whole cache
                    sets[kv] = torch.stack([ref_mask(cfg, s[b]) for b in range(d.B)])
                    writers[kv] = layer
            att = torch.stack([torch.as_tensor(a, dtype=torch.float32).expand(d.B) for a in expected_attended], 1)
            assert abs(method.stats()["attended_per_layer"][layer] - att.mean().item()) < 1e-4
        # the step's final sets: index/counts rows equal the brute-force masks, K accounting included
        bs = cfg.get("block_size", 1)
        for kv in range(INFO.num_kv_heads):
            for b in range(d.B):
                n = int(method.counts[b, kv])
                got = sorted(method.index[b, kv, :n].tolist())
                want = torch.nonzero(final[kv][b]).flatten()
                assert got == (want // bs).unique().tolist(), (L, kv, b)
        if cfg.get("mode", "topk") == "topk" and bs == 1:
            expect = min(max(cfg["budget"], cfg["sink"] + cfg["recent"]), L)
            assert (method.counts == expect).all()


def test_sparse_output_differs_from_dense():
    """The reuse really restricts attention (a guard against a test that cannot fail)."""
    rope = rope_for(tiny("llama"))
    method = build(OmegaConf.create({"name": "lychee", "heads": HEADS, "budget": 10, "sink": 2, "recent": 3}), INFO)
    d = Driver(method, INFO, rope, max_len=40)
    d.step(29, "prefill")
    qs, outs = d.step(1, "decode")
    L = d.seen
    k = rope.apply(d.k[3], torch.arange(L))
    q = rope.apply(qs[3], torch.tensor([L - 1]))
    full = masked_attention(q, k, d.v[3], torch.ones(d.B, 4, 1, L, dtype=torch.bool), INFO.scaling)
    assert (outs[3] - full).abs().max().item() > 1e-3
    assert method.stats()["attended_per_layer"][3] == 10


@pytest.mark.parametrize("heads,needle", [
    ("inline:01/11/11/11/11/11", "layer 0 must be all retrieval"),
    ("inline:11/11", "holds 2 layers x 2 KV heads"),
    ("inline:1x/11/11/11/11/11", "0/1 digits"),
    ("random:a", "random:<seed>"),
    ("random:0:99", "n must lie in [0, 10]"),
    ("no/such/file.json", "no such head file"),
])
def test_bad_head_specs_refused_in_one_line(heads, needle):
    with pytest.raises(ConfigError) as e:
        build(OmegaConf.create({"name": "lychee", "heads": heads}), INFO)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_missing_head_file_names_the_training_command():
    with pytest.raises(ConfigError) as e:
        build(OmegaConf.create({"name": "lychee", "head_model": "no_such_model"}), INFO)
    msg = str(e.value)
    assert "methods/heads/no_such_model-passkey-hardkuma.json" in msg and "offline.train_heads" in msg
    assert "\n" not in msg
    with pytest.raises(ConfigError, match="method.head_model"):
        build(OmegaConf.create({"name": "lychee"}), INFO)   # outside a composed config: no model name
    from methods import REGISTRY
    with pytest.raises(ConfigError, match="method.head_model"):  # the defaults as data resolve, to null
        build(OmegaConf.create({"name": "lychee", **REGISTRY.get("lychee").Config.defaults()}), INFO)


def test_random_heads_count_and_layer0():
    method = build(OmegaConf.create({"name": "lychee", "heads": "random:3:4"}), INFO)
    hs = method.cfg.head_set(INFO)
    assert all(hs.roles[0]) and sum(map(sum, hs.roles[1:])) == 4
    assert hs.roles == build(OmegaConf.create({"name": "lychee", "heads": "random:3:4"}), INFO).cfg.head_set(INFO).roles


@needs_triton
@pytest.mark.parametrize("S,budget,sink,recent", [(600, 150, 4, 20), (900, 100, 8, 16), (600, 20, 8, 16)])
def test_token_topk_two_stage_is_the_reference_set(S, budget, sink, recent, monkeypatch):
    """lychee_sets.topk on the radix kernel with its token_chunks split (two stages where they fit), the scores
    boosted as the attention kernel leaves them, is the reference's set (torch path, unboosted scores)."""
    from kernels.hybrid import force_scores_ref
    from kernels.topk import chunk_plan
    from methods.parts import lychee_sets

    g = torch.Generator().manual_seed(S + budget)
    lengths = torch.tensor([S, S - 123], dtype=torch.int32)
    scores = torch.randn(2, 3, S, generator=g)
    scores = scores.masked_fill(torch.arange(S) >= lengths.view(2, 1, 1), float("-inf"))
    k = min(max(budget, sink + recent), S)
    assert budget <= sink + recent or chunk_plan(S, k, lychee_sets.token_chunks(S, k))[0] > 1
    want = lychee_sets.topk(scores, lengths, budget, sink, recent)                 # torch path: the reference
    monkeypatch.setenv("HARNESS_KERNELS", "triton")
    boosted = force_scores_ref(scores, lengths, sink, recent, budget <= sink + recent)
    for block in (None, 256):   # the kernel's loop step (LycheeDecode's topk_block switch)
        got = lychee_sets.topk(boosted, lengths, budget, sink, recent, boosted=True, block=block)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("B,H,S", [(1, 8, 33300), (8, 4, 66000), (1, 2, 98304)])
def test_token_topk_real_shapes(B, H, S):
    """LycheeDecode's token rows on the GPU (k = 4096, 128 sinks + 256 recent boosted to +inf, rows up to
    RADIX_MAX through the two-stage radix kernel): the reference's set, ties (rounded scores) included."""
    from kernels.hybrid import force_scores_ref
    from kernels.topk import topk_positions_ref
    from methods.parts import lychee_sets

    g = torch.Generator(device="cuda").manual_seed(S)
    s = (torch.randn(B, H, S, device="cuda", generator=g) * 8).round() / 8
    lengths = torch.randint(S // 2, S + 1, (B,), device="cuda", dtype=torch.int32, generator=g)
    s = s.masked_fill(torch.arange(S, device="cuda") >= lengths.view(B, 1, 1), float("-inf"))
    boosted = force_scores_ref(s, lengths, 128, 256)
    got = lychee_sets.topk(boosted, lengths, 4096, 128, 256, boosted=True)
    ref = topk_positions_ref(boosted, lengths, 4096)
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
