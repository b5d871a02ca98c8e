"""bench/floors.py: one floor model for every registered method (issue 33). Registry-driven: a method
registered without a floor or a budget option fails here, with no test edited."""
from __future__ import annotations

import pytest
import torch

from bench import floors
from bench.every_method import method_cfg
from methods import REGISTRY, ModelInfo, get

LLAMA3 = ModelInfo("llama", 32, 32, 8, 128, 4096, 1048576, 128256)
ROW = 2 * 128 * 2                                     # one KV row (K and V, D=128) in bf16 bytes
W = 15e9


def typed(name: str, budget: int = 4096):
    cfg, _ = method_cfg(name, budget, "llama3", "random:0:24", LLAMA3)
    return get(name).validate(dict(cfg), LLAMA3)


@pytest.mark.parametrize("name", REGISTRY.names())
def test_every_registered_method_has_a_floor_and_a_budget_option(name):
    assert name in floors.ROWS, f"{name}: no floor model in bench/floors.py ROWS"
    assert name in floors.BUDGET_KNOB, f"{name}: no budget option in bench/floors.py BUDGET_KNOB"
    cfg = typed(name)
    for c in (32768, 131072):
        f = floors.floor(name, cfg, LLAMA3, c, 1, W, 2)
        full = floors.floor("full", typed("full"), LLAMA3, c, 1, W, 2)
        assert f.weights == W and f.kv > 0 and f.selection >= 0 and f.moves >= 0
        # a budget of 4096 tokens per head reads at most what full attention reads, except where the
        # method keeps a set per query head (4x the KV heads here) or reads every token somewhere
        assert f.kv <= 4 * full.kv
        # batch scales everything but the weights
        f8 = floors.floor(name, cfg, LLAMA3, c, 8, W, 2)
        assert f8.kv == pytest.approx(8 * f.kv) and f8.weights == W


