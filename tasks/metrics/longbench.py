"""LongBench v1 scorers, as THUDM/LongBench LongBench/metrics.py and eval.py define them."""
from __future__ import annotations

import re

# Per-sample scores in [0, 1]; the dataset score is round(100 * mean, 2) (`longbench_aggregate`).
# Quirks kept on purpose: classification_score removes from the list it iterates over; rouge_score
# returns 0 on any exception of the PyPI `rouge` package (empty hypothesis, ...).

LONGBENCH_FIRST_LINE = ("trec", "triviaqa", "samsum", "lsht")
_ZH_PUNCT = "！？｡。＂＃＄％＆＇（）＊＋，－／：；＜＝＞＠［＼］＾＿｀｛｜｝～｟｠｢｣､、〃》「」『』【】〔〕〖〗〘〙〚〛〜〝〞〟〰〾〿–—‘’‛“”„‟…‧﹏."


def normalize_answer(s: str) -> str:
    """Lower text and remove punctuation, articles and extra whitespace (SQuAD)."""
    import string

    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def normalize_zh_answer(s: str) -> str:
    """Lower text, remove Chinese and English punctuation and all whitespace."""
    import string

    punct = set(string.punctuation + _ZH_PUNCT)
    s = "".join(ch for ch in s.lower() if ch not in punct)
    return "".join(s.split())


def f1_score(prediction: list, ground_truth: list, **kwargs) -> float:
    """Bag-of-tokens F1 (Counter intersection); 0 when nothing overlaps."""
    from collections import Counter

    common = Counter(prediction) & Counter(ground_truth)
    num_same = sum(common.values())
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(prediction)
    recall = 1.0 * num_same / len(ground_truth)
    return (2 * precision * recall) / (precision + recall)


def qa_f1_score(prediction: str, ground_truth: str, **kwargs) -> float:
    return f1_score(normalize_answer(prediction).split(), normalize_answer(ground_truth).split())


def _jieba_cut(text: str) -> list[str]:
    import logging

    import jieba

    jieba.setLogLevel(logging.WARNING)
    return list(jieba.cut(text, cut_all=False))


def qa_f1_zh_score(prediction: str, ground_truth: str, **kwargs) -> float:
    pred = [t for t in (normalize_zh_answer(t) for t in _jieba_cut(prediction)) if len(t) > 0]
    gold = [t for t in (normalize_zh_answer(t) for t in _jieba_cut(ground_truth)) if len(t) > 0]
    return f1_score(pred, gold)


def rouge_score(prediction: str, ground_truth: str, **kwargs) -> float:
    """ROUGE-L F of the PyPI `rouge` package (not Google's rouge-score); any error -> 0."""
    from rouge import Rouge

    try:
        scores = Rouge().get_scores([prediction], [ground_truth], avg=True)
    except Exception:  # noqa: BLE001  (official: bare except; empty hypothesis, recursion depth)
        return 0.0
    return scores["rouge-l"]["f"]


def rouge_zh_score(prediction: str, ground_truth: str, **kwargs) -> float:
    return rouge_score(" ".join(_jieba_cut(prediction)), " ".join(_jieba_cut(ground_truth)))


def classification_score(prediction: str, ground_truth: str, **kwargs) -> float:
    all_classes = kwargs["all_classes"]
    em_match_list = [c for c in all_classes if c in prediction]
    for match_term in em_match_list:  # mutating while iterating: as in LongBench (skips items)
        if match_term in ground_truth and match_term != ground_truth:
            em_match_list.remove(match_term)
    return 1.0 / len(em_match_list) if ground_truth in em_match_list else 0.0


def _count_hits(prediction: str, target: str) -> float:
    numbers = re.findall(r"\d+", prediction)
    right = sum(1 for n in numbers if str(n) == str(target))
    return 0.0 if len(numbers) == 0 else float(right / len(numbers))


def retrieval_score(prediction: str, ground_truth: str, **kwargs) -> float:
    return _count_hits(prediction, re.findall(r"Paragraph (\d+)", ground_truth)[0])


