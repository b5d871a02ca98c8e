"""InfiniteBench prompt templates and generation lengths, verbatim (data, not logic).

Sources: OpenBMB/InfiniteBench src/prompt.py (`gpt4_templates`, `yarn_mistral_templates`) and
src/eval_utils.py (`DATA_NAME_TO_MAX_NEW_TOKENS`); thunlp/InfLLM benchmark/config/
dataset2prompt.json and dataset2maxlen.json (the InfiniteBench entries; what InfLLM-based papers
such as Ltri-LLM run). The typo "funtion" is in the originals.
"""
_MASK_Q = ("Below is a dialogue script where one random occurrence of a character name is replaced "
           "with \"$$MASK$$\", and you should try to guess who that character is.\n\nThe dialogue:"
           "\n\n---\n\n{context}\n\n---\n\nEnd of dialogue.\n\nWhich character is most likely "
           "\"$$MASK$$\"? Just say the name used by the scriptwriter (before the colon marks) of one "
           "single character and nothing else.")
_DEBUG_HEAD = ("There is ONLY ONE function in the large project that is deliberately made to include "
               "an obvious error. Please find the function that contains the most obvious errors. I "
               "will give you four options to narrow your scope. You can inspect the options and "
               "think. Eventually, tell me the answer using one single letter (A, B, C, or D).\n\n"
               "{context}\n\nWhich funtion has deliberate error?\nA. {OPTION_A}\nB. {OPTION_B}\n"
               "C. {OPTION_C}\nD. {OPTION_D}\n\n")
_PASSKEY = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize "
            "them. I will quiz you about the important information there.\n\n{context}\n\n{input}")
_NUMBER = ("There is an important info hidden inside a lot of irrelevant text. Find it. I will quiz "
           "you about the important information there.\n\n{context}\n\n{input}")
_CHOICE = ("Read the book and answer the question.\n\n{context}\n\nQuestion: {question}\n\nOnly one "
           "of the following options is correct, tell me the answer using one single letter (A, B, "
           "C, or D). Don't say anything else.\nA. {OPTION_A}\nB. {OPTION_B}\nC. {OPTION_C}\n"
           "D. {OPTION_D}")
_ZH_QA = "请根据以下书籍回答我的问题。\n\n{context}\n\n问题：{question}\n请尽量简短地回答。"
_CODE_RUN = ("Following is a set of Python functions. There is a function called named {func}.\n\n"
             "{context}\n\nPlease give me the exact number of the return value of {func_call}. Be "
             "concise. Your response must end with the final returned value.")

GPT4 = {
    "passkey": _PASSKEY,
    "number_string": _NUMBER,
    "kv_retrieval": "Extract the value corresponding to the specified key in the JSON object "
                    "below.\n\n{context}\n\n{input}",
    "longbook_qa_eng": "Read the book below and answer a question.\n\n{context}\n\nQuestion: "
                       "{question}\n\nBe very concise.",
    "longbook_choice_eng": _CHOICE,
    "longbook_sum_eng": "Summarize the following book.\n\n{context}",
    "longbook_qa_chn": _ZH_QA,
    "math_find": "{prefix}\n\n{context}\n\n{input}",
    "math_calc": "Compute the intermediate values in the following long expression.\n\n{context}",
    "code_run": _CODE_RUN,
    "code_debug": _DEBUG_HEAD + "You should first find the functions in the options. Repeat their "
                  "content, inspect through code, and at last give me your answer for the function "
                  "that has the deliberate and obvious error in A, B, C, or D.",
    "longdialogue_qa_eng": _MASK_Q,
}