def test_floor_bytes_by_hand():
    c = 32768
    assert floors.floor("full", typed("full"), LLAMA3, c, 1, W, 2).kv == 32 * 8 * c * ROW
    assert floors.floor("streaming_llm", typed("streaming_llm"), LLAMA3, c, 1, W, 2).kv == 32 * 8 * 4097 * ROW
    assert floors.floor("lm_infinite", typed("lm_infinite"), LLAMA3, c, 1, W, 2).kv == 32 * 8 * (4096 + 10) * ROW
    # Quest: 2 dense layers, then 32 query heads x 4096 tokens plus one row of page bounds per 16-token page
    q = floors.floor("quest", typed("quest"), LLAMA3, c, 1, W, 2)
    assert q.kv == (2 * 8 * c + 30 * 32 * 4096) * ROW and q.selection == 30 * 8 * (c // 16) * ROW
    # TidalDecode: layers 0-1 dense, layers 2 and 13 select over every token, the rest read the sets
    assert floors.floor("tidal", typed("tidal"), LLAMA3, c, 1, W, 2).kv == (4 * 8 * c + 28 * 32 * 4096) * ROW
    # LycheeDecode with random:0:24: layer 0's 8 KV heads are forced dense, plus 24 = 32 dense heads
    assert floors.floor("lychee", typed("lychee"), LLAMA3, c, 1, W, 2).kv == (32 * c + (256 - 32) * 4096) * ROW
    # H2O reads and rewrites one fp32 score per kept token
    h = floors.floor("h2o", typed("h2o"), LLAMA3, c, 1, W, 2)
    assert h.kv == 32 * 8 * 4097 * ROW and h.selection == 32 * 8 * 4097 * 8
    # InfLLM: sinks + window + 16 blocks of 128 attended; 4 representative keys (half a row) per block
    i = floors.floor("infllm", typed("infllm"), LLAMA3, c, 1, W, 2)
    blocks = (c - 128 - 4096) // 128
    assert i.kv == 32 * 8 * (128 + 4096 + 2048) * ROW and i.selection == 32 * 8 * blocks * 4 * ROW / 2
    assert floors.floor("full", typed("full"), LLAMA3, c, 1, 3e12, 2).ms(3e12) == pytest.approx(
        1e3 * (3e12 + 32 * 8 * c * ROW) / 3e12)


def test_a_short_context_caps_every_budget():
    """Below the budget every method reads at most the context, like full attention."""
    full = floors.floor("full", typed("full"), LLAMA3, 1024, 1, W, 2).kv
    for name in REGISTRY.names():
        kv = floors.floor(name, typed(name), LLAMA3, 1024, 1, W, 2).kv
        assert kv <= 4 * full, name


def test_tactic_fit_mode_takes_the_measured_budget():
    cfg, _ = method_cfg("tactic", 4096, "llama3", "random:0:24", LLAMA3)
    cfg["mode"] = "fit"
    t = get("tactic").validate(dict(cfg), LLAMA3)
    a = floors.floor("tactic", t, LLAMA3, 32768, 1, W, 2, attended=1000.0)
    b = floors.floor("tactic", t, LLAMA3, 32768, 1, W, 2, attended=2000.0)
    assert b.kv - a.kv == 32 * 32 * 1000 * ROW and "measured" in a.note


def test_weight_bytes_skip_an_untied_input_embedding():
    class M(torch.nn.Module):
        def __init__(self, tied):
            super().__init__()
            self.emb, self.mid, self.head = torch.nn.Embedding(10, 4), torch.nn.Linear(4, 4, bias=False), \
                torch.nn.Linear(4, 10, bias=False)
            if tied:
                self.head.weight = self.emb.weight

        def get_input_embeddings(self):
            return self.emb

        def get_output_embeddings(self):
            return self.head

    assert floors.weight_bytes(M(False), 2) == (16 + 40) * 2       # the head, not the input table
    assert floors.weight_bytes(M(True), 2) == (40 + 16) * 2        # tied: the table once, as the head


def test_every_method_uses_the_registry_and_records_heads():
    cfg, note = method_cfg("lychee", 4096, "llama3", "random:0:24", LLAMA3)
    assert cfg["heads"] == "random:0:24" and "no llama3 head file" in note and cfg["budget"] == 4096
    cfg, _ = method_cfg("minference", 4096, "llama3", "random:0:24", LLAMA3)
    assert cfg["pattern_model"] == "llama3"


def test_the_tpot_scripts_floors_agree_with_this_model():
    """bench.tpot and bench.lychee_tpot keep their own KV-row counts (switching them to this module
    would mark their committed files stale); both agree with bench/floors.py, row for row."""
    from bench import lychee_tpot, tpot

    for c in (10240, 32768, 131072):
        for name, budget in (("full", None), ("quest", 4096), ("quest", 32), ("tidal", 4096), ("tidal", 256)):
            cfg = tpot.method_cfg(name, budget, LLAMA3)
            typed_cfg = get(name).validate(dict(cfg), LLAMA3)
            assert tpot.kv_rows_read(name, cfg, LLAMA3, c) == floors.kv_rows(name, typed_cfg, LLAMA3, c), (name, c)
        for variant in ("full", "tidal", "lychee", "lychee_block"):
            cfg = lychee_tpot.method_cfg(variant, LLAMA3)
            typed_cfg = get(cfg["name"]).validate(dict(cfg), LLAMA3)
            assert lychee_tpot.kv_rows(variant, cfg, LLAMA3, c) == floors.kv_rows(cfg["name"], typed_cfg, LLAMA3, c)


def test_every_method_loop_records_failures_skips_and_ratios(tmp_path, monkeypatch):
    """bench.every_method's bookkeeping with the engine stubbed: every registered method has a row per
    cell; an error becomes a row; a cell projected past the time budget is skipped; speed-ups and floors
    are against full attention in the same cell."""
    import json

    from bench import every_method as em

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.head = torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False)

        def get_input_embeddings(self):
            return self.emb

        def get_output_embeddings(self):
            return self.head

    monkeypatch.setattr(em, "load_bench_model", lambda m, w: (Tiny(), LLAMA3, torch.device("cpu"), torch.bfloat16))
    prefill = {"full": 1.0, "quest": 1.0, "ltri": 50.0}

    def fake_cell(model, info, cfg, ids, warmup, steps, timer, device):
        if cfg["name"] == "bigbird" and ids.shape[1] > 2048:
            raise RuntimeError("CUDA out of memory. Tried to allocate 16.00 GiB")
        scale = 1 if ids.shape[1] <= 2048 else ids.shape[1] / 1024
        return {"prefill_s": prefill.get(cfg["name"], 0.5) * scale, "decode_ms": 10.0 if cfg["name"] == "full" else 5.0,
                "graphs": True, "attended_mean": None}

    monkeypatch.setattr(em, "run_cell", fake_cell)
    monkeypatch.setattr(em.torch, "randint", lambda lo, hi, shape, generator=None: torch.zeros(shape, dtype=torch.long))
    clock = iter(range(0, 10 ** 6, 1))
    monkeypatch.setattr(em.time, "time", lambda: float(next(clock)))       # 1 s per call: budget runs out
    monkeypatch.setenv("BENCH_TIME_BUDGET", "200")
    out = tmp_path / "e.json"
    em.main(["--cells", "4096x1", "16384x1", "--out", str(out)])
    d = json.loads(out.read_text())
    rows = {(r["method"], r["context"]): r for r in d["rows"]}
    assert {m for m, _ in rows} == set(REGISTRY.names()) and len(rows) == 2 * len(REGISTRY.names())
    assert rows[("bigbird", 4096)]["status"] == "error" and "out of memory" in rows[("bigbird", 4096)]["error"]
    q = rows[("quest", 4096)]
    assert q["status"] == "ok" and q["speedup_vs_full"] == 2.0 and q["prefill_vs_full"] == 1.0
    assert q["over_floor"] == pytest.approx(5.0 / q["floor_ms"]) and q["floor_gb"] > q["weights_gb"]
    # ltri prefills 50x full: at 16K its projected prefill exceeds what is left of the budget
    assert rows[("ltri", 16384)]["status"] == "skipped" and "projected prefill" in rows[("ltri", 16384)]["error"]
    assert rows[("lychee", 4096)]["heads"].startswith("random:0:24") and d["command"].startswith(
        "python -m bench.every_method")


