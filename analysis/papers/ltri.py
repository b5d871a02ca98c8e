"""Ltri-LLM items on NIAH: Figs. 1-2 (InfLLM's needle recall by layer and step, successful vs failed),
Table 1 (mandatory evidence injection), Fig. 8 (NIAH grid, restricted / unrestricted needle) and
Figs. 10-14 (ablations). The benchmark tables (2, 3, 8, Fig. 9) are in ltri_bench, Table 4 (memory)
in ltri_memory, the renderers in ltri_render.

Profiles. `paper`: Llama-3-8B-Instruct-262K (llama3_262k) with the paper's memory settings (128 sinks,
4096 window, blocks of 128, top-16, 4 representative tokens, chunks of 512, 32 cached blocks), Ltri-LLM
with Table 5's NIAH row and Tables 6-7's per-layer theta / phi and appendix C's retrieval heads.
`embedded`: SmolLM2-135M (8K positions) with every size scaled by 1/4 (32 sinks, 1024 window, blocks
of 32, top-16, chunks of 128, 32 cached blocks: memory budget 32 + 512 + 1024 tokens, past which NIAH
needles at 2K-7.7K sit), Ltri-LLM with 2 spans and at most 5 index vectors per 32-token block (the
paper's 4 and 12 per 128 do not fit a 32-token block once gaps are filled), theta 0.9 / phi 0.1 (the
paper's "typical" values; the per-layer search was not redone) and the retrieval heads that
offline.retrieval_heads found for SmolLM2 (results/retrieval_heads/smollm2.json). Q (the last prefill
chunk) stays 32: it holds the question, which does not shrink with the model.
The needle: the paper's eight bilingual questions (its Fig. 15) are not public data; every item runs
tasks/niah.py (TidalDecode's "special magic number" needle, substring match) instead of GPT-4 judging.
"""
from __future__ import annotations

import json
from pathlib import Path

from analysis import papers_data
from analysis.catalogue import Impl, register
from analysis.papers import ltri_render as R

ROOT = Path(__file__).resolve().parents[2]
DEPTHS9 = "[10,20,30,40,50,60,70,80,90]"


def _list(xs) -> str:
    return "[" + ",".join(str(x) for x in xs) + "]"


def _retrieval_heads_paper() -> list[list]:
    return [list(v) for v in papers_data.item("ltri.retrieval_heads")["rows"].values()]


def _retrieval_heads_smol() -> list[list]:
    p = ROOT / "results" / "retrieval_heads" / "smollm2.json"
    return json.loads(p.read_text())["retrieval_heads"] if p.exists() else []


THETA = papers_data.item("ltri.table6")["rows"]["theta"]
PHI = papers_data.item("ltri.table7")["rows"]["phi"]
MEMORY = {
    "paper": ["method.n_init=128", "method.n_local=4096", "method.block_size=128", "method.topk=16",
              "method.exc_block_size=512", "method.max_cached_block=32"],
    "embedded": ["method.n_init=32", "method.n_local=1024", "method.block_size=32", "method.topk=16",
                 "method.exc_block_size=128", "method.max_cached_block=32"],
}
MODEL = {"paper": "model=llama3_262k", "embedded": "model=smollm2"}
INFLLM = {p: ["method=infllm", *m, "method.repr_topk=4"] for p, m in MEMORY.items()}
# Ltri-LLM without lambda / Omega / Q (the ablations sweep them; LTRI adds the defaults of section 5)
LTRI_CORE = {
    "paper": ["method=ltri", *MEMORY["paper"], "method.spans_per_block=4", "method.max_vectors=12",
              f"method.theta_quantile={_list(THETA)}", f"method.iou={_list(PHI)}"],
    "embedded": ["method=ltri", *MEMORY["embedded"], "method.spans_per_block=2", "method.max_vectors=5",
                 "method.theta_quantile=[0.9]", "method.iou=[0.1]"],
}
RH = {"paper": f"method.retrieval_heads={_list(_list(h) for h in _retrieval_heads_paper())}",
      "embedded": f"method.retrieval_heads={_list(_list(h) for h in _retrieval_heads_smol())}"}
LTRI = {p: [*LTRI_CORE[p], RH[p], "method.lam=3", "method.ratio_mode=row", "method.last_chunk=32"] for p in RH}
STREAMING = {"paper": ["method=streaming_llm", "method.sink=128", "method.window=6144"],
             "embedded": ["method=streaming_llm", "method.sink=32", "method.window=1536"]}
LM_INFINITE = {"paper": ["method=lm_infinite", "method.global_branch=128", "method.local_branch=6144"],
               "embedded": ["method=lm_infinite", "method.global_branch=32", "method.local_branch=1536"]}
