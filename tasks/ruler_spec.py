"""RULER's fixed definitions, verbatim from NVIDIA/RULER (scripts/data/synthetic/constants.py,
scripts/synthetic.yaml, scripts/data/template.py). Kept apart from the generators so that a
template change is a one-line diff against the official files.

Typos are RULER's own and are kept on purpose: the prompt must be byte-identical to the official one
for scores to be comparable. The vt answer prefix's "assgined" was RULER's from its release (2024)
until upstream corrected it to "assigned" (present at NVIDIA/RULER @c3f5e3b, 2026-07); the papers
we reproduce (Ltri-LLM, LycheeDecode) predate the correction, so `original` is the default and
`task.prompt_version: fixed` gives the corrected text (`templates()`).
"""
from __future__ import annotations

# scripts/data/synthetic/constants.py: tokens_to_generate, template, answer_prefix per generator.
TEMPLATES: dict[str, dict] = {
    "niah": {
        "tokens_to_generate": 128,
        "template": "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. I will quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are all the special magic {type_needle_v} for {query} mentioned in the provided text?",
        "answer_prefix": " The special magic {type_needle_v} for {query} mentioned in the provided text are",
    },
    "variable_tracking": {
        "tokens_to_generate": 30,
        "template": "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\nQuestion: Find all variables that are assigned the value {query} in the text above.",
        "answer_prefix": " Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are assgined the value {query}, they are: ",
    },
    "common_words_extraction": {
        "tokens_to_generate": 120,
        "template": "Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones that appear most often.\n{context}\nQuestion: What are the 10 most common words in the above list?",
        "answer_prefix": " Answer: The top 10 words that appear most often in the list are:",
    },
    "freq_words_extraction": {
        "tokens_to_generate": 50,
        "template": "Read the following coded text and track the frequency of each coded word. Find the three most frequently appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore the dots '....'. What are the three most frequently appeared words in the above coded text?",
        "answer_prefix": " Answer: According to the coded text above, the three most frequently appeared words are:",
    },
    "qa": {
        "tokens_to_generate": 32,
        "template": "Answer the question based on the given documents. Only give me the answer and do not output any other words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the question based on the given documents. Only give me the answer and do not output any other words.\n\nQuestion: {query}",
        "answer_prefix": " Answer:",
    },
}

PROMPT_VERSIONS = ("original", "fixed")


def templates(version: str = "original") -> dict[str, dict]:
    """TEMPLATES as RULER had them in `version`: original (with "assgined") or fixed."""
    if version not in PROMPT_VERSIONS:
        raise ValueError(f"RULER prompt version must be one of {PROMPT_VERSIONS}, got {version!r}")
    if version == "original":
        return TEMPLATES
    vt = dict(TEMPLATES["variable_tracking"])
    vt["answer_prefix"] = vt["answer_prefix"].replace("assgined", "assigned")
    return {**TEMPLATES, "variable_tracking": vt}


# scripts/synthetic.yaml: the 13 tasks -> generator and its arguments.
TASKS: dict[str, dict] = {
    "niah_single_1": {"task": "niah", "args": {"type_haystack": "noise", "type_needle_k": "words", "type_needle_v": "numbers", "num_needle_k": 1, "num_needle_v": 1, "num_needle_q": 1}},
    "niah_single_2": {"task": "niah", "args": {"type_haystack": "essay", "type_needle_k": "words", "type_needle_v": "numbers", "num_needle_k": 1, "num_needle_v": 1, "num_needle_q": 1}},
    "niah_single_3": {"task": "niah", "args": {"type_haystack": "essay", "type_needle_k": "words", "type_needle_v": "uuids", "num_needle_k": 1, "num_needle_v": 1, "num_needle_q": 1}},
    "niah_multikey_1": {"task": "niah", "args": {"type_haystack": "essay", "type_needle_k": "words", "type_needle_v": "numbers", "num_needle_k": 4, "num_needle_v": 1, "num_needle_q": 1}},
    "niah_multikey_2": {"task": "niah", "args": {"type_haystack": "needle", "type_needle_k": "words", "type_needle_v": "numbers", "num_needle_k": 1, "num_needle_v": 1, "num_needle_q": 1}},
    "niah_multikey_3": {"task": "niah", "args": {"type_haystack": "needle", "type_needle_k": "uuids", "type_needle_v": "uuids", "num_needle_k": 1, "num_needle_v": 1, "num_needle_q": 1}},
    "niah_multivalue": {"task": "niah", "args": {"type_haystack": "essay", "type_needle_k": "words", "type_needle_v": "numbers", "num_needle_k": 1, "num_needle_v": 4, "num_needle_q": 1}},
    "niah_multiquery": {"task": "niah", "args": {"type_haystack": "essay", "type_needle_k": "words", "type_needle_v": "numbers", "num_needle_k": 1, "num_needle_v": 1, "num_needle_q": 4}},
    "vt": {"task": "variable_tracking", "args": {"type_haystack": "noise", "num_chains": 1, "num_hops": 4}},
    "cwe": {"task": "common_words_extraction", "args": {"freq_cw": 30, "freq_ucw": 3, "num_cw": 10, "num_fewshot": 1}},
    "fwe": {"task": "freq_words_extraction", "args": {"alpha": 2.0, "coded_wordlen": 6, "vocab_size": -1}},
    "qa_1": {"task": "qa", "args": {"dataset": "squad"}},
    "qa_2": {"task": "qa", "args": {"dataset": "hotpotqa"}},
}

ALL_TASKS = list(TASKS)
# Tasks that need nothing downloaded: noise / needle haystacks, word lists from the wonderwords wheel.
SYNTHETIC = ["niah_single_1", "niah_multikey_2", "niah_multikey_3", "vt", "cwe", "fwe"]
PRESETS = {"all": ALL_TASKS, "synthetic": SYNTHETIC}

# scripts/eval/synthetic/constants.py: which scorer each generator uses.
METRIC = {"niah": "string_match_all", "variable_tracking": "string_match_all",
          "common_words_extraction": "string_match_all", "freq_words_extraction": "string_match_all",
          "qa": "string_match_part"}

# scripts/data/template.py: RULER's own model wrappers, selectable by name (`task.template`) so
# that a paper model can be prompted exactly as RULER prompts it. `hf` (the tokenizer's chat
# template) is our addition for models RULER has no wrapper for.
MODEL_TEMPLATES: dict[str, str] = {
    "base": "{task_template}",
    "meta-chat": "[INST] {task_template} [/INST]",
    "vicuna-chat": "A chat between a curious user and an artificial intelligence assistant. The assistant gives helpful, detailed, and polite answers to the user's questions. USER: {task_template} ASSISTANT:",
    "lwm-chat": "You are a helpful assistant. USER: {task_template} ASSISTANT: ",
    "command-r-chat": "<BOS_TOKEN><|START_OF_TURN_TOKEN|><|USER_TOKEN|>{task_template}<|END_OF_TURN_TOKEN|><|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>",
    "chatglm-chat": "[gMASK]sop<|user|> \n {task_template}<|assistant|> \n ",
    "RWKV": "User: hi\n\nAssistant: Hi. I am your assistant and I will provide expert full response in full details. Please feel free to ask any question and I will always answer it\n\nUser: {task_template}\n\nAssistant:",
    "Phi3": "<|user|>\n{task_template}<|end|>\n<|assistant|>\n",
    "meta-llama3": "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n{task_template}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
}

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."
DOCUMENT_PROMPT = "Document {i}:\n{document}"
