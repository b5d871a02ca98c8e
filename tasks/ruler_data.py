"""The data RULER's generators read: wonderwords lists, the Paul Graham essay haystack, the
sentence splitter for essay insertion, and the SQuAD v2 / HotpotQA dev sets for qa_1 / qa_2.

Every loader either returns what RULER reads or raises a one-line ConfigError naming the option
that fixes it; nothing falls back to a different source silently.
"""
from __future__ import annotations

import bisect
import json
import re
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

from common.errors import ConfigError
from tasks import datafiles

ESSAY_HUB_ID = "baber/paul_graham_essays"        # the essay set lm-eval's RULER port loads
SQUAD_HUB_ID = "rajpurkar/squad_v2"              # RULER's squad.json is SQuAD v2.0 dev
HOTPOT_HUB_ID = "hotpotqa/hotpot_qa"             # RULER's hotpotqa.json is hotpot_dev_distractor_v1
QA_FILES = {"squad": "squad.json", "hotpotqa": "hotpotqa.json"}


# --- word lists (wonderwords, loaded through the same private helper RULER calls) ------------------

def _wonderwords(name: str) -> list[str]:
    try:
        from wonderwords import random_word
    except ImportError as e:
        raise ConfigError("RULER word lists need the PyPI package 'wonderwords' (pip install wonderwords)") from e
    return random_word._get_words_from_text_file(name)


class PairList(Sequence):
    """`sorted(set(f"{adj}-{noun}" ...))` (niah.py's key/value words, 6.2M strings) as an indexable
    view, so that `rng.choice` picks the same word as RULER without building ~0.5 GB of strings.

    Strings sharing the prefix `adj-` sort as a block ordered by noun, and blocks sort by their
    prefix, unless one prefix extends another ("old-" and "old-fashioned-"): such families are
    interleaved, so they are materialised and sorted (a few times 6.8K strings)."""

    def __init__(self, adjs: list[str], nouns: list[str]):
        self.nouns = sorted(set(nouns))
        families: list[list[str]] = []
        for p in sorted({a + "-" for a in adjs}):   # strings with prefix R follow R contiguously
            if families and p.startswith(families[-1][0]):
                families[-1].append(p)
            else:
                families.append([p])
        self.blocks: list = []    # a prefix (str) for simple blocks, a sorted list for families
        self.starts: list[int] = []
        total = 0
        for fam in families:
            block = fam[0] if len(fam) == 1 else sorted({p + n for p in fam for n in self.nouns})
            self.blocks.append(block)
            self.starts.append(total)
            total += len(self.nouns) if isinstance(block, str) else len(block)
        self.total = total

    def __len__(self) -> int:
        return self.total

    def __getitem__(self, i: int) -> str:
        if not 0 <= i < self.total:
            raise IndexError(i)
        b = bisect.bisect_right(self.starts, i) - 1
        block, k = self.blocks[b], i - self.starts[b]
        return block + self.nouns[k] if isinstance(block, str) else block[k]


@lru_cache(maxsize=1)
def niah_words() -> PairList:
    """niah.py: every adjective-noun pair, sorted and deduplicated."""
    return PairList(_wonderwords("adjectivelist.txt"), _wonderwords("nounlist.txt"))


@lru_cache(maxsize=1)
def cwe_words() -> list[str]:
    """common_words_extraction.py: nouns + adjectives + verbs, sorted (shuffled by the caller)."""
    return sorted(set(_wonderwords("nounlist.txt") + _wonderwords("adjectivelist.txt")
                      + _wonderwords("verblist.txt")))


@lru_cache(maxsize=4)
def english_words(path: str | None) -> list[str] | None:
    """RULER's json/english_words.json (values), used by cwe only beyond the wonderwords size."""
    if path is None:
        return None
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"task.english_words_path={path} does not exist")
    return list(json.loads(p.read_text()).values())


# --- essay haystack ------------------------------------------------------------------------------

@lru_cache(maxsize=4)
def essay_words(essay_path: str | None, hub_id: str = ESSAY_HUB_ID) -> list[str]:
    """niah.py: the essay text, whitespace-normalised and split on single spaces."""
    if essay_path:
        if not datafiles.is_file(essay_path):
            raise ConfigError(f"task.essay_path={essay_path} does not exist (RULER's PaulGrahamEssays.json, "
                              f"a json object {{\"text\": ...}})")
        text = json.loads(datafiles.read_text(essay_path))["text"]
    else:
        try:
            import datasets
            text = " ".join(datasets.load_dataset(hub_id, split="train")["text"])
        except Exception as e:  # any hub/network failure: one line naming the fix
            raise ConfigError(f"the RULER essay haystack could not be loaded from the hub ({hub_id}: "
                              f"{type(e).__name__}); set task.essay_path to RULER's PaulGrahamEssays.json") from e
    return re.sub(r"\s+", " ", text).split(" ")