def retrieval_zh_score(prediction: str, ground_truth: str, **kwargs) -> float:
    return _count_hits(prediction, re.findall(r"段落(\d+)", ground_truth)[0])


def count_score(prediction: str, ground_truth, **kwargs) -> float:
    return _count_hits(prediction, ground_truth)


def fuzz_ratio(s1: str, s2: str, backend: str = "levenshtein") -> int:
    """fuzzywuzzy.fuzz.ratio with its backend made explicit. fuzzywuzzy silently uses
    python-Levenshtein when installed and difflib otherwise; the two differ (LongBench code scores
    move by about a point), so the backend is a setting recorded with the results."""
    if s1 == s2:  # fuzzywuzzy's check_for_equivalence comes before check_empty_string
        return 100
    if len(s1) == 0 or len(s2) == 0:
        return 0
    if backend == "levenshtein":
        import Levenshtein

        r = Levenshtein.ratio(s1, s2)
    elif backend == "difflib":
        import difflib

        r = difflib.SequenceMatcher(None, s1, s2).ratio()
    else:
        raise ValueError(f"unknown fuzz backend {backend!r} (levenshtein | difflib)")
    return round(100 * r)


def code_sim_score(prediction: str, ground_truth: str, backend: str = "levenshtein", **kwargs) -> float:
    """First line of the output with no ``` ` ```, ``#`` or ``//`` vs the gold line, fuzz ratio / 100."""
    line = ""
    for cand in prediction.lstrip("\n").split("\n"):
        if ("`" not in cand) and ("#" not in cand) and ("//" not in cand):
            line = cand
            break
    return fuzz_ratio(line, ground_truth, backend) / 100


LONGBENCH_METRIC = {
    "narrativeqa": qa_f1_score, "qasper": qa_f1_score, "multifieldqa_en": qa_f1_score,
    "multifieldqa_zh": qa_f1_zh_score, "hotpotqa": qa_f1_score, "2wikimqa": qa_f1_score,
    "musique": qa_f1_score, "dureader": rouge_zh_score, "gov_report": rouge_score,
    "qmsum": rouge_score, "multi_news": rouge_score, "vcsum": rouge_zh_score,
    "trec": classification_score, "triviaqa": qa_f1_score, "samsum": rouge_score,
    "lsht": classification_score, "passage_retrieval_en": retrieval_score,
    "passage_count": count_score, "passage_retrieval_zh": retrieval_zh_score,
    "lcc": code_sim_score, "repobench-p": code_sim_score,
}


def longbench_score(dataset: str, prediction: str, answers: list, all_classes=None,
                    code_backend: str = "levenshtein") -> float:
    """One sample as LongBench eval.py scores it: first line for trec/triviaqa/samsum/lsht, then the
    max over gold answers (starting from 0)."""
    if dataset not in LONGBENCH_METRIC:
        raise ValueError(f"no LongBench metric for dataset {dataset!r}")
    if dataset in LONGBENCH_FIRST_LINE:
        prediction = prediction.lstrip("\n").split("\n")[0]
    metric = LONGBENCH_METRIC[dataset]
    extra = {"backend": code_backend} if metric is code_sim_score else {}
    score = 0.0
    for gt in answers:
        score = max(score, metric(prediction, gt, all_classes=all_classes, **extra))
    return float(score)


def longbench_aggregate(scores: list[float]) -> float:
    """Dataset score: round(100 * mean, 2) (NaN for no samples, as numpy's mean of [])."""
    return round(100 * sum(scores) / len(scores), 2) if scores else float("nan")


def longbench_e_aggregate(scores: list[float]) -> float:
    """LongBench-E bucket score as eval.py scorer_e computes it: round(100 * np.mean(scores), 2)
    (numpy's pairwise sum, which can differ from a running sum in the last bit; NaN for none)."""
    import numpy as np

    return float(round(100 * np.mean(scores), 2)) if scores else float("nan")


def longbench_e_bucket(length: int) -> str:
    """LongBench-E length bucket of a sample's `length` field (words, or characters for Chinese)."""
    return "0-4k" if length < 4000 else ("4-8k" if length < 8000 else "8k+")
