"""Head identification training: the teacher forward equals the HF model, the student mixes exactly
z * dense + (1 - z) * sparse (z = 1 is the teacher, a keep-everything mask too), the gates' closed
forms match Monte Carlo, the Lagrangian and schedule follow train_kuma.py, the passkey-in-book data
has the reference's shape, and a few training steps on a tiny model write a head file that the
methods load."""
from __future__ import annotations

import json
import time

import pytest
import torch
from omegaconf import OmegaConf
from test_methods_common import one_thread, tiny_model  # noqa: F401

from methods import ModelInfo, build
from offline import gates as G
from offline.heads_data import NATO, PasskeyBook
from offline.student import Student
from offline.train_heads import ROOT, final_roles, train


def _ids(n, seed):
    return torch.randint(0, 128, (1, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_teacher_equals_hf_forward(family):
    model = tiny_model(6, family)
    info = ModelInfo.from_hf_config(model.config)
    st = Student(model, info, sink=2, recent=3)
    ids = _ids(50, 0)
    cache = st.prefill(ids[:, :37], chunk=16)
    with torch.no_grad():
        got = st.forward(ids[:, 37:], cache, None)
        want = model.model(ids).last_hidden_state[:, 37:]
    assert (got - want).abs().max().item() <= 1e-4


@pytest.mark.parametrize("mask", ["reference", "inference"])
def test_student_mixing(mask):
    model = tiny_model(6)
    info = ModelInfo.from_hf_config(model.config)
    ids = _ids(50, 1)
    st = Student(model, info, mask=mask, ratio=0.7, sink=2, recent=3)
    cache = st.prefill(ids[:, :37], chunk=64)
    with torch.no_grad():
        teacher = st.forward(ids[:, 37:], cache, None)
        ones = st.forward(ids[:, 37:], cache, torch.ones(6, 2))
        zeros = st.forward(ids[:, 37:], cache, torch.zeros(6, 2))
    assert torch.equal(ones, teacher)                      # z = 1: the sparse branch has weight 0
    assert (zeros - teacher).abs().max().item() > 1e-3     # z = 0 and a 30% mask: really sparse
    keep_all = Student(model, info, mask=mask, ratio=0.0, sink=2, recent=3)
    with torch.no_grad():
        zeros_all = keep_all.forward(ids[:, 37:], cache, torch.zeros(6, 2))
    assert (zeros_all - teacher).abs().max().item() <= 1e-4
    z = torch.rand(6, 2, requires_grad=True)               # gradients reach every layer's gate but 0
    st.forward(ids[:, 37:], cache, z).pow(2).sum().backward()
    assert (z.grad[1:].abs() > 0).all() and (z.grad[0] == 0).all()


def test_reference_mask_counts():
    model = tiny_model(6)
    info = ModelInfo.from_hf_config(model.config)
    st = Student(model, info, ratio=0.5, sink=2, recent=3)
    q = torch.randn(1, 4, 5, 16)
    K = torch.randn(1, 2, 20, 16)
    causal = torch.ones(5, 20, dtype=torch.bool).tril(15)
    m = st._reference_mask(q, K, causal)
    full = st._reference_mask(q, K, torch.ones(5, 20, dtype=torch.bool))
    assert (full.sum(-1) == 10).all()                      # int(0.5 * 20), sinks and recent included
    assert full[..., :2].all() and full[..., -3:].all()
    assert torch.equal(m, full & causal)


def test_hardkuma_closed_forms_match_monte_carlo():
    g = G.HardKumaGate(2, 3)
    with torch.no_grad():
        g.a.copy_(torch.tensor([[0.5, 1.0, 2.0], [1.5, 0.3, 4.0]]))
        g.b.copy_(torch.tensor([[1.0, 1.0, 0.7], [3.0, 0.5, 2.0]]))
    gen = torch.Generator().manual_seed(0)
    z = torch.stack([g.sample(gen) for _ in range(20000)])
    torch.testing.assert_close((z == 0).float().mean(0), g.p_zero().detach(), atol=0.01, rtol=0)
    torch.testing.assert_close((z == 1).float().mean(0), g.p_one().detach(), atol=0.01, rtol=0)
    torch.testing.assert_close(z.mean(0), g.hard_mean(), atol=0.01, rtol=0)
    assert abs(float(G.kuma_mean(torch.tensor(1.0), torch.tensor(1.0))) - 0.5) < 1e-6
    uniform = G.HardKumaGate(1, 1)
    assert abs(float(uniform.p_zero().detach()) - 1 / 12) < 1e-5  # Kuma(1,1) stretched to (-0.1, 1.1)


def test_hardconcrete_nonzero_probability():
    g = G.HardConcreteGate(1, 2)
    with torch.no_grad():
        g.log_alpha.copy_(torch.tensor([[-1.0, 2.0]]))
    gen = torch.Generator().manual_seed(1)
    z = torch.stack([g.sample(gen) for _ in range(20000)])
    torch.testing.assert_close((z != 0).float().mean(0), g.p_nonzero().detach(), atol=0.01, rtol=0)


def test_lagrangian_and_schedule_follow_the_reference():
    lag = G.Lagrangian(0.1, lam0=2.0, lr=0.001)
    d = torch.tensor(0.5, requires_grad=True)
    pen = lag.penalty(d)
    assert abs(float(lag.c_ma) - 0.1 * 0.4) < 1e-7
    assert abs(float(pen.detach()) - float(lag.lam) * 0.04) < 1e-7   # value: the moving average
    pen.backward()
    assert abs(float(d.grad) - float(lag.lam)) < 1e-6       # gradient: that of the current c
    assert float(lag.lam) > 2.0
    below = G.Lagrangian(0.9, lam0=2.0)
    below.penalty(torch.tensor(0.5))
    assert float(below.lam) == 2.0                          # relu: never decreases
    f = G.lr_lambda(100)
    assert [round(f(s), 3) for s in (0, 1, 19, 50, 85, 99)] == [0.1, 0.1, 1.0, 1.0, 0.75, 0.1]


class _ModTok:
    """A real tokenizer's ids folded into a tiny model's 128-token vocabulary."""

    def __init__(self, tok):
        self.tok = tok

    def encode(self, text, add_special_tokens=False):
        return [i % 128 for i in self.tok.encode(text, add_special_tokens=add_special_tokens)]


def test_passkey_book_shape(smol_tokenizer):
    text = "It was a dark and stormy night. " * 400
    data = PasskeyBook(smol_tokenizer, text, context_min=600, context_max=1200, n_lengths=3, num_passkeys=3,
                       passkey_length=5, depth_min=0.05, depth_max=0.95, n_depths=50, seed=0)
    ctx, lab = data.sample(1200)
    c = smol_tokenizer.decode(ctx[0])
    l = smol_tokenizer.decode(lab[0])
    assert c.startswith("<|im_start|> This is a very long story book: <book> ") and c.endswith(" </book>.\n\n")
    assert [l.count(f"what is the {o} passkey") for o in ("first", "second", "third")] == [1, 1, 1]
    keys = [line.split("Passkey: ")[1].split("\n")[0].split() for line in l.split("what is the")[1:]]
    assert all(len(k) == 5 and set(k) <= set(NATO) for k in keys)
    spots = [c.index(" ".join(k)) for k in keys]
    assert spots == sorted(spots)                            # sorted depths
    # the haystack is cut to context_max - 300 (buffer) - the needles/questions, as the reference
    assert 1200 - 300 < ctx.shape[1] + lab.shape[1] <= 1200
    short, _ = data.sample(600)
    assert short.shape[1] < ctx.shape[1]


def test_tiny_training_writes_a_loadable_head_file(tmp_path, smol_tokenizer):
    model = tiny_model(6)
    cfg = OmegaConf.load(ROOT / "conf" / "train_heads.yaml")
    cfg.pop("defaults")
    cfg.pop("hydra")
    cfg.model = {"name": "tiny"}
    over = {"steps": 6, "out": str(tmp_path / "heads.json"), "curves": str(tmp_path / "curves.json"),
            "device": "cpu", "dtype": "float32", "log": {"every": 2, "pdf_steps": [0, 4], "progress": False,
                                                        "wandb": {"mode": "disabled"}},
            "student": {"sink": 2, "recent": 4}, "steps_per_sample": 2,
            "data": {"context_min": 80, "context_max": 200, "n_lengths": 3, "num_passkeys": 2, "passkey_length": 4,
                     "n_depths": 10, "prefill_chunk": 64, "buffer": 20, "books": "data/pg19_books/pg19_books.jsonl"}}
    cfg = OmegaConf.merge(cfg, over)
    summary = train(cfg, model=model, tokenizer=_ModTok(smol_tokenizer))
    data = json.loads((tmp_path / "heads.json").read_text())
    assert data["num_layers"] == 6 and data["num_kv_heads"] == 2 and all(data["heads"][0])
    curves = json.loads((tmp_path / "curves.json").read_text())
    assert curves["steps"] == [0, 2, 4, 5] and set(curves["gate_states"]) == {"0", "4", "6"}
    assert summary["retrieval_heads"] == sum(map(sum, data["heads"]))
    info = ModelInfo.from_hf_config(model.config)
    m = build(OmegaConf.create({"name": "lychee", "heads": str(tmp_path / "heads.json")}), info)
    assert m.cfg.head_set(info).count == summary["retrieval_heads"]


def test_final_roles_rules():
    g = G.DirectGate(3, 2)
    with torch.no_grad():
        g.alpha.copy_(torch.tensor([[0.1, 0.2], [0.9, 0.3], [0.5, 0.8]]))
    roles, scores = final_roles(g, "direct", "duo", target=2 / 6)
    assert roles.tolist() == [[False, False], [True, False], [False, True]]
    roles, scores = final_roles(g, "direct", "lychee", target=2 / 6)
    assert roles[0].all() and scores[0].tolist() == [1.0, 1.0]


def test_checkpoint_resume_equals_one_run(tmp_path, smol_tokenizer, monkeypatch):
    """max_minutes stops and checkpoints; the same command then resumes: the head file and curves equal
    those of an uninterrupted run (gates, optimiser, schedule, multiplier, RNG streams all restored)."""
    def cfg_for(tag, **extra):
        cfg = OmegaConf.load(ROOT / "conf" / "train_heads.yaml")
        cfg.pop("defaults")
        cfg.pop("hydra")
        cfg.model = {"name": "tiny"}
        over = {"steps": 5, "out": str(tmp_path / f"{tag}.json"), "curves": str(tmp_path / f"{tag}-curves.json"),
                "device": "cpu", "dtype": "float32", "log": {"every": 1, "pdf_steps": [0], "progress": False,
                                                            "wandb": {"mode": "disabled"}},
                "student": {"sink": 2, "recent": 4}, "steps_per_sample": 2,
                "data": {"context_min": 80, "context_max": 200, "n_lengths": 3, "num_passkeys": 2,
                         "passkey_length": 4, "n_depths": 10, "prefill_chunk": 64, "buffer": 20}, **extra}
        return OmegaConf.merge(cfg, over)

    tok = _ModTok(smol_tokenizer)
    train(cfg_for("whole"), model=tiny_model(6), tokenizer=tok)
    ck = str(tmp_path / "ck.pt")
    first = train(cfg_for("split", checkpoint=ck, max_minutes=1e-9), model=tiny_model(6), tokenizer=tok)
    assert first["stopped_at"] == 2 and not (tmp_path / "split.json").exists()
    state = torch.load(ck, weights_only=False)
    assert state["curves"]["wall_s"] >= 0               # the first call's training time, kept for the next
                                                        # (two tiny steps round to 0.0 s on a quiet machine)
    state["curves"]["wall_s"] = 1000.0                  # as if it had run long: the total must include it
    torch.save(state, ck)
    monkeypatch.setattr("sys.argv", ["train_heads", "steps=5", f"checkpoint={ck}", f"out={tmp_path}/split.json"])
    t0 = time.monotonic()
    train(cfg_for("split", checkpoint=ck), model=tiny_model(6), tokenizer=tok)
    spent = time.monotonic() - t0   # an upper bound on the second call's own time, however slow the machine
    a, b = (json.loads((tmp_path / f"{t}.json").read_text()) for t in ("whole", "split"))
    assert a["scores"] == b["scores"] and a["heads"] == b["heads"]
    assert b["training"]["command"] == "python -m offline.train_heads steps=5"   # no machine paths recorded
    assert 1000.0 <= b["training"]["wall_s"] <= 1000.0 + spent + 0.1   # both calls' time, not the last call's
    ca, cb = (json.loads((tmp_path / f"{t}-curves.json").read_text()) for t in ("whole", "split"))
    assert ca["density"] == cb["density"] and ca["steps"] == cb["steps"]
