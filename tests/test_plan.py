"""The memory plan (runners/plan.py): pure functions over numbers, fake GPU inventories, CPU only.
The footprints come from the real model YAMLs and methods on the meta device (nothing allocated)."""
import pytest
import torch
from omegaconf import OmegaConf

from common.errors import ConfigError
from methods import build
from runners import plan as P
from runners.models import config_from_arch
from runners.validate import model_info

GIB = 2 ** 30
H100 = {"name": "NVIDIA H100 80GB HBM3", "free": int(79.1 * GIB), "total": int(79.6 * GIB)}


def gpus(n, **kw):
    return [P.Gpu(i, **{**H100, **kw}) for i in range(n)]


def fp_of(model, method, length, batch=1, **opts):
    cfg = OmegaConf.load(f"conf/model/{model}.yaml")
    info = model_info(cfg)
    m = build(OmegaConf.create({"name": method, **opts}), info)
    return P.footprint(config_from_arch(cfg.arch), m, info, batch, length, torch.bfloat16,
                       f"{model}, {method}, batch {batch} x {length}")


def toy(layers=8, each=10 * GIB, embed=GIB, head=GIB, shared=0, act=0):
    return P.Footprint(layers=(each,) * layers, embed=embed, head=head, shared=shared, activations=act,
                       weights=layers * each + embed + head, state=shared, what="toy")


def test_70b_refused_on_one_80gb_gpu_in_one_line_with_the_gpus_it_needs():
    fp, slope = fp_of("llama3_70b", "full", 32768, prefill_chunk=8192)
    p = P.plan(fp, gpus(1), 1, 1, 32768, slope)
    assert not p.fits and "\n" not in p.line
    assert "runner.devices=2" in p.line and "model.gpus=2" in p.line   # 131 GiB weights + 10 GiB KV
    assert fp.weights > 130 * GIB
    with pytest.raises(ConfigError):
        raise ConfigError(p.line)


def test_70b_fits_on_four_and_splits_the_80_layers_about_evenly():
    fp, slope = fp_of("llama3_70b", "full", 131072, prefill_chunk=8192)
    p = P.plan(fp, gpus(4), 4, 1, 131072, slope)
    assert p.fits, p.line
    sizes = [s[2] - s[1] for s in p.segments]
    assert sum(sizes) == 80 and max(sizes) - min(sizes) <= 2       # GPU 0 also holds the embedding and head
    assert [s[0] for s in p.segments] == [0, 1, 2, 3]
    assert p.segments[0][1] == 0 and p.segments[-1][2] == 80


def test_1m_full_attention_llama3_8b_refused_on_one_gpu_fits_on_two():
    fp, slope = fp_of("llama3", "full", 1048576, prefill_chunk=16384)
    assert 127 * GIB < fp.state < 129 * GIB            # 32 layers x 8 heads x 1M x 128 x 2 (K, V) x 2 bytes
    one = P.plan(fp, gpus(1), 1, 1, 1048576, slope)
    assert not one.fits and "\n" not in one.line
    assert "runner.devices=2" in one.line and "length <=" in one.line
    two = P.plan(fp, gpus(2), 2, 1, 1048576, slope)
    assert two.fits, two.line
    assert len(P.plan(fp, gpus(4), "auto", 1, 1048576, slope).segments) == 2   # auto: the fewest that fit


def test_an_unchunked_1m_prefill_names_the_prefill_chunk_first():
    fp, slope = fp_of("llama3", "full", 1048576)      # the whole prompt in one step: tens of GiB of workspace
    p = P.plan(fp, gpus(2), 2, 1, 1048576, slope)
    assert not p.fits and p.advice[0].startswith("a smaller method.prefill_chunk")


def test_bounded_method_state_does_not_grow_with_length():
    short, _ = fp_of("llama3", "tidal", 32768)
    fp, slope = fp_of("llama3", "cascade", 1048576)
    assert slope == 0 and fp.state < short.state
    assert P.plan(fp, gpus(1), 1, 1, 1048576, slope).fits   # a bounded-memory method at 1M on one GPU


def test_split_balances_by_bytes_and_respects_each_gpus_free_memory():
    fp = toy(layers=8, each=10 * GIB)
    small = [P.Gpu(0, "a", 30 * GIB, 40 * GIB), P.Gpu(1, "b", 79 * GIB, 80 * GIB)]
    segs = P.split(fp, small)
    assert segs is not None and segs[0][2] - segs[0][1] < segs[1][2] - segs[1][1]
    assert all(used <= P._usable(g) for (i, a, b, used), g in zip(segs, small))
    assert P.split(fp, [P.Gpu(0, "a", 30 * GIB, 40 * GIB)]) is None


def test_explicit_devices_beyond_the_host_is_a_config_error():
    with pytest.raises(ConfigError, match="has 2 GPU"):
        P.plan(toy(), gpus(2), 3)
    with pytest.raises(ConfigError):
        P.plan(toy(), gpus(2), 0)


def test_batch_advice_names_the_largest_batch_that_fits():
    per_seq = 20 * GIB
    fp = P.Footprint(layers=(4 * per_seq // 4 + 5 * GIB,) * 4, embed=GIB, head=GIB, shared=0, activations=0,
                     weights=22 * GIB, state=4 * per_seq, what="toy")
    p = P.plan(fp, gpus(1), 1, batch=4, length=0)
    assert not p.fits and "runner.batch_size=2" in p.advice


def test_state_bytes_counts_declared_buffers_per_layer():
    cfg = OmegaConf.load("conf/model/smollm2.yaml")
    info = model_info(cfg)
    per_layer, shared = P.state_bytes(build(OmegaConf.create({"name": "quest"}), info), info, 2, 1024, torch.bfloat16)
    kv = 2 * 2 * info.num_kv_heads * 1024 * info.head_dim * 2
    assert len(per_layer) == info.num_layers and per_layer[0] > kv and shared == 0


def _run_cfg(*overrides):
    from hydra import compose, initialize_config_dir

    from runners.cli import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return compose("config", overrides=list(overrides))


def test_the_run_refuses_before_loading_and_places_what_fits(monkeypatch, capsys):
    """runners.run calls plan.for_run before models.load: a fake inventory of 80 GB GPUs."""
    monkeypatch.setattr(P, "inventory", lambda: gpus(2))
    cuda = torch.device("cuda")
    cfg = _run_cfg("model=llama3", "method=full", "method.prefill_chunk=16384", "runner.devices=1")
    with pytest.raises(ConfigError, match=r"^plan: llama3, full, batch 1 x 1048576 tokens needs .*runner.devices=2"):
        P.for_run(cfg, cuda, torch.bfloat16, 1, 1048576)
    cfg = _run_cfg("model=llama3", "method=full", "method.prefill_chunk=16384", "runner.devices=auto")
    assert P.for_run(cfg, cuda, torch.bfloat16, 1, 1048576) == [("cuda:0", 0, 16), ("cuda:1", 16, 32)]
    assert capsys.readouterr().err.startswith("plan: fits on 2 x")
    cfg = _run_cfg("model=llama3_70b", "method=tidal")                      # runner.devices follows model.gpus: 4
    with pytest.raises(ConfigError, match="runner.devices=4 but this machine has 2 GPU"):
        P.for_run(cfg, cuda, torch.bfloat16, 1, 10000)
    assert P.for_run(_run_cfg("model=smollm2"), torch.device("cpu"), torch.float32, 1, 4096) is None
    with pytest.raises(ConfigError, match="needs CUDA"):
        P.for_run(_run_cfg("model=smollm2", "runner.devices=2"), torch.device("cpu"), torch.float32, 1, 4096)
