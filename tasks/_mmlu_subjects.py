"""MMLU's 57 subjects and their categories, from the paper's release (hendrycks/test categories.py:
subject -> subcategory -> category). anatomy is "health", hence "other", there; lm-eval puts it in STEM."""
from __future__ import annotations

_SUB = {
    "abstract_algebra": "math", "anatomy": "health", "astronomy": "physics", "business_ethics": "business",
    "clinical_knowledge": "health", "college_biology": "biology", "college_chemistry": "chemistry",
    "college_computer_science": "computer science", "college_mathematics": "math", "college_medicine": "health",
    "college_physics": "physics", "computer_security": "computer science", "conceptual_physics": "physics",
    "econometrics": "economics", "electrical_engineering": "engineering", "elementary_mathematics": "math",
    "formal_logic": "philosophy", "global_facts": "other", "high_school_biology": "biology",
    "high_school_chemistry": "chemistry", "high_school_computer_science": "computer science",
    "high_school_european_history": "history", "high_school_geography": "geography",
    "high_school_government_and_politics": "politics", "high_school_macroeconomics": "economics",
    "high_school_mathematics": "math", "high_school_microeconomics": "economics", "high_school_physics": "physics",
    "high_school_psychology": "psychology", "high_school_statistics": "math", "high_school_us_history": "history",
    "high_school_world_history": "history", "human_aging": "health", "human_sexuality": "culture",
    "international_law": "law", "jurisprudence": "law", "logical_fallacies": "philosophy",
    "machine_learning": "computer science", "management": "business", "marketing": "business",
    "medical_genetics": "health", "miscellaneous": "other", "moral_disputes": "philosophy",
    "moral_scenarios": "philosophy", "nutrition": "health", "philosophy": "philosophy", "prehistory": "history",
    "professional_accounting": "other", "professional_law": "law", "professional_medicine": "health",
    "professional_psychology": "psychology", "public_relations": "politics", "security_studies": "politics",
    "sociology": "culture", "us_foreign_policy": "politics", "virology": "health", "world_religions": "philosophy",
}
_CATEGORIES = {
    "STEM": ("physics", "chemistry", "biology", "computer science", "math", "engineering"),
    "humanities": ("history", "philosophy", "law"),
    "social sciences": ("politics", "culture", "economics", "geography", "psychology"),
    "other": ("other", "business", "health"),
}
SUBJECTS = sorted(_SUB)
CATEGORY = {s: next(c for c, subs in _CATEGORIES.items() if _SUB[s] in subs) for s in SUBJECTS}