# NIAH: the paper's grids (20K-230K, depths 10-90%, 100 groups) and the embedded stand-ins
NIAH_LENGTHS = {"paper": [20000, 50000, 80000, 110000, 140000, 170000, 200000, 230000],
                "embedded": [2048, 4096, 6144, 7424]}
NIAH_ROUNDS = {"paper": 11, "embedded": 3}      # paper: 9 depths x 11 = 99 ~ its 100 groups per length
RESTRICT = {"paper": "task.needle_block=[128,128]", "embedded": "task.needle_block=[32,32]"}


def niah(profile: str, lengths=None, rounds=None, depths=DEPTHS9) -> list[str]:
    lens = ",".join(f"[{n}]" for n in (lengths or NIAH_LENGTHS[profile]))
    return ["task=niah", "task.haystack=noise", f"task.lengths={lens}", f"task.depths={depths}",
            f"task.rounds={rounds or NIAH_ROUNDS[profile]}", MODEL[profile]]


def length(v: dict) -> int:
    return int(v["task.lengths"][0])


def method_label(v: dict) -> str:
    return {"infllm": "InfLLM", "ltri": "Ltri-LLM", "streaming_llm": "StreamingLLM", "full": "Full",
            "lm_infinite": "LM-Infinite", "minference": "MInference"}.get(v["method"], v["method"])


SETUP_NOTE = {"paper": "Llama-3-8B-Instruct-262K, tasks/niah.py (noise haystack), the paper's memory settings.",
              "embedded": "SmolLM2-135M-Instruct, tasks/niah.py (noise haystack), memory sizes scaled by 1/4 "
                          "(module docstring)."}

# --- Figs. 1-2: InfLLM's needle recall --------------------------------------------------------------
FIG12 = Impl(
    title="InfLLM on NIAH: accuracy, and needle recall by layer and decoding step, successful vs failed "
          "(Ltri-LLM Figs. 1-2)",
    sweeps={p: [[*niah(p), *INFLLM[p], "method.evidence=record"]] for p in MEMORY},
    label=lambda v: ("", "InfLLM", length(v)),
    render=R.recall_figure,
    setup={p: SETUP_NOTE[p] + " Recall = share of the needle's tokens a decoding step attends (window, sinks, "
           "retrieved blocks, remainder), per layer." for p in MEMORY},
    paper_setup="Llama-3-8B-Instruct-262K with InfLLM, 8 bilingual needles x 1,225 tests, GPT-4 judged; "
                "Fig. 2: 11 successful (26 steps) and 212 failed (19 steps) samples.",
)

# --- Table 1: evidence injection ------------------------------------------------------------------
TABLE1 = Impl(
    title="Failed InfLLM NIAH cases converted by injecting the needle's blocks (Ltri-LLM Table 1)",
    sweeps={p: [[*niah(p), *INFLLM[p], "method.evidence=record,inject"]] for p in MEMORY},
    label=lambda v: ("", "InfLLM " + v.get("method.evidence", "record"), length(v)),
    render=R.conversion_table,      # the paper's rows (per needle, not per length) are shown by the renderer
    setup={p: SETUP_NOTE[p] + " Same samples twice: evidence=record (InfLLM) and evidence=inject (the blocks "
           "holding the needle forced into every retrieval)." for p in MEMORY},
    paper_setup="Llama-3-8B-Instruct-262K, needles 1-4 (Chinese) and 5-8 (English), failures of 1,225 tests each.",
)

# --- Fig. 8: NIAH grid, restricted and unrestricted needle ------------------------------------------
# StreamingLLM with InfLLM's sinks and window: what retrieval must beat past the window
SAME_WINDOW = {"paper": ["method=streaming_llm", "method.sink=128", "method.window=4096"],
               "embedded": ["method=streaming_llm", "method.sink=32", "method.window=1024"]}


def _fig8_label(v: dict):
    if v["method"] == "streaming_llm":
        return ("", "StreamingLLM, InfLLM's window", length(v))
    return ("", f"{method_label(v)}, " + ("restricted" if v.get("task.needle_block") else "unrestricted"), length(v))


FIG8 = Impl(
    title="NIAH accuracy by length, InfLLM vs Ltri-LLM, needle restricted to one block or not (Ltri-LLM Fig. 8)",
    sweeps={p: [[*niah(p), *INFLLM[p]], [*niah(p), *INFLLM[p], RESTRICT[p]],
                [*niah(p), *LTRI[p]], [*niah(p), *LTRI[p], RESTRICT[p]], [*niah(p), *SAME_WINDOW[p]]]
            for p in MEMORY},
    label=_fig8_label,
    render=R.niah_grid,
    setup={p: SETUP_NOTE[p] + " Restricted: the needle moved inside one memory block (task.needle_block). "
           "Added row: StreamingLLM with InfLLM's sinks and window (retrieval past the window must beat it)."
           for p in MEMORY},
    paper_setup="Llama-3-8B-Instruct-262K, 20K-230K, depths 10-90%, 100 groups per length.",
)

