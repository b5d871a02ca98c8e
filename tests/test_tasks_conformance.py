"""The shared task suite: every registered task, with no per-task test code.

A task is its generator or loader, its scorer and its options. For each one this checks that its
samples build from shipped or generated data (hub data comes from tests/task_fixtures.py, no network),
that a perfect output scores the best end of its `metric_range` and an empty or wrong one stays inside
it, that bad options are refused in one ConfigError line, that the same seed gives the same samples,
that its conf/task YAML is the one its typed config generates, and that task and subset names are
unique. tests/test_tasks_toy.py puts a toy task defined there through the same functions."""
from __future__ import annotations

import dataclasses
import math
import typing

import pytest
from omegaconf import OmegaConf
from task_fixtures import FIXTURES

import tasks
from common.errors import ConfigError
from common.options import allowed
from tasks.base import ModelSpec, Sample, Task
from tasks.config import generated

SPEC = ModelSpec(name="smol", max_length=2048, chat_template=True, max_position=2048)
N = 3                                        # samples built per task
NAMES = tasks.REGISTRY.names()


def options(cls: type[Task], tmp) -> dict:
    """The task's defaults with its smoke overrides and, for hub data, its fixture."""
    fixture = FIXTURES.get(cls.name)
    return {**cls.Config.defaults(), **cls.Config.smoke(), **(fixture(tmp) if fixture else {}), "name": cls.name}


def build(cls: type[Task], tok, tmp, **over) -> Task:
    cfg = OmegaConf.create({**options(cls, tmp), **over})
    cls.check_data(cfg, SPEC)
    return tasks.build(cfg, tok, SPEC) if cls.name in tasks.REGISTRY else _build(cls, cfg, tok)


def _build(cls, cfg, tok) -> Task:
    cls.validate(cfg, SPEC)
    return cls(cfg, tok, SPEC)


def first(task: Task, n: int = N) -> list[Sample]:
    out = []
    for s in task.limited():
        out.append(s)
        if len(out) == n:
            break
    return out


# --- the checks, one function each (the toy task's test calls them too) ---------------------------
def check_samples(cls, tok, tmp) -> list[Sample]:
    task = build(cls, tok, tmp)
    samples = first(task)
    assert samples, f"{cls.name}: no samples"
    assert len({s.id for s in samples}) == len(samples), f"{cls.name}: sample ids repeat"
    vocab = len(tok)
    for s in samples:
        assert isinstance(s.id, str) and s.id
        assert s.input_ids and all(isinstance(t, int) and 0 <= t < vocab for t in s.input_ids)
        assert len(s.input_ids) + s.max_new_tokens <= SPEC.positions, f"{cls.name}: {s.id} does not fit"
        if task.mode == "generate":
            assert s.references and s.max_new_tokens >= 1
    assert task.describe().get("task") == cls.name
    return samples


def check_scorer(cls, tok, tmp) -> None:
    task = build(cls, tok, tmp)
    worst, best = cls.metric_range
    lo, hi = min(worst, best), max(worst, best)
    assert cls.metric, f"{cls.name}: name its headline metric (Task.metric)"
    for s in first(task):
        good = task.score_output(s, task.perfect(s))
        assert good[cls.metric] == pytest.approx(best), f"{cls.name}: a perfect output scores {good}"
        bad = task.score_output(s, _wrong(task, s))
        v = bad[cls.metric]
        assert lo <= v <= hi and not math.isnan(v), f"{cls.name}: {v} outside {cls.metric_range}"
        assert v != pytest.approx(best), f"{cls.name}: a wrong output scores as well as a perfect one"
    rows = [{"id": s.id, "params": s.params, "metrics": task.score_output(s, task.perfect(s))} for s in first(task)]
    assert task.summarize(rows)["n"] == len(rows)


def _wrong(task: Task, s: Sample):
    """An output no scorer may count as right: nothing generated, NLL of 5 nats a token, all the
    next-token mass on an answer other than the perfect one, a method far from full attention."""
    import torch

    if task.mode == "generate":
        return ""
    if task.mode == "nll":
        return torch.full((max(len(s.input_ids) - 1, 1),), 5.0)
    perfect = task.perfect(s)
    if task.mode == "choice":
        rest = (perfect == 0).float()      # the same mass on every token but the perfect answer's
        return rest / rest.sum()
    return {k: ([1.0] * len(v) if isinstance(v, list) else 0) for k, v in perfect.items()}