def sentence_splitter(kind: str):
    """RULER inserts essay needles between nltk.sent_tokenize sentences (the pretrained English
    Punkt model). `punkt_untrained` is Punkt without the pretrained abbreviation list: it needs
    no nltk data but splits after abbreviations such as "Mr.", so insertion points differ."""
    try:
        import nltk
        from nltk.tokenize.punkt import PunktSentenceTokenizer
    except ImportError as e:
        raise ConfigError("RULER essay tasks need the PyPI package 'nltk'") from e
    if kind == "punkt":
        try:
            nltk.sent_tokenize("A test. Another one.")
        except LookupError as e:
            raise ConfigError("RULER essay tasks split sentences with nltk's punkt model, which is not "
                              "installed: run `python -m nltk.downloader punkt_tab`, or set "
                              "task.sentence_splitter=punkt_untrained (not RULER's splits)") from e
        return nltk.sent_tokenize
    if kind == "punkt_untrained":
        return PunktSentenceTokenizer().tokenize
    raise ConfigError(f"task.sentence_splitter must be punkt or punkt_untrained, got {kind!r}")


# --- QA (qa.py read_squad / read_hotpotqa) ---------------------------------------------------------

def read_squad(data: dict) -> tuple[list[dict], list[str]]:
    """qa.py read_squad on the SQuAD v2 json: answerable questions, docs deduplicated and sorted."""
    total_docs = sorted({p["context"] for d in data["data"] for p in d["paragraphs"]})
    doc_id = {c: i for i, c in enumerate(total_docs)}
    qas = []
    for d in data["data"]:
        more_docs = [doc_id[p["context"]] for p in d["paragraphs"]]
        for p in d["paragraphs"]:
            for q in p["qas"]:
                if not q["is_impossible"]:
                    qas.append({"query": q["question"], "outputs": [a["text"] for a in q["answers"]],
                                "context": [doc_id[p["context"]]],
                                "more_context": [i for i in more_docs if i != doc_id[p["context"]]]})
    return qas, total_docs


def read_hotpotqa(data: list) -> tuple[list[dict], list[str]]:
    """qa.py read_hotpotqa on the HotpotQA dev (distractor) json: all 10 paragraphs are the context."""
    total_docs = sorted({f"{t}\n{''.join(p)}" for d in data for t, p in d["context"]})
    doc_id = {c: i for i, c in enumerate(total_docs)}
    qas = [{"query": d["question"], "outputs": [d["answer"]],
            "context": [doc_id[f"{t}\n{''.join(p)}"] for t, p in d["context"]]} for d in data]
    return qas, total_docs


def _squad_from_hub(ds) -> dict:
    """Rebuild the SQuAD json nesting (article -> paragraph -> qas) from the hub's flat rows, which
    keep the file's order; `more_context` needs the article grouping."""
    articles: list[dict] = []
    for row in ds:
        if not articles or articles[-1]["title"] != row["title"]:
            articles.append({"title": row["title"], "paragraphs": []})
        paras = articles[-1]["paragraphs"]
        if not paras or paras[-1]["context"] != row["context"]:
            paras.append({"context": row["context"], "qas": []})
        texts = list(row["answers"]["text"])
        paras[-1]["qas"].append({"question": row["question"], "answers": [{"text": t} for t in texts],
                                 "is_impossible": len(texts) == 0})
    return {"data": articles}


def _hotpot_from_hub(ds) -> list:
    return [{"question": r["question"], "answer": r["answer"],
             "context": list(zip(r["context"]["title"], r["context"]["sentences"]))} for r in ds]


@lru_cache(maxsize=2)
def qa_data(dataset: str, data_dir: str | None) -> tuple[list[dict], list[str]]:
    reader = {"squad": read_squad, "hotpotqa": read_hotpotqa}[dataset]
    task = {"squad": "qa_1 (SQuAD v2 dev)", "hotpotqa": "qa_2 (HotpotQA dev, distractor)"}[dataset]
    if data_dir:
        p = Path(data_dir).expanduser() / QA_FILES[dataset]
        if not p.is_file():
            raise ConfigError(f"RULER {task} needs {p} (the file RULER's download_qa_dataset.sh writes); "
                              f"fix task.data_dir")
        return reader(json.loads(p.read_text()))
    try:
        import datasets
        if dataset == "squad":
            data = _squad_from_hub(datasets.load_dataset(SQUAD_HUB_ID, split="validation"))
        else:
            data = _hotpot_from_hub(datasets.load_dataset(HOTPOT_HUB_ID, "distractor", split="validation"))
    except Exception as e:
        hub = SQUAD_HUB_ID if dataset == "squad" else HOTPOT_HUB_ID
        raise ConfigError(f"RULER {task} could not be loaded from the hub ({hub}: {type(e).__name__}); "
                          f"set task.data_dir to a folder with {QA_FILES[dataset]}, or drop the task "
                          f"(task.tasks=synthetic)") from e
    return reader(data)
