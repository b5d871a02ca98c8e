"""Typed options, shared by methods and tasks: each option is stated once, as a dataclass field with
its default, its documentation and its constraints (`option(...)`).

From that one statement come validation of the composed Hydra config (`Options.parse`: types, ranges,
choices, unknown keys, one ConfigError line each), the documented YAML a user reads and overrides
(`Options.yaml`, written by `python -m methods` / `python -m tasks`), and the defaults. Each layer
subclasses `Options` (methods/config.py `MethodConfig`, tasks/config.py `TaskConfig`) and names its
config group in `group`, the prefix of every message ("method.k must be ...", "task.seed must be ...").
"""
from __future__ import annotations

import copy
import dataclasses
import inspect
import textwrap
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar

from common.errors import ConfigError

YAML_WIDTH = 110
YAML_KEY_WIDTH = 60


def option(default: Any, doc: str, *, min: float | None = None, max: float | None = None,
           choices: tuple | None = None) -> Any:
    """A config field: default, one-line documentation, optional range and choices (for a list, the
    range and the choices apply to each item). A list or dict default is copied for each instance."""
    meta = {"doc": doc, "min": min, "max": max, "choices": choices}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class Options:
    """Base of a typed option set (it has none itself)."""

    group: ClassVar[str] = "option"      # the config group: "method" | "task"

    @classmethod
    def parse_values(cls, cfg: Any) -> Options:
        """A typed instance from a Hydra/OmegaConf node or a dict (`name` ignored)."""
        raw = plain(cfg)
        name = raw.pop("name", "?")
        known = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - set(known))
        if unknown:
            raise ConfigError(f"{cls.group}.{unknown[0]} is not an option of {name}; options: {', '.join(known)}")
        hints = typing.get_type_hints(cls)
        values = {k: coerce(f"{cls.group}.{k}", v, hints[k], known[k].metadata) for k, v in raw.items()}
        return cls(**values)

    def semantics(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def defaults(cls) -> dict:
        return dataclasses.asdict(cls())

    @classmethod
    def fields_in_order(cls) -> list:
        return dataclasses.fields(cls)

    @classmethod
    def yaml(cls, name: str, source: str, command: str) -> str:
        """The documented YAML: the class docstring as the header, every option with its doc (a long
        doc goes above its key, wrapped)."""
        doc = inspect.cleandoc(cls.__doc__ or "")
        lines = [f"# {ln}".rstrip() for ln in doc.splitlines()]
        lines.append(f"# Generated from {source} by `{command}`: edit the dataclass, not this file.")
        obj = cls()
        rows = [("name", name, "")] + [(f.name, yaml_value(getattr(obj, f.name)), f.metadata.get("doc", ""))
                                       for f in cls.fields_in_order()]
        # docs line up after the keys; a long value (a list of names) does not push every doc out
        width = max(len(f"{k}: {v}") for k, v, _ in rows if len(f"{k}: {v}") <= YAML_KEY_WIDTH) + 2
        for k, v, d in rows:
            text = f"{k}: {v}"
            if d and max(width, len(text) + 2) + len(d) + 2 > YAML_WIDTH:
                lines += ["# " + ln for ln in textwrap.wrap(d, YAML_WIDTH - 2)] + [text]
            else:
                lines.append(f"{text:<{max(width, len(text) + 2)}}# {d}" if d else text)
        return "\n".join(lines) + "\n"


def plain(cfg: Any) -> dict:
    try:
        from omegaconf import OmegaConf

        if OmegaConf.is_config(cfg):
            return OmegaConf.to_container(cfg, resolve=True)
    except ImportError:  # pragma: no cover
        pass
    return dict(cfg)


def allowed(tp) -> tuple[list, bool]:
    """(the non-None types of an annotation, whether None is allowed)."""
    args = typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,)
    return [a for a in args if a is not type(None)], type(None) in args


def coerce(key: str, value: Any, tp, meta: dict) -> Any:
    """`value` checked against the annotation `tp` and the option's range and choices; a union of
    several types (`str | list[str]`) accepts the first that fits."""
    kinds, nullable = allowed(tp)
    if value is None:
        if nullable:
            return None
        raise ConfigError(f"{key} must be set (null is not allowed)")
    errors = []
    for kind in kinds:
        try:
            return _coerce_one(key, value, kind, nullable, meta)
        except ConfigError as e:
            errors.append(e)
    if len(errors) == 1:
        raise errors[0]
    raise ConfigError(f"{key} must be {' or '.join(_kind_word(k) for k in kinds)}, got {value!r}")


def _kind_word(kind) -> str:
    origin = typing.get_origin(kind)
    if origin in (list, tuple):
        return "a list"
    if origin is dict or kind is dict:
        return "a mapping"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(kind, str(kind))


def _coerce_one(key: str, value: Any, kind, nullable: bool, meta: dict) -> Any:
    origin = typing.get_origin(kind)
    if kind is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key} must be true or false, got {value!r}")
    elif kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key} must be an integer{' or null' if nullable else ''}, got {value!r}")
    elif kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key} must be a number{' or null' if nullable else ''}, got {value!r}")
        value = float(value)
    elif kind is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key} must be a string, got {value!r}")
    elif origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key} must be a list, got {value!r}")
        (item,) = typing.get_args(kind)[:1] or (Any,)
        return tuple(coerce(f"{key}[{i}]", v, item, meta) for i, v in enumerate(value))
    elif origin is dict or kind is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key} must be a mapping, got {value!r}")
        args = typing.get_args(kind)
        item = args[1] if len(args) == 2 else Any
        return {k: coerce(f"{key}.{k}", v, item, meta) for k, v in value.items()}
    elif kind is Any:
        return value
    choices = meta.get("choices")
    if choices is not None and value not in choices:
        raise ConfigError(f"{key} must be one of {', '.join(map(str, choices))}, got {value!r}")
    lo, hi = meta.get("min"), meta.get("max")
    if lo is not None and value < lo:
        raise ConfigError(f"{key} must be >= {lo}, got {value!r}")
    if hi is not None and value > hi:
        raise ConfigError(f"{key} must be <= {hi}, got {value!r}")
    return value


def yaml_value(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(yaml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {yaml_value(x)}" for k, x in v.items()) + "}"
    return str(v)
