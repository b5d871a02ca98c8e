"""Validation of the command line before Hydra runs anything.

Hydra reports a bad override (unknown group option, unknown key) as a multi-line message with exit
code 1. We compose every run of the command (each combination of a multirun sweep) first through
Hydra's compose API and our own validation, and report the first problem as one line, exit code 2,
before any model loads or any job is launched.
"""
from __future__ import annotations

import shutil
import sys
import warnings
from pathlib import Path

from common.errors import ConfigError, HarnessError

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
MAX_COMBINATIONS = 4096
# Flags that take no value / one value, which are Hydra's own business.
_FLAGS = {"-m", "--multirun", "--help", "-h", "--hydra-help", "--version", "--resolve", "--info", "-i"}
_FLAGS_WITH_VALUE = {"--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn",
                     "--config-dir", "-cd", "--experimental-rerun"}


def is_hydra_override(a: str) -> bool:
    return a.startswith(("hydra.", "hydra/", "+hydra", "~hydra", "++hydra"))


def hydra_overrides(argv: list[str]) -> list[str]:
    """The overrides of Hydra's own config (launcher, sweep dir ...), checked once per command."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in _FLAGS_WITH_VALUE:
            skip = True
        elif is_hydra_override(a):
            out.append(a)
    return out


def user_overrides(argv: list[str]) -> list[str] | None:
    """The key=value overrides of argv, minus hydra's own; None when hydra only prints help/config."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ("--help", "-h", "--hydra-help", "--version", "--info", "-i"):
            return None
        if a in _FLAGS:
            continue
        if a in _FLAGS_WITH_VALUE:
            skip = True
            continue
        if is_hydra_override(a):
            continue
        out.append(a)
    return out


def expand(overrides: list[str]) -> list[list[str]]:
    """Every combination of a sweep (`a=1,2 b=x,y` -> 4 lists); a plain run is one list."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    batches = BasicSweeper.split_arguments(parsed, None)
    combos = [list(c) for batch in batches for c in batch]
    return combos[:MAX_COMBINATIONS] or [[]]


def _one_line(e: Exception) -> str:
    msg = str(e).strip()
    lines = [line.strip() for line in msg.splitlines() if line.strip()]
    first = lines[0] if lines else type(e).__name__
    if first.startswith("Could not override") or "not in struct" in msg:
        key = first.split("'")[1] if "'" in first else first
        return f"unknown config key {key!r} (see conf/ for the keys each group takes)"
    if "Could not find" in first:
        # "In 'config': Could not find 'method/foo'" then "Available options in 'method':" + one per line
        first = first.replace("In 'config': ", "").replace("In 'hydra/config': ", "")
        if any(line.startswith("Available options") for line in lines):
            i = next(i for i, line in enumerate(lines) if line.startswith("Available options"))
            options = [line for line in lines[i + 1:] if ":" not in line and "=" not in line]
            return f"{first}; available: {', '.join(options)}"
    return first


def _compose(overrides: list[str], hydra_config: bool = False):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with warnings.catch_warnings():   # e.g. the submitit_local schema-matching notice: not the user's problem
        warnings.simplefilter("ignore")
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return compose(config_name="config", overrides=overrides, return_hydra_config=hydra_config)


def prevalidate(argv: list[str]) -> None:
    """Hydra's side of the command (overrides that parse, groups and keys that exist, the launcher),
    then runners.validate.preflight for every combination of a sweep: one line, exit 2."""
    overrides = user_overrides(argv)
    if overrides is None:
        return
    from hydra.core.global_hydra import GlobalHydra

    from runners.validate import preflight

    try:
        combos = expand(overrides)
    except Exception as e:
        _fail(f"cannot parse overrides: {_one_line(e)}")
    try:   # Hydra's own side (launcher, sweep settings): once, with the first combination
        hcfg = _compose(hydra_overrides(argv) + combos[0], hydra_config=True)
    except Exception as e:
        _fail(_one_line(e))
    multirun = any(a in ("-m", "--multirun") for a in argv)
    _check_launcher(hcfg, multirun=multirun)
    if multirun:
        _check_sweep_base(overrides)
    seen: set = set()   # each distinct data set and model source is checked once per sweep
    for combo in combos:
        try:
            cfg = _compose(combo)
            _check_added_keys(combo)
        except Exception as e:
            _fail(_one_line(e))
        try:
            preflight(cfg, seen)
        except HarnessError as e:
            _fail(str(e))
        except Exception as e:  # an unexpected config shape: still one line, never a traceback
            _fail(f"invalid config ({type(e).__name__}): {_one_line(e)}")
    GlobalHydra.instance().clear()


def _check_sweep_base(overrides: list[str]) -> None:
    """Hydra composes a sweep's base config from the overrides that are not swept, with each swept
    group at its default: `-m method=quest,tidal method.budget=64` sets a budget on method=full,
    which has none, and Hydra stops with a multi-line error although every job is fine."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    fixed = [o.input_line for o in parsed if not o.is_sweep_override()]
    swept = [o.key_or_group for o in parsed if o.is_sweep_override()]
    try:
        _compose(fixed)
    except Exception as e:   # noqa: BLE001 (Hydra's errors have no common base)
        key = next((o.key_or_group for o in parsed if not o.is_sweep_override()
                    and f"'{o.key_or_group}'" in str(e)), None)
        hint = f"; write it ++{key}=... (set where it exists, added where not)" if key else ""
        _fail(f"{_one_line(e)}: Hydra composes a sweep's base config without the swept values "
              f"({', '.join(swept)} at their defaults){hint}")


def _check_added_keys(combo: list[str]) -> None:
    """`+key=value` (and `++key=value`) add a key Hydra would refuse as `key=value`: every key a run
    reads is in conf/, so an added one is a typo or a key of another group, refused the same way."""
    from omegaconf import OmegaConf

    added = [o for o in combo if o.startswith("+") and "=" in o]
    if not added:
        return
    base = _compose([o for o in combo if o not in added])
    for o in added:
        key = o.lstrip("+").split("=", 1)[0]
        if OmegaConf.select(base, key.replace("/", "."), default=_ABSENT) is _ABSENT:
            raise ValueError(f"Could not override '{key}': an added key (+{key}=...) that conf/ does not define")


_ABSENT = object()


def _check_launcher(hcfg, multirun: bool) -> None:
    """A Slurm sweep from a machine without Slurm would end in submitit's 29-line traceback."""
    target = str(hcfg.hydra.launcher.get("_target_", ""))
    if multirun and target.endswith("SlurmLauncher") and not (shutil.which("sbatch") and shutil.which("srun")):
        _fail("hydra/launcher=slurm needs Slurm, and there is no sbatch/srun on this machine; "
              "use hydra/launcher=submitit_local (or local) to run the sweep here")


def _fail(message: str) -> None:
    from runners import hub

    message = hub.plain(" ".join(line.strip() for line in str(message).splitlines() if line.strip()))
    print(f"error: {message}", file=sys.stderr)
    sys.exit(ConfigError.exit_code)
