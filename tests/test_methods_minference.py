"""MInference (methods/minference.py, methods/parts/minference_patterns.py): oracle tests of the index
estimation and masks against brute-force loops, the sparse prefill against dense attention under the
same mask, equality with `full` when the sizes cover the prompt, the pattern-file resolver, and the
offline search (offline/minference_search.py) on a tiny model."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from test_methods_common import (  # noqa: F401
    decode_logits,
    make,
    masked_attention,
    one_thread,
    tiny_model,
)

from common.errors import ConfigError
from methods import ModelInfo
from methods.parts import minference_patterns as P

C = P.Consts(last_q=8, block=8, init_columns=2, local_slashes=3, min_vertical=2, min_slash=3)
SCALE = 0.25


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def brute_probs(q, k, pos, scale):
    """Causal softmax rows of the queries at `pos` over every key, explicit loops: {pos: [N]}."""
    out = {}
    for r, i in enumerate(pos.tolist()):
        s = [float(q[r] @ k[j]) * scale for j in range(i + 1)]
        m = max(s)
        e = [pow(2.718281828459045, x - m) for x in s]
        z = sum(e)
        out[i] = [x / z for x in e] + [0.0] * (k.shape[0] - i - 1)
    return out


def top_set(scores: list[float], forced: set, n: int) -> tuple[set, float]:
    """Top n by score, forced entries first; (the set, the n-th chosen free score for tie tolerance)."""
    order = sorted(range(len(scores)), key=lambda j: (j not in forced, -scores[j], j))
    chosen = order[:n]
    free = [scores[j] for j in chosen if j not in forced]
    return set(chosen), (min(free) if free else float("inf"))


def assert_same_top(got: set, want: set, scores, kth: float):
    """Equal sets, up to exact near-ties at the cut (the method rounds scores to 2^-12 of the row max)."""
    tol = max(abs(x) for x in scores) * 2 ** -11
    for j in got ^ want:
        assert abs(scores[j] - kth) <= tol, (sorted(got ^ want), j, scores[j], kth)


# --- vertical-slash estimation ---------------------------------------------------------------------------

@pytest.mark.parametrize("start", [0, 13])
def test_vertical_slash_index_matches_brute_force(start):
    N, D = 45, 8
    q, k = rand(N - start, D, seed=1), rand(N, D, seed=2)
    pos = torch.arange(start, N)
    cols, offs = P.vertical_slash_index(q[None], k[None], pos, 6, 7, C, SCALE)
    probs = brute_probs(q[-C.last_q:], k, pos[-C.last_q:], SCALE)
    vert = [sum(p[j] for p in probs.values()) for j in range(N)]
    slash = [sum(p[i - d] for i, p in probs.items() if i - d >= 0) for d in range(N)]
    want_v, kv = top_set(vert, set(range(C.init_columns)), 6)
    want_s, ks = top_set(slash, set(range(C.local_slashes)), 7)
    assert_same_top(set(cols[0].tolist()), want_v, vert, kv)
    assert_same_top(set(offs[0].tolist()), want_s, slash, ks)
    assert len(set(cols[0].tolist())) == 6 and len(set(offs[0].tolist())) == 7


def test_vertical_slash_sizes_are_clamped_like_the_reference():
    q, k = rand(20, 8, seed=3), rand(20, 8, seed=4)
    cols, offs = P.vertical_slash_index(q[None], k[None], torch.arange(20), 1, 1, C, SCALE)
    assert cols.shape[-1] == C.min_vertical and offs.shape[-1] == C.min_slash       # max(v, 30), max(s, 50)
    cols, offs = P.vertical_slash_index(q[None], k[None], torch.arange(20), 99, 99, C, SCALE)
    assert cols.shape[-1] == 20 and offs.shape[-1] == 20                            # min(., N)
    assert set(range(C.init_columns)) <= set(cols[0].tolist())


def brute_vs_mask(cols, offs, rows, N, bs, cover):
    m = torch.zeros(len(rows), N, dtype=torch.bool)
    for r, i in enumerate(rows):
        end = (i // bs + 1) * bs
        for j in range(i + 1):
            if j in cols:
                m[r, j] = True
            for d in offs:
                if cover == "token" and i - j == d:
                    m[r, j] = True
                if cover == "block" and d < end:
                    e = max(end - d, bs)
                    if e - bs <= j < e:
                        m[r, j] = True
    return m


@pytest.mark.parametrize("cover", ["block", "token"])
def test_vertical_slash_mask_matches_brute_force(cover):
    N = 37
    cols, offs = torch.tensor([[0, 5, 20, 33]]), torch.tensor([[0, 1, 9, 17, 30]])
    rows = torch.arange(4, N)
    c = P.Consts(block=8, cover=cover)
    got = P.rows_mask(P.Pattern("vertical_slash", 4, 5), (cols, offs), rows, N, 1, c)[0]
    want = brute_vs_mask(cols[0].tolist(), offs[0].tolist(), rows.tolist(), N, 8, cover)
    assert torch.equal(got, want)
    if cover == "block":  # the kernel's block cover attends more than the exact diagonals
        assert (got & ~brute_vs_mask(cols[0].tolist(), offs[0].tolist(), rows.tolist(), N, 8, "token")).any()


# --- A-shape and block-sparse ------------------------------------------------------------------------------

def test_a_shape_mask_is_sinks_plus_window():
    N, n_init, n_local = 30, 3, 5
    rows = torch.arange(N)
    got = P.rows_mask(P.Pattern("a_shape", n_init, n_local), None, rows, N, 2, C)
    for i in range(N):
        for j in range(N):
            want = j <= i and (j < n_init or i - j < n_local)
            assert bool(got[0, i, j]) == want and bool(got[1, i, j]) == want, (i, j)


@pytest.mark.parametrize("N,top_k", [(43, 2), (40, 3), (64, 10)])
def test_block_sparse_index_matches_brute_force(N, top_k):
    bs, D = 8, 8
    q, k = rand(N, D, seed=5), rand(N, D, seed=6)
    sel = P.block_sparse_index(q[None], k[None], torch.arange(N), top_k, P.Consts(block=bs))[0]
    n_b = -(-N // bs)

    def pooled(x, b):  # zero-padded mean: the partial last block's sum / bs
        return sum((x[j] for j in range(b * bs, min(N, (b + 1) * bs))), torch.zeros(D, dtype=x.dtype)) / bs

    kk = max(1, min(top_k, N // bs))
    for m in range(n_b):
        scores = [float(pooled(q, m) @ pooled(k, n)) for n in range(m + 1)]
        want, kth = top_set(scores, set(), min(kk, m + 1))
        got = set(torch.nonzero(sel[m]).flatten().tolist())
        assert max(got) <= m
        assert_same_top(got, want, scores, kth)
        assert len(got) == min(kk, m + 1)


def test_block_sparse_pools_the_partial_block_with_zero_padding():
    """`_build_block_index` pads the prompt to whole blocks with zeros before the mean: a last block of
    one token scores 1/bs of that token, so here block 0 (q . k = 1) beats block 1 (q . k = 4 / 8)."""
    bs, D = 8, 2
    k = torch.zeros(9, D, dtype=torch.float64)
    k[:8, 0] = 1.0
    k[8, 0] = 4.0
    q = torch.zeros(9, D, dtype=torch.float64)
    q[:, 0] = 1.0
    sel = P.block_sparse_index(q[None], k[None], torch.arange(9), 1, P.Consts(block=bs))[0]
    assert sel[1].tolist() == [True, False]


def test_block_sparse_mask_expands_blocks_causally():
    N, bs = 20, 4
    sel = torch.zeros(1, 5, 5, dtype=torch.bool)
    sel[0, 3, 1] = sel[0, 3, 3] = sel[0, 0, 0] = True
    got = P.rows_mask(P.Pattern("block_sparse", 2), sel, torch.arange(N), N, 1, P.Consts(block=bs))[0]
    for i in range(N):
        for j in range(N):
            assert bool(got[i, j]) == (j <= i and bool(sel[0, i // bs, j // bs])), (i, j)


# --- the sparse prefill -------------------------------------------------------------------------------------

@pytest.mark.parametrize("start,chunk", [(0, 1024), (0, 7), (10, 5)])
def test_sparse_prefill_equals_dense_attention_under_the_same_mask(start, chunk):
    """Each head's output is softmax attention restricted to its pattern's mask, the mask built here
    from the brute-force rules (the index from the estimator, tested above)."""
    B, Hq, Hkv, N, D = 2, 4, 2, 41, 8
    q, k, v = rand(B, Hq, N - start, D, seed=7), rand(B, Hkv, N, D, seed=8), rand(B, Hkv, N, D, seed=9)
    pos = torch.arange(start, N)
    heads = [P.Pattern("vertical_slash", 4, 5), P.Pattern("a_shape", 2, 6), P.Pattern("block_sparse", 2),
             P.Pattern("dense")]
    got, density = P.sparse_prefill(q, k, v, pos, heads, C, SCALE, chunk)
    mask = torch.zeros(B, Hq, N - start, N, dtype=torch.bool)
    kr = k.repeat_interleave(2, 1)
    for h, p in enumerate(heads):
        for b in range(B):
            for r, i in enumerate(pos.tolist()):
                for j in range(i + 1):
                    if p.kind == "dense":
                        mask[b, h, r, j] = True
                    elif p.kind == "a_shape":
                        mask[b, h, r, j] = j < p.a or i - j < p.b
        if p.kind == "vertical_slash":
            cols, offs = P.vertical_slash_index(q[:, h], kr[:, h], pos, p.a, p.b, C, SCALE)
            for b in range(B):
                mask[b, h] = brute_vs_mask(cols[b].tolist(), offs[b].tolist(), pos.tolist(), N, C.block, C.cover)
        if p.kind == "block_sparse":
            sel = P.block_sparse_index(q[:, h], kr[:, h], pos, p.a, C)
            for b in range(B):
                for r, i in enumerate(pos.tolist()):
                    for j in range(i + 1):
                        mask[b, h, r, j] = bool(sel[b, i // C.block, j // C.block])
    want = masked_attention(q, k, v, mask, SCALE)
    assert (got - want).abs().max().item() < 1e-12
    assert density == pytest.approx(mask.sum().item() / (B * Hq * int((pos + 1).sum())))
    assert density < 1.0


# --- the method against full ---------------------------------------------------------------------------------

SMALL = {"last_q": 8, "block_size": 8, "init_columns": 2, "local_slashes": 3, "min_vertical": 2, "min_slash": 3}


def test_sizes_covering_the_prompt_equal_full_and_small_sizes_do_not():
    model = tiny_model(3)
    ids = torch.randint(0, 128, (2, 72), generator=torch.Generator().manual_seed(0))
    ref = decode_logits(model, {"name": "full"}, ids, 56)
    for spec in ("all:vertical_slash:56:56", "mix:vertical_slash:56:1,a_shape:56:1,vertical_slash:1:56,dense"):
        got = decode_logits(model, {"name": "minference", "patterns": spec, **SMALL}, ids, 56)
        assert (got - ref).abs().max().item() < 1e-5, spec
    sparse = decode_logits(model, {"name": "minference", "patterns": "mix:vertical_slash:3:4,a_shape:2:6,block_sparse:2",
                                   **SMALL}, ids, 56)
    assert (sparse[:, 0] - ref[:, 0]).abs().max().item() > 1e-3       # the prefill really is sparse


def test_dense_layers_and_short_prompts_prefill_densely():
    model = tiny_model(3)
    ids = torch.randint(0, 128, (1, 50), generator=torch.Generator().manual_seed(1))
    method, _ = make({"name": "minference", "patterns": "all:a_shape:2:4", "dense_layers": 1, **SMALL}, model)
    from runners.engine import Engine

    eng = Engine(model, method)
    eng.reset(1, 50)
    eng.prefill(ids)
    dens = method.stats()["prefill_density"]
    assert dens[0] == 1.0 and dens[1] < 0.5 and dens[2] < 0.5
    ref = decode_logits(model, {"name": "full"}, ids, 50)
    short = decode_logits(model, {"name": "minference", "patterns": "all:a_shape:2:4", "dense_below": 51, **SMALL},
                          ids, 50)
    assert (short - ref).abs().max().item() < 1e-5


# --- pattern files ----------------------------------------------------------------------------------------------

INFO = ModelInfo(arch="llama", num_layers=3, num_heads=4, num_kv_heads=2, head_dim=16, hidden_size=64,
                 max_position=512)


@pytest.mark.parametrize("spec,needle", [
    ("all:vertical:3:4", "unknown pattern"),
    ("all:vertical_slash:3", "2 positive integer"),
    ("all:a_shape:x:4", "2 positive integer"),
    ("all:block_sparse:0", "positive integer"),
    ("mix:dense,block_sparse:1:2", "1 positive integer"),
    ("no/such/file.json", "no such pattern file"),
])
def test_bad_pattern_specs_are_one_line_errors(spec, needle):
    with pytest.raises(ConfigError) as e:
        make({"name": "minference", "patterns": spec}, tiny_model(3))
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_auto_without_a_file_names_the_search_command():
    from methods.minference import MInferenceConfig

    with pytest.raises(ConfigError) as e:
        MInferenceConfig.parse({"patterns": "auto", "pattern_model": "no_such_model"}, INFO)
    msg = str(e.value)
    assert "python -m offline.minference_search model=no_such_model" in msg and "\n" not in msg
    with pytest.raises(ConfigError) as e:
        MInferenceConfig.parse({"patterns": "auto", "pattern_model": "${oc.select:model.name,null}"}, INFO)
    assert "pattern_model" in str(e.value)


def test_pattern_files_load_ours_and_the_reference_format(tmp_path):
    ref = [{"0": ["vertical_and_slash", 1000, 6096, 3], "1": ["stream_llm", 100, 800, 1],
            "2": ["block_sparse", 100, 0, 2], "3": ["vertical_and_slash", 30, 800, 0]}] * 3
    path = tmp_path / "ref.json"
    path.write_text(json.dumps(ref))
    ps = P.resolve(str(path), model=None, num_layers=3, num_heads=4)
    assert ps.heads[1][1] == P.Pattern("a_shape", 100, 800, 1.0) and ps.counts() == {"vertical_slash": 6,
                                                                                      "a_shape": 3, "block_sparse": 3}
    ours = P.save(tmp_path / "ours.json", model="m", heads=ps.heads, search={"x": 1})
    assert P.load(ours).heads == ps.heads
    with pytest.raises(ConfigError) as e:
        P.resolve(str(path), model=None, num_layers=2, num_heads=4)
    assert "3 layers x 4 query heads" in str(e.value)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError) as e:
        P.resolve(str(tmp_path / "bad.json"), model=None, num_layers=3, num_heads=4)
    assert "not a valid pattern file" in str(e.value) and "\n" not in str(e.value)
    from methods.minference import MInferenceConfig

    cfg = MInferenceConfig.parse({"patterns": str(path), "size_scale": 0.5}, INFO)
    assert cfg.pattern_set(INFO).heads[0][0] == P.Pattern("vertical_slash", 500, 3048, 3.0)


# --- the offline search -------------------------------------------------------------------------------------------

def test_tiny_search_writes_a_file_the_method_loads(tmp_path):
    """Candidates: a tiny A-shape first, then one whose sizes cover the sample (its output equals dense:
    score 0). The count criterion (lowest wins) must pick the covering one for every head; the recall
    criterion (highest wins) too (recall 1). A reversed comparison picks the A-shape."""
    from offline.minference_search import search

    model = tiny_model(3)
    ids = torch.randint(0, 128, (1, 64), generator=torch.Generator().manual_seed(2))
    for criterion in ("output_count", "recall"):
        cfg = OmegaConf.load(Path(__file__).resolve().parents[1] / "conf" / "minference_search.yaml")
        cfg.model, cfg.out, cfg.scale, cfg.criterion, cfg.recall_from = {"name": "tiny"}, str(tmp_path / "p.json"), \
            1.0, criterion, 20
        cfg.candidates = [["a_shape", 1, 2], ["vertical_slash", 64, 64], ["block_sparse", 1, 0]]
        cfg.method = SMALL
        search(cfg, model=model, ids=ids)
        ps = P.resolve(str(tmp_path / "p.json"), model=None, num_layers=3, num_heads=4)
        assert all(p == P.Pattern("vertical_slash", 64, 64, 0.0 if criterion == "output_count" else p.score)
                   for row in ps.heads for p in row), ps.heads
        if criterion == "recall":
            assert all(abs(p.score - 1.0) < 1e-6 for row in ps.heads for p in row)
    data = json.loads((tmp_path / "p.json").read_text())
    assert data["search"]["command"].startswith("python -m offline.minference_search")
    method, _ = make({"name": "minference", "patterns": str(tmp_path / "p.json"), **SMALL}, model)
    assert method.cfg.pattern_set(ModelInfo.from_hf_config(model.config)).counts() == {"vertical_slash": 12}
