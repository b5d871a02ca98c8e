"""BookSum: both variants on tiny handmade jsonl files (no BookSum data exists offline), ROUGE scorer."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import tasks
from common.errors import ConfigError
from tasks.base import ModelSpec
from tasks.metrics import rouge_scores

ROOT = Path(__file__).resolve().parents[1]
SPEC = ModelSpec(name="smol", max_length=8192)
REF_SYSTEM = "You are a helpful chat bot that summarizes books."
REF_USER = "Summarize the following text in about 300 words:\n"

CHAPTER = "Tom went to the river. He fished all day and caught nothing.\nAt night he walked home."


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def chapter_file(tmp_path):
    return write_jsonl(tmp_path / "test.jsonl", [
        {"bid": 1, "source": "sparknotes", "chapter": CHAPTER, "summary_text": "Tom fished and went home."},
        {"bid": 1, "source": "gradesaver", "chapter": CHAPTER, "summary_text": "Tom caught nothing."},
        {"bid": 2, "source": "cliffnotes", "chapter": "", "summary_text": "empty chapter row"},
        {"bid": 3, "source": "cliffnotes", "chapter": "Some text.", "summary_text": ""},
    ])


def cfg(**kw):
    c = OmegaConf.load(ROOT / "conf/task/booksum.yaml")
    for k, v in kw.items():
        c[k] = v
    return c


def test_yaml_defaults():
    c = cfg()
    assert c.name == "booksum" and c.limit is None and "seed" in c
    assert c.variant == "chapter" and c.max_new_tokens == 512 and c.score_max_tokens == 256


def test_chapter_samples_and_prompt_verbatim(chapter_file, smol_tokenizer):
    task = tasks.build(cfg(data_dir=str(chapter_file)), smol_tokenizer, SPEC)
    samples = list(task.limited())
    assert len(samples) == 2                                   # empty chapter / summary rows dropped
    assert [s.references[0] for s in samples] == ["Tom fished and went home.", "Tom caught nothing."]
    expected = smol_tokenizer.apply_chat_template(
        [{"role": "system", "content": REF_SYSTEM}, {"role": "user", "content": REF_USER + CHAPTER}],
        tokenize=False, add_generation_prompt=True)
    assert smol_tokenizer.decode(samples[0].input_ids) == expected
    assert samples[0].max_new_tokens == 512 and samples[0].params["truncated_tokens"] == 0
    d = task.describe()
    assert "rouge-score" in d["scorer"] and "ROUGE-1.5.5" in d["scorer"]


def test_truncation_keeps_the_end(chapter_file, tmp_path, smol_tokenizer):
    long_text = " ".join(f"w{i}" for i in range(3000))
    path = write_jsonl(tmp_path / "long.jsonl", [{"chapter": long_text, "summary_text": "s"}])
    small = ModelSpec(name="small", max_length=1024)
    s = next(iter(tasks.build(cfg(data_dir=str(path)), smol_tokenizer, small).limited()))
    assert len(s.input_ids) == 1024 - 512 and s.params["truncated_tokens"] > 0
    assert "w2999" in smol_tokenizer.decode(s.input_ids) and "w0 " not in smol_tokenizer.decode(s.input_ids)
    s = next(iter(tasks.build(cfg(data_dir=str(path), truncation="right"), smol_tokenizer, small).limited()))
    assert "w0 " in smol_tokenizer.decode(s.input_ids) and "w2999" not in smol_tokenizer.decode(s.input_ids)
    s = next(iter(tasks.build(cfg(data_dir=str(path), truncation="none"), smol_tokenizer, small).limited()))
    assert len(s.input_ids) > 1024


def test_cascade_variant(tmp_path, smol_tokenizer):
    rows = [{"text": f"book {i}", "prompt": f"Chapter {i} text.</s>", "completion": f"Summary {i}."}
            for i in range(60)]
    path = write_jsonl(tmp_path / "booksum.jsonl", rows)
    task = tasks.build(cfg(data_dir=str(path), variant="cascade", seed=3), smol_tokenizer, SPEC)
    samples = list(task.limited())
    assert len(samples) == 3                                   # 5% of 60, seeded
    again = list(tasks.build(cfg(data_dir=str(path), variant="cascade", seed=3), smol_tokenizer, SPEC).limited())
    assert [s.id for s in again] == [s.id for s in samples]
    i = int(samples[0].id)
    text = smol_tokenizer.decode(samples[0].input_ids)
    assert REF_USER + f"Chapter {i} text.<|im_end|>" in text     # trailing </s> stripped, as the reference
    assert samples[0].references == [f"Summary {i}."]
    # predictions are re-tokenized and cut to 256 tokens before scoring; "</s>" stripped
    long_pred = " ".join(["Summary"] * 600)
    cut = task.postprocess(long_pred + "</s>")
    assert len(smol_tokenizer(cut)["input_ids"]) <= 256 < len(smol_tokenizer(long_pred)["input_ids"])
    m = task.score(samples[0], f"Summary {i}.")
    assert m["rouge1"] == pytest.approx(100.0) and "rouge1_p" in m and "rouge1_r" in m


def test_errors(tmp_path, smol_tokenizer):
    cls = tasks.get("booksum")
    with pytest.raises(ConfigError):
        cls.validate(cfg(variant="pyrouge"), SPEC)
    with pytest.raises(ConfigError):
        cls.validate(cfg(), ModelSpec(name="base", max_length=8192, chat_template=False))
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"article": "x", "highlights": "y"}])
    with pytest.raises(ConfigError, match="fields"):
        list(tasks.build(cfg(data_dir=str(bad)), smol_tokenizer, SPEC).limited())


def test_rouge_known_values():
    assert rouge_scores("", "the cat sat") == {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0, "rougeLsum": 0.0}
    assert rouge_scores("the cat sat", "")["rouge1"] == 0.0
    same = rouge_scores("The cat sat on the mat.", "the cat sat on the mat")
    assert all(v == pytest.approx(100.0) for v in same.values())
    m = rouge_scores("the cat sat", "the cat sat on the mat", precision_recall=True)
    # unigrams: 3 shared; P = 3/3, R = 3/6 -> F = 2/3. bigrams: 2 shared of 2 / 5 -> F = 4/7
    assert m["rouge1_p"] == pytest.approx(100.0) and m["rouge1_r"] == pytest.approx(50.0)
    assert m["rouge1"] == pytest.approx(200 / 3) and m["rouge2"] == pytest.approx(400 / 7)
    assert rouge_scores("cats running", "cat runs")["rouge1"] == pytest.approx(100.0)   # Porter stemmer on
    assert rouge_scores("cats running", "cat runs", use_stemmer=False)["rouge1"] == 0.0


# --- ROUGE-L as the Cascading reference code scores it ----------------------------------------------------------
# jeffwillette/cascading_kv_cache cascade/main/jobs/booksum.py evaluate_rouge: pyrouge's Rouge155 (ROUGE-1.5.5.pl,
# stemmed), which writes one sentence per line. ROUGE-1.5.5's ROUGE-L is then summary-level (Lin 2004, sec. 3.2):
# for each reference sentence, the union of its LCS with every system sentence, each hit counted while the token
# is still unused in both texts; R = hits / reference tokens, P = hits / system tokens, F with alpha 0.5. The Perl
# script is not on these machines: this is that algorithm written out, with its tie rule (a match first, then up
# when c[i-1][j] >= c[i][j-1], else left), on lower-case words so no tokenizer or stemmer takes part.
def _lcs_positions(ref: list[str], sys: list[str]) -> set[int]:
    c = [[0] * (len(sys) + 1) for _ in range(len(ref) + 1)]
    for i in range(1, len(ref) + 1):
        for j in range(1, len(sys) + 1):
            c[i][j] = c[i - 1][j - 1] + 1 if ref[i - 1] == sys[j - 1] else max(c[i - 1][j], c[i][j - 1])
    out, i, j = set(), len(ref), len(sys)
    while i and j:
        if ref[i - 1] == sys[j - 1]:
            out.add(i - 1)
            i, j = i - 1, j - 1
        elif c[i - 1][j] >= c[i][j - 1]:
            i -= 1
        else:
            j -= 1
    return out


def perl_rouge_l_summary_level(reference: str, system: str) -> float:
    from collections import Counter

    refs = [s.split() for s in reference.split("\n") if s.split()]
    syss = [s.split() for s in system.split("\n") if s.split()]
    left_r, left_s = Counter(w for s in refs for w in s), Counter(w for s in syss for w in s)
    m, n, hits = sum(left_r.values()), sum(left_s.values()), 0
    for r in refs:
        for k in sorted(set().union(*(_lcs_positions(r, s) for s in syss))):
            w = r[k]
            if left_r[w] > 0 and left_s[w] > 0:
                hits, left_r[w], left_s[w] = hits + 1, left_r[w] - 1, left_s[w] - 1
    rec, prec = hits / m, hits / n
    return 0.0 if hits == 0 else 100 * 2 * prec * rec / (prec + rec)


@pytest.mark.parametrize("seed", range(6))
def test_rouge_l_column_is_the_reference_codes_summary_level_lcs(seed):
    import random

    rng = random.Random(seed)
    words = ["the", "a", "king", "queen", "went", "to", "castle", "and", "sword", "river", "night", "day", "fought", "won", "lost"]

    def text():
        return "\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))) for _ in range(rng.randint(1, 5)))

    ref, pred = text(), text()
    got = rouge_scores(pred, ref, use_stemmer=False)
    assert got["rougeLsum"] == pytest.approx(perl_rouge_l_summary_level(ref, pred), abs=1e-9)


def test_summary_level_differs_from_rouge_l_and_the_table_reads_it():
    ref, pred = "the king won\nthe queen lost", "the queen lost\nthe king won"
    got = rouge_scores(pred, ref, use_stemmer=False)
    assert got["rougeLsum"] == pytest.approx(100.0) and got["rougeL"] == pytest.approx(50.0)
    from analysis.papers.cascade_tasks import ROUGE

    assert {v: k for k, v in ROUGE.items()}["Rouge-L"] == "rougeLsum"