YARN_MISTRAL = {
    "passkey": "There is an important info hidden inside a lot of irrelevant text. Find it and "
               "memorize it. I will quiz you about the important information.\n\n{context}\n\n"
               "{input}\n\nThe pass key is",
    "number_string": _NUMBER + "\n\nThe sequence of digits is",
    "kv_retrieval": GPT4["kv_retrieval"],
    "longbook_sum_eng": "Summarize the book below.\n\n{context}\n\nSummary:",
    "longbook_choice_eng": "Read the book and answer the question.\n\n{context}\n\nQuestion: "
                           "{question}\nA. {OPTION_A}\nB. {OPTION_B}\nC. {OPTION_C}\nD. {OPTION_D}"
                           "\n\nThe letter of the correct answer is",
    "longbook_qa_eng": "Read the book and answer the question. Be very concise in your answer.\n\n"
                       "{context}\n\nQuestion: {question}\nAnswer:",
    "longbook_qa_chn": "阅读以下书籍然后回答问题。\n\n{context}\n\n问题：{question}\n答案：",
    "math_find": "{prefix}\n\n{context}\n\n{input}",
    "math_calc": "Let us calculate the intermediate values of an expression.\n\nExpression: 1 + 3 + "
                 "4\nValues: [1, 4, 8]\n\nExpression: 8 - 3 + 2 - 4\nValues: [8, 5, 7, 3]\n\n"
                 "Expression: {context}\nValues:",
    "code_run": "There is a function called {func} in the following Python code.\n\n{context}\n\n"
                "Please compute the exact value of {func_call}. The value of {func_call} is",
    "code_debug": "Following is a Python code where exactly one of the functions/methods has a "
                  "deliberate error that makes it crash.\n\n{context}\n\nOptions:\nA. {OPTION_A}\n"
                  "B. {OPTION_B}\nC. {OPTION_C}\nD. {OPTION_D}\n\nThe correct option is:",
    "longdialogue_qa_eng": "Below is a dialogue script where one random occurrence of a character "
                           "name is replaced with \"$$MASK$$\", and you should try to guess who "
                           "that character is.\n\n{context}\n\nThe name that has been replaced with "
                           "$$MASK$$ is likely",
}

INFLLM = {
    "passkey": _PASSKEY,
    "number_string": _NUMBER,
    "kv_retrieval": "Extract the value corresponding to the specified key {key} in the JSON object "
                    "below.\n\n{context}\n\n{input}",
    "longbook_qa_eng": "Read the book below and answer a question.\n\n{context}\n\nQuestion: "
                       "{question}\n\nPlease answer as short as possible. The answer is:",
    "longbook_choice_eng": _CHOICE,
    "longbook_sum_eng": "Summarize the following book.\n\n{context}",
    "longbook_qa_chn": _ZH_QA,
    "math_find": "{prefix}\n\n{context}\n\n{input}",
    "math_calc": GPT4["math_calc"],
    "code_run": _CODE_RUN,
    "code_debug": _DEBUG_HEAD + "Give me your answer for the function that has the deliberate and "
                  "obvious error in A, B, C, or D. Your answer MUST be chosen from one of the four "
                  "options without any explanation. If you cannot determine answers accurately, you "
                  "also MUST provide the answer you think is most likely. Absolutely do not say you "
                  "do not know or you need more information.",
    "longdialogue_qa_eng": _MASK_Q,
}

TEMPLATES = {"gpt4": GPT4, "yarn_mistral": YARN_MISTRAL, "infllm": INFLLM}

MAX_NEW_TOKENS = {
    "official": {"passkey": 6, "number_string": 12, "kv_retrieval": 50, "longbook_sum_eng": 1200,
                 "longbook_choice_eng": 40, "longbook_qa_eng": 40, "longbook_qa_chn": 40,
                 "longdialogue_qa_eng": 40, "math_find": 3, "math_calc": 30000, "code_run": 5,
                 "code_debug": 5},
    "infllm": {"passkey": 32, "number_string": 32, "kv_retrieval": 100, "longbook_qa_eng": 32,
               "longbook_choice_eng": 32, "longbook_sum_eng": 1536, "longbook_qa_chn": 32,
               "math_find": 32, "math_calc": 64000, "code_run": 32, "code_debug": 32,
               "longdialogue_qa_eng": 32},
}
