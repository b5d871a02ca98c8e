"""NIAH (TidalDecode protocol): exact lengths, sentence-boundary insertion at the right depth, the
reference template byte for byte, seeded needles, the substring scorer, validation."""
from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from common.errors import ConfigError
from tasks import datafiles
from tasks.base import ModelSpec
from tasks.niah import CITIES, NIAH, TEMPLATE, template_parts

# OURS_TEMPLATE of DerrickYLJ/TidalDecode experiments/needle_test/needle_tools.py (= MInference's).
REFERENCE_TEMPLATE = (
    "Write a high-quality answer for the given question using only the provided search results (some of which "
    "might be irrelevant).\n{context}\n\nQuestion: {question} Don't give information outside the document or "
    "repeat your findings. Keep your response short and direct. Answer: ")
SPEC = ModelSpec("smollm2", 8192)


def make_cfg(**kw):
    cfg = OmegaConf.load("conf/task/niah.yaml")
    cfg.lengths, cfg.depths, cfg.rounds = [512, 1000], [0, 33, 50, 100], 2
    for k, v in kw.items():
        cfg[k] = v
    return cfg


def build(tok, **kw):
    cfg = make_cfg(**kw)
    NIAH.validate(cfg, SPEC)
    return NIAH(cfg, tok, SPEC)


def test_template_is_the_reference_byte_for_byte():
    assert TEMPLATE.encode() == REFERENCE_TEMPLATE.encode()
    assert len(CITIES) == 100 and CITIES.count("Chicago") == 4   # the reference list, duplicates kept


@pytest.fixture(scope="module")
def essays_dir(tmp_path_factory, repo_data):
    """The original NIAH haystack as it ships in its repository: a folder of one *.txt per essay (written
    from data/paul_graham_essays/niah_essays.jsonl, which keeps each file's name and text)."""
    d = tmp_path_factory.mktemp("niah_essays")
    with datafiles.open_text(repo_data / "paul_graham_essays/niah_essays.jsonl") as fh:
        for row in map(json.loads, fh):
            (d / f"{row['name']}.txt").write_text(row["text"], encoding="utf-8")
    return d


@pytest.mark.parametrize("haystack", ["noise", "essays", "pg19"])
def test_exact_length_and_prompt_text(smol_tokenizer, repo_data, essays_dir, haystack):
    dirs = {"essays": essays_dir, "pg19": repo_data / "pg19_books/pg19_books.jsonl"}   # a folder; a .jsonl
    task = build(smol_tokenizer, haystack=haystack, haystack_dir=str(dirs[haystack]) if haystack in dirs else None)
    samples = list(task.samples())
    assert len(samples) == 2 * 4 * 2
    for s in samples:
        assert len(s.input_ids) == s.params["length"]
        text = smol_tokenizer.decode(s.input_ids)
        head, tail = template_parts(f"What is the special magic {s.params['city']} number?")
        assert text.startswith(head) and text.endswith(tail)
        assert f"\nThe special magic {s.params['city']} number is: {s.references[0]}\n" in text
        assert s.max_new_tokens == 32 and s.references[0].isdigit() and len(s.references[0]) == 7


def test_needle_at_sentence_boundary_and_depth(smol_tokenizer, essays_dir):
    task = build(smol_tokenizer, haystack="essays", haystack_dir=str(essays_dir))
    hay = task.haystack(0)[:900]
    assert task.insertion_point(hay, 0) == 0
    assert task.insertion_point(hay, 100) == len(hay)
    for depth in (10, 33, 50, 77, 99):
        at = task.insertion_point(hay, depth)
        target = int(len(hay) * depth / 100)
        assert 0 < at <= target
        assert smol_tokenizer.decode([hay[at - 1]]).endswith(".")          # just after a period
        assert not any(task.is_period(t) for t in hay[at:target])          # the previous one
    # in a built sample the needle starts right after the template head + the haystack before it
    s = task.sample(1000, 50, 0)
    needle = task.encode(f"\nThe special magic {s.params['city']} number is: {s.references[0]}\n")
    i = s.params["needle_token"]
    assert s.input_ids[i:i + len(needle)] == needle
    assert task.is_period(s.input_ids[i - 1])


