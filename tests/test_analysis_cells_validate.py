"""Every cell of every catalogue item, in both profiles, passes the run's own validation
(runners.validate: method options, task lengths against what the method can read, model limits).
Otherwise a sweep a table needs is refused, in one line, only when somebody runs it (ltri.fig8's
7680-token embedded cells were: SmolLM2's task limit is 7500 tokens). Driven by the catalogue, so a
new item is checked without editing this file. Cells of a method that is not implemented (the table
says so) are skipped, and a cell refused only for a trained head file that is not in the project (the
paper models' LycheeDecode/DuoAttention heads: train one on the weights, the error says how) passes:
its configuration is valid.

KNOWN lists the cells refused today on purpose, each with why; the test fails when one of them starts
to validate (take it off the list) as well as when any other cell is refused."""
from __future__ import annotations

import functools

import pytest
from omegaconf import OmegaConf

import analysis.papers  # noqa: F401
from analysis import catalogue
from analysis.runs import expand
from common.errors import ConfigError
from methods import REGISTRY

# (item, profile, model) -> why its cells are refused (none today). Qwen2-7B's cascade cells pass its
# 32768 positions, as the reference ran them: they set model.max_position (analysis/papers/cascade_render.py);
# test_qwen2_positions_need_the_option checks that without it they are refused.
KNOWN: dict = {}


@functools.cache
def _base(groups: tuple) -> object:
    """The composed config for one choice of config groups (Hydra composes once per choice)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from runners.cli import CONF_DIR

    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return compose(config_name="config", overrides=[f"{k}={v}" for k, v in groups])
    finally:
        GlobalHydra.instance().clear()


def _validate(values: dict) -> None:
    """runners.validate on the cell's config: its groups' composition with the cell's keys set, then put
    back (a copy per cell took most of this test's time)."""
    from runners.validate import validate

    groups = tuple(sorted((k, v) for k, v in values.items() if "." not in k))
    cfg = _base(groups)
    OmegaConf.set_struct(cfg, True)                  # an unknown key is an error, as on the command line
    saved = []
    try:
        for k, v in values.items():
            if "." in k:
                old = OmegaConf.select(cfg, k)
                saved.append((k, OmegaConf.to_container(old) if OmegaConf.is_config(old) else old))
                OmegaConf.update(cfg, k, v, merge=False)
        validate(cfg)
    finally:
        for k, old in reversed(saved):
            OmegaConf.update(cfg, k, old, merge=False)


SHARDS = 8      # the catalogue's items split in 8 (by position in key order): pytest-xdist spreads them


@pytest.mark.parametrize("shard", range(SHARDS))
def test_every_cell_of_every_item_validates(shard):
    known, failures, verdict, refused = set(REGISTRY.names()), [], {}, set()
    keys = [k for i, k in enumerate(sorted(catalogue.items())) if i % SHARDS == shard]
    for key in keys:
        impl = catalogue.items()[key].impl
        if impl is None or not getattr(impl, "sweeps", None):
            continue
        for profile, sweeps in impl.sweeps.items():
            for cell in expand(sweeps, [], impl.label):
                if cell.values["method"] not in known:
                    continue
                sig = tuple(sorted(cell.overrides))            # items share cells: validate each once
                if sig not in verdict:
                    try:
                        _validate(cell.values)
                        verdict[sig] = None
                    except ConfigError as e:
                        verdict[sig] = None if "head file for model" in str(e) else f"ConfigError: {e}"
                    except Exception as e:  # noqa: BLE001 - omegaconf's key errors and the like
                        verdict[sig] = f"{type(e).__name__}: {e}"
                if verdict[sig] is None:
                    continue
                where = (key, profile, cell.values["model"])
                if where in KNOWN:
                    refused.add(where)
                else:
                    failures.append(f"{key} [{profile}] {' '.join(cell.overrides)}: {verdict[sig]}")
    assert len(verdict) > 50                                   # 94 to 400 cells a shard today: each holds some
    assert not failures, f"{len(failures)} cells refused, e.g.\n" + "\n".join(failures[:10])
    known_here = {w for w in KNOWN if w[0] in keys}
    assert refused == known_here, f"no longer refused, take off KNOWN: {sorted(known_here - refused)}"


def test_qwen2_positions_need_the_option():
    """The Qwen2-7B cells validate because of model.max_position, not because nothing checks: without it
    the cascade cell of cascade.table1 at a 32K cache is refused for its positions."""
    item = catalogue.items()["cascade.table1"].impl
    cells = [c for c in expand(item.sweeps["paper"], [], item.label)
             if c.values["model"] == "qwen2_7b" and c.values["method"] == "cascade"
             and int(c.values.get("method.cache_size", 0)) == 32768]
    assert cells and all(c.values.get("model.max_position") == 131072 for c in cells), [c.values for c in cells]
    _validate(cells[0].values)
    without = {k: v for k, v in cells[0].values.items() if k != "model.max_position"}
    with pytest.raises(ConfigError, match="positions"):
        _validate(without)