def bad_values(cls) -> list[tuple[str, object]]:
    """Per option: a value of the wrong type, one below its minimum, one outside its choices."""
    hints = typing.get_type_hints(cls.Config)
    out = []
    for f in dataclasses.fields(cls.Config):
        kinds, _ = allowed(hints[f.name])
        if not any(k is str for k in kinds) and not any(typing.get_origin(k) in (list, tuple) for k in kinds):
            out.append((f.name, "not-a-number" if {int, float} & set(kinds) else 12345))
        if f.metadata.get("min") is not None and not any(typing.get_origin(k) in (list, tuple, dict) for k in kinds):
            out.append((f.name, (int if int in kinds else float)(f.metadata["min"]) - 1))
        if f.metadata.get("choices"):
            out.append((f.name, "no-such-choice"))
    return out + [("no_such_option", 1)]


def check_bad_options(cls, tok, tmp) -> None:
    base = options(cls, tmp)
    for key, value in bad_values(cls):
        with pytest.raises(ConfigError) as e:
            cls.validate(OmegaConf.create({**base, key: value}), SPEC)
        msg = str(e.value)
        assert "\n" not in msg and f"task.{key}" in msg, (key, value, msg)


def check_same_seed(cls, tok, tmp) -> None:
    a, b = first(build(cls, tok, tmp)), first(build(cls, tok, tmp))
    assert [(s.id, s.input_ids, s.references, s.params) for s in a] == \
           [(s.id, s.input_ids, s.references, s.params) for s in b], f"{cls.name}: same seed, other samples"


def check_yaml(cls, tmp) -> None:
    """The YAML a user reads holds every option with its declared default (Hydra loads it back)."""
    (tmp / "t.yaml").write_text(generated(cls)[1])
    assert OmegaConf.to_container(OmegaConf.load(tmp / "t.yaml")) == \
           {"name": cls.name, **_plain(cls.Config.defaults())}


def _plain(d):
    if isinstance(d, dict):
        return {k: _plain(v) for k, v in d.items()}
    return [_plain(v) for v in d] if isinstance(d, (list, tuple)) else d


def check_names(classes) -> None:
    """Task names and subset names (longbench's qasper, infinitebench's kv_retrieval, RULER's vt ...)
    name one thing each: a row's task or subset never means two benchmarks."""
    seen: dict[str, str] = {}
    for cls in classes:
        for n in [cls.name, *cls.subset_names()]:
            owner = cls.name if n == cls.name else f"{cls.name} subset"
            other = seen.get(n)
            assert other is None or (n, other, owner) in KNOWN_SAME or (n, owner, other) in KNOWN_SAME, \
                f"{n!r} is both {other} and {owner}"
            seen[n] = owner


# Names shared before this suite existed, kept so committed rows keep their meaning: InfiniteBench's
# passkey subset is the same Landmark/Quest construction (it is passkey at InfiniteBench's lengths).
KNOWN_SAME = {("passkey", "passkey", "infinitebench subset")}


# --- every registered task ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tok(smol_tokenizer):
    return smol_tokenizer


@pytest.mark.parametrize("name", NAMES)
def test_builds_samples(name, tok, tmp_path):
    check_samples(tasks.get(name), tok, tmp_path)


@pytest.mark.parametrize("name", NAMES)
def test_scorer_range_and_perfect_answer(name, tok, tmp_path):
    check_scorer(tasks.get(name), tok, tmp_path)


@pytest.mark.parametrize("name", NAMES)
def test_bad_options_refused_in_one_line(name, tok, tmp_path):
    check_bad_options(tasks.get(name), tok, tmp_path)


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_samples(name, tok, tmp_path):
    check_same_seed(tasks.get(name), tok, tmp_path)


@pytest.mark.parametrize("name", NAMES)
def test_yaml_is_generated_from_the_config(name, tmp_path):
    cls = tasks.get(name)
    path, text = generated(cls)
    assert path.read_text() == text, f"{path.name} is stale: run `python -m tasks`"
    check_yaml(cls, tmp_path)


def test_names_unique_across_tasks_and_subsets():
    check_names([tasks.get(n) for n in NAMES])