def test_buffer_reproduces_the_reference_length_rule(smol_tokenizer):
    task = build(smol_tokenizer, buffer=200)
    s = task.sample(1000, 50, 0)
    head, tail = template_parts(f"What is the special magic {s.params['city']} number?")
    overhead = len(task.bos() + task.encode(head)) + len(task.encode(tail))
    assert len(s.input_ids) == 1000 - 200 + overhead     # haystack + needle = length - buffer


def test_seeded_and_reproducible(smol_tokenizer):
    a = [s.input_ids for s in build(smol_tokenizer).samples()]
    b = [s.input_ids for s in build(smol_tokenizer).samples()]
    assert a == b
    other = build(smol_tokenizer, seed=7)
    nums = {s.references[0] for s in build(smol_tokenizer).samples()}
    assert nums != {s.references[0] for s in other.samples()}
    # a sample does not depend on the grid around it (resumable sweeps, stable ids)
    small = build(smol_tokenizer, lengths=[1000], depths=[50], rounds=1)
    assert next(small.samples()).input_ids == build(smol_tokenizer).sample(1000, 50, 0).input_ids


def test_rounds_use_different_haystacks(smol_tokenizer, repo_data):
    task = build(smol_tokenizer, haystack="pg19", haystack_dir=str(repo_data / "pg19_books/pg19_books.jsonl"))
    assert task.haystack(0)[:200] != task.haystack(1)[:200]
    noise = build(smol_tokenizer)
    assert noise.haystack(0) == noise.haystack(1)                   # built-in text: one haystack


def test_scorer_is_substring_match(smol_tokenizer):
    task = build(smol_tokenizer)
    s = task.sample(512, 50, 0)
    n = s.references[0]
    assert task.score(s, f"The special magic number is: {n}.")["accuracy"] == 1.0
    assert task.score(s, f"It is {n[:-1]}")["accuracy"] == 0.0
    assert task.score(s, "no idea")["accuracy"] == 0.0


@pytest.mark.parametrize("kw, msg", [
    ({"lengths": [8192]}, "exceeds"),
    ({"depths": [120]}, "percentages"),
    ({"haystack": "books"}, "haystack must be one of"),
    ({"haystack": "essays"}, "needs task.haystack_dir"),
    ({"rounds": 0}, "rounds"),
])
def test_validation(kw, msg):
    with pytest.raises(ConfigError, match=msg):
        NIAH.validate(make_cfg(**kw), SPEC)


def test_lengths_beyond_the_model_fail_before_loading():
    """The composed config (conf/task/niah.yaml + model YAML) is refused by the CLI validation."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from runners.cli import CONF_DIR
    from runners.validate import validate

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        ok = compose(config_name="config", overrides=["task=niah", "task.lengths=[4096]"])
        bad = compose(config_name="config", overrides=["task=niah", "task.lengths=[10000]"])
    GlobalHydra.instance().clear()
    validate(ok)
    with pytest.raises(ConfigError, match="exceeds smollm2's maximum"):
        validate(bad)


def test_needle_span_and_one_block_restriction(smol_tokenizer):
    """params carry the needle's token span; needle_block [first, size] keeps it inside one block of
    `size` tokens counted from token `first` (Ltri-LLM figure 8's restricted needle)."""
    free = build(smol_tokenizer)
    boxed = build(smol_tokenizer, needle_block=[16, 32])
    straddled = 0
    for depth in (0, 33, 50, 100):
        for a, b in ((free.sample(1000, depth, r), boxed.sample(1000, depth, r)) for r in range(2)):
            for s in (a, b):
                i, e = s.params["needle_token"], s.params["needle_end"]
                assert smol_tokenizer.decode(s.input_ids[i:e]) == (
                    f"\nThe special magic {s.params['city']} number is: {s.references[0]}\n")
                assert len(s.input_ids) == 1000
            i, e = b.params["needle_token"], b.params["needle_end"]
            assert i < 16 or (i - 16) // 32 == (e - 1 - 16) // 32
            fi, fe = a.params["needle_token"], a.params["needle_end"]
            straddled += fi >= 16 and (fi - 16) // 32 != (fe - 1 - 16) // 32
    assert straddled  # the restriction really moved some needles
    with pytest.raises(ConfigError, match="longer than a block"):
        list(build(smol_tokenizer, needle_block=[0, 8]).samples())
