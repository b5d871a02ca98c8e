"""Which option sets each method's token budget (tokens per head), so that a benchmark or an
accuracy-vs-speed view can run every method at one budget ratio. It lives with the methods (not in
bench/) because analysis/ renders from it too, and analysis may not import bench."""
from __future__ import annotations

from collections.abc import Callable

BUDGET_KNOB: dict[str, Callable[[int], dict]] = {
    "full": lambda k: {}, "minference": lambda k: {},
    **{n: (lambda k: {"budget": k}) for n in ("quest", "tidal", "h2o", "tova", "snapkv", "pyramidkv", "bigbird",
                                               "truncate", "lychee", "streaming_llm", "duo")},
    "cascade": lambda k: {"cache_size": k}, "minference_cascade": lambda k: {"cache_size": k},
    "lm_infinite": lambda k: {"local_branch": k},
    **{n: (lambda k: {"n_local": k, "exc_block_size": min(512, k)}) for n in ("infllm", "ltri")},
    "tactic": lambda k: {"mode": "topk", "budget": k},
}
KNOB_NOTE = ("budget K = tokens per head: `budget` (Quest, TidalDecode, H2O, TOVA, SnapKV, PyramidKV, BigBird, "
             "truncate, LycheeDecode, StreamingLLM, DuoAttention's streaming heads), `cache_size` (Cascade, "
             "MInference+Cascade), `local_branch` (LM-Infinite), `n_local` (InfLLM, Ltri-LLM: plus their "
             "n_init sinks and topk retrieved blocks), Tactic in top-k mode with `budget`; Full and MInference "
             "decode densely")