# --- Figs. 10-14: ablations -----------------------------------------------------------------------
ABL_LENGTHS = {"paper": [100000], "embedded": [6144]}
# Figs. 12/14 sweep lambda; it binds only while Eq. 7's counts stay under the cap M. The embedded block (32
# tokens, M=5) keeps the cap at every lambda (runs at M=5 gave 5.00 vectors per block for lambda 3-10), so the
# embedded profile sweeps lambda again with no cap (M = the block size); the M=5 runs stay as their own rows.
LAM_UNCAPPED = {"paper": [], "embedded": ["method.max_vectors=32"]}


def _ablations(p: str) -> list[list[str]]:
    core = [*niah(p, ABL_LENGTHS[p]), *LTRI_CORE[p], RESTRICT[p]]
    q, lam, omega = "method.last_chunk=32", "method.lam=3", "method.ratio_mode=row"
    return ([[*core, RH[p], q, lam, omega, "method.persistent=true,false", "method.voting=true,false"],  # Fig. 10
            [*core, "method.retrieval_heads=[]", q, lam, omega, "method.persistent=true,false",
             "method.voting=true,false"],                                                 # Fig. 10 without RH
            [*core, RH[p], lam, omega, "method.last_chunk=16,64,128,256,512"],            # Fig. 11 (32: the base)
            [*core, RH[p], q, omega, "method.lam=4,5,6,7,8,9,10"],                        # Figs. 12, 14
            [*core, RH[p], q, lam, "method.ratio_mode=col,rowcol"]]                       # Fig. 13
            + ([[*[o for o in core if not o.startswith("method.max_vectors=")], *LAM_UNCAPPED[p], RH[p], q, omega,
                 "method.lam=3,4,5,6,7,8,9,10"]] if LAM_UNCAPPED[p] else []))              # Figs. 12, 14 uncapped


def _ablation_label(v: dict):
    rh = "RH" if v.get("method.retrieval_heads") else "no RH"
    if "method.persistent" in v and "method.voting" in v:
        return ("Fig. 10", (f"P={'on' if v['method.persistent'] else 'off'}, {rh}, "
                           f"V={'on' if v['method.voting'] else 'off'}"), "accuracy")
    if "method.last_chunk" in v and v["method.last_chunk"] != 32:
        return ("Fig. 11", f"Q={v['method.last_chunk']}", "accuracy")
    if v.get("method.lam", 3) != 3 or v.get("method.max_vectors") == 32:
        return ("Fig. 12", f"lambda={v['method.lam']:g}, M={v.get('method.max_vectors')}", "accuracy")
    if v.get("method.ratio_mode", "row") != "row":
        return ("Fig. 13", f"Omega={v['method.ratio_mode']}", "accuracy")
    return ("Fig. 11", "Q=32", "accuracy")                        # the base run: Q=32, lambda 3, row


FIG10_14 = Impl(
    title="Ltri-LLM ablations on NIAH (restricted needle): persistence / retrieval heads / voting, Q, lambda, "
          "Omega, index vectors per block (Ltri-LLM Figs. 10-14)",
    sweeps={p: _ablations(p) for p in MEMORY},
    label=_ablation_label,
    render=R.ablations,
    setup={p: SETUP_NOTE[p] + f" One length ({ABL_LENGTHS[p][0]}), needle restricted to one block; base: Q=32, "
           "lambda 3, Omega row, persistent, voting, retrieval heads. Fig. 14 = the index vectors per block "
           "each run stored, per layer." + (" Figs. 12/14 twice: at this profile's cap M=5 vectors per block (every "
           "lambda keeps 5) and uncapped (M=32, the block size), where lambda binds." if LAM_UNCAPPED[p] else "")
           for p in MEMORY},
    paper_setup="Llama-3-8B-Instruct-262K, NIAH. Fig. 10 (stated): the one-block restriction, Omega row, Q 32, lambda "
                "3. Figs. 11-13 vary Q, then lambda at Q 32, then Omega at the best Q and lambda; the restriction and "
                "the settings they do not vary are not stated for them: Fig. 10's are applied here (inferred).",
)

for _key, _impl in {"ltri.fig1-2": FIG12, "ltri.table1": TABLE1, "ltri.fig8": FIG8,
                    "ltri.fig10-14": FIG10_14}.items():
    register(_key, _impl)
