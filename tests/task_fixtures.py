"""Small generated data for the tasks whose data comes from the hub (no network in tests): each entry
writes a few rows in the format the task's loader reads (its `data_dir` layout) under `tmp` and returns
the option overrides that point the task at them. Tasks that generate their data need no entry."""
from __future__ import annotations

import csv
import json
from pathlib import Path

TEXT = ("It was a bright cold day in April, and the clocks were striking thirteen. Winston Smith, his chin "
        "nuzzled into his breast in an effort to escape the vile wind, slipped quickly through the glass doors "
        "of Victory Mansions. ") * 12


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def longbench(tmp: Path) -> dict:
    rows = [{"input": f"Who wrote letter {i}?", "context": f"Alice wrote letter {i} to Bob. " * 5,
             "answers": ["Alice"], "length": 30, "dataset": "qasper", "language": "en", "all_classes": None,
             "_id": f"id{i}"} for i in range(3)]
    _jsonl(tmp / "longbench" / "qasper.jsonl", rows)
    return {"subsets": "qasper", "data_dir": str(tmp / "longbench")}


def infinitebench(tmp: Path) -> dict:
    """A book subset read from data_dir: the suite checks the loader path here; the generated
    retrieval subsets (Config.smoke's generate=true) are covered by tests/test_infinitebench.py."""
    rows = [{"id": i, "context": TEXT, "input": f"What was striking thirteen ({i})?", "answer": ["the clocks"],
             "options": []} for i in range(3)]
    _jsonl(tmp / "infinitebench" / "longbook_qa_eng.jsonl", rows)
    return {"subsets": "longbook_qa_eng", "data_dir": str(tmp / "infinitebench"), "generate": False}


def booksum(tmp: Path) -> dict:
    rows = [{"chapter": TEXT, "summary_text": f"Winston enters Victory Mansions ({i})."} for i in range(3)]
    return {"data_dir": str(_jsonl(tmp / "booksum" / "test.jsonl", rows))}


def mmlu(tmp: Path) -> dict:
    root = tmp / "mmlu"
    for split, name, n in (("dev", "dev", 5), ("validation", "val", 2), ("test", "test", 3)):
        (root / name).mkdir(parents=True, exist_ok=True)
        with (root / name / f"anatomy_{name}.csv").open("w", newline="") as f:
            w = csv.writer(f)
            for i in range(n):
                w.writerow([f"{split} question {i}?", f"a{i}", f"b{i}", f"c{i}", f"d{i}", "ABCD"[i % 4]])
    return {"data_dir": str(root), "subjects": "anatomy"}


def _math(tmp: Path) -> dict:
    rows = [{"problem": f"What is {i} + 2?", "question": f"What is {i} + 2?", "Problem": f"What is {i} + 2?",
             "answer": str(i + 2), "Answer": str(i + 2), "final_answer": [str(i + 2)],
             "solution": f"\\boxed{{{i + 2}}}", "id": i, "ID": i, "idx": i, "unique_id": f"u{i}", "level": 1}
            for i in range(3)]
    return {"data_dir": str(_jsonl(tmp / "math" / "test.jsonl", rows))}


def _books(tmp: Path) -> dict:
    (tmp / "books").mkdir(parents=True, exist_ok=True)
    for i in range(2):
        (tmp / "books" / f"{i}.txt").write_text(TEXT * 2, encoding="utf-8")
    return {"data_dir": str(tmp / "books")}


FIXTURES = {"longbench": longbench, "infinitebench": infinitebench, "booksum": booksum, "mmlu": mmlu,
            "aime": _math, "gaokao2023en": _math, "math500": _math, "minerva_math": _math,
            "olympiadbench": _math, "pg19": _books, "pg19_compare": _books}