def test_every_method_file_survives_a_cut_call(tmp_path, monkeypatch):
    """The file is rewritten after every row: a call killed mid-run (the device's time limit) leaves the rows
    that ran, every other (method, cell) a skipped row saying so, `complete` false; a whole run says true."""
    import json

    from bench import every_method as em

    class Cut(BaseException):     # what a kill looks like to the loop: nothing it catches
        pass

    calls = {"n": 0, "cut_at": None}

    def fake_cell(model, info, cfg, ids, warmup, steps, timer, device):
        calls["n"] += 1
        if calls["cut_at"] is not None and calls["n"] >= calls["cut_at"]:
            raise Cut()
        return {"prefill_s": 1.0, "decode_ms": 10.0 if cfg["name"] == "full" else 5.0, "graphs": True,
                "attended_mean": None}

    monkeypatch.setattr(em, "load_bench_model", lambda m, w: (torch.nn.Linear(2, 2), LLAMA3, torch.device("cpu"),
                                                              torch.bfloat16))
    monkeypatch.setattr(em, "run_cell", fake_cell)
    monkeypatch.setattr(em.floors, "weight_bytes", lambda model, elt: 15e9)
    monkeypatch.setattr(em.torch, "randint", lambda lo, hi, shape, generator=None: torch.zeros(shape, dtype=torch.long))
    out = tmp_path / "e.json"
    names = ["full", "quest", "tova", "h2o"]
    warm_calls = 2 * len(names)                 # two short runs per method before the cell
    calls["cut_at"] = warm_calls + 3            # full and one method ran at the cell, the third is cut
    with pytest.raises(Cut):
        em.main(["--cells", "4096x1", "--methods", *names, "--out", str(out)])
    d = json.loads(out.read_text())
    assert d["complete"] is False and len(d["rows"]) == len(names)
    ran = [r for r in d["rows"] if r["status"] == "ok"]
    assert ran[0]["method"] == "full" and len(ran) == 2 and ran[1]["speedup_vs_full"] == 2.0
    assert all("call ended before this row" in r["error"] for r in d["rows"] if r["status"] != "ok")
    calls.update(n=0, cut_at=None)
    em.main(["--cells", "4096x1", "--methods", *names, "--out", str(out)])
    d = json.loads(out.read_text())
    assert d["complete"] is True and all(r["status"] == "ok" for r in d["rows"]) and not (tmp_path / "e.part").exists()


def test_offloaded_memory_floor_counts_measured_moves_at_the_host_rate():
    """InfLLM offloaded: the measured host-to-device bytes of a step join the floor at the host-to-device rate,
    the reads at the memory rate; without a measurement no move is counted (a lower bound)."""
    cfg = typed("infllm")
    assert cfg.offload
    base = floors.floor("infllm", cfg, LLAMA3, 131072, 1, W, 2)
    moved = floors.floor("infllm", cfg, LLAMA3, 131072, 1, W, 2, moved=268e6)
    assert base.moves == 0 and moved.moves == 268e6 and moved.kv == base.kv
    assert moved.ms(3e12, 50e9) == pytest.approx(base.ms(3e12, 50e9) + 1e3 * 268e6 / 50e9)
    assert moved.as_dict(3e12, 50e9)["moves_gb"] == pytest.approx(0.268)


def test_prefill_projection_scales_the_excess_over_full_linearly():
    from bench.every_method import project

    # as full: full's time at the cell; half of full: half of it
    assert project(0.1, 0.1, 17.0, 2048, 131072) == pytest.approx(17.0)
    assert project(0.05, 0.1, 17.0, 2048, 131072) == pytest.approx(8.5)
    # a fixed cost beyond full's (MInference's pattern estimation) grows with the tokens, not as attention:
    # 0.77 s over full on 2K tokens -> 64 x 0.77 s more at 128K, not 8.7 x 170 (the old 148-s projection)
    assert project(0.87, 0.1, 17.0, 2048, 131072) == pytest.approx(17.0 + 0.77 * 64)
