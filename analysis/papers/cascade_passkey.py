"""Cascading KV Cache passkey items: Figs. 2 and 8 (accuracy 32K-1M, cache 32K/65K, 8 cascades vs
StreamingLLM) and Fig. 12 (the number of cascades at a 4K cache, 4K-262K, and the accuracy the token
span predicts).

Protocol (tasks/passkey_digits.py, the reference's dataset/passkey.py + jobs/passkey.py): a 5-digit key
in random dictionary words, 5 insertion bins, greedy, per-digit accuracy (random digits score 10%). A
cell is one context length, all bins. StreamingLLM = the cascade cache with one cascade (the
reference's `-c 1`), same cache, sinks and stride (4096, the reference's passkey stride).

Profiles. `paper`: llama31_8b (Llama-3.1-8B-Instruct), the reference's Llama-3.1 prompt strings,
20 samples per bin. `embedded`: SmolLM2-135M-Instruct (its chat template), caches 2048/4096 (paper:
32K/65K) at the paper's lengths 32K-1M (the cache is then 1/16-1/512 of the context, vs 1/32-1/16 in
the paper), stride 1024 (sink + cache + stride must fit its 8K positions), 4 samples per bin (n=20 per
length: Wilson intervals of about +-20 points at 50%); Fig. 12 at the paper's 4K cache and 4K-262K.
These run on a GPU (analysis/device_sweep.sh; runner.batch_size batches a length's samples).
"""
from __future__ import annotations

from analysis import render
from analysis.catalogue import Impl, register
from analysis.papers.cascade_render import facts_note, header, lines_figure, tables

LENGTHS = [32768, 65536, 131072, 262144, 524288, 1048576]
CASCADES_FIG12 = [1, 2, 4, 8, 16, 32]
LENGTHS_FIG12 = [4096 * 2 ** i for i in range(7)]          # 4K .. 262K


def _lengths(ls) -> str:
    return ",".join(f"[{n}]" for n in ls)


def task(profile: str, lengths) -> list[str]:
    out = ["task=passkey_digits", f"task.lengths={_lengths(lengths)}"]
    if profile == "embedded":
        out += ["task.template=chat", "task.samples_per_bin=4"]
    return out


def cascade(cache: int, cascades, stride: int) -> list[str]:
    return ["method=cascade", "method.sink=64", f"method.cache_size={cache}", f"method.cascades={cascades}",
            f"method.stride={stride}"]


PROFILES = {"paper": ("llama31_8b", [32768, 65536], 4096, 4096),
            "embedded": ("smollm2", [2048, 4096], 1024, 4096)}


def _fig8_sweeps(profile: str, caches=None) -> list[list[str]]:
    model, paper_caches, stride, _ = PROFILES[profile]
    return [[*task(profile, LENGTHS), f"model={model}", *cascade(c, "1,8", stride)] for c in (caches or paper_caches)]


def _row(v: dict) -> str:
    n = int(v["method.cascades"])
    return "Streaming LLM" if n == 1 else f"Cascade ({n} cascades)"


def _label(v: dict):
    return f"cache {v['method.cache_size']}", _row(v), int(v["task.lengths"][0])


EMBEDDED_NOTE = """
Embedded profile: the model, not the cache, sets these numbers. SmolLM2-135M-Instruct itself (HF
transformers `generate`, full attention, greedy, this prompt; 2026-11-25, CPU) returns the key at a
1K context only when it sits in the first depth bin (1 of 5 samples; the others answer "The pass key
is $:"), and at 4K in none (HF: 0 of 1; the engine's full attention: 0 of 10, digit accuracy 0). Every
cell here sits at or below chance (10%): the figure's shape is not reproducible with this model.
"""


def _render(notes: str):
    def fn(item, impl, df, profile, out):
        md = (header(item, impl, profile, df, "per-digit passkey accuracy in % over the 5 insertion bins "
                     "(random digits: 10%)") + tables(df, 0, col_name=lambda c: f"{int(c) // 1024}K", row_title="Method")
              + notes + (EMBEDDED_NOTE if profile == "embedded" else "") + facts_note(item.key))
        fig = lines_figure(df, f"{item.key} ({profile}): passkey accuracy vs context", "context (tokens)",
                           "digit accuracy (%)", ylim=(-3, 103),
                           extra=lambda ax, block: ax.axhline(10, color="0.6", ls=":", lw=1))
        return render.write(out, item.key, md, df, fig)
    return fn


FIG8_NOTES = """
Notes. The paper plots these (no values printed); its facts are quoted below. Per-bin accuracies are
in each run's rows (params.bin). 64 sinks on top of the cache; beta 0.9999999, head reduction max.
"""
FIG8 = Impl(
    title="Passkey accuracy 32K-1M, cascades vs StreamingLLM (Cascading Fig. 8)",
    sweeps={p: _fig8_sweeps(p) for p in PROFILES}, label=_label, render=_render(FIG8_NOTES),
    setup={"paper": "llama31_8b, passkey_digits (reference strings), 5 bins x 20, caches 32768/65536, 8 cascades "
                    "vs 1, stride 4096.",
           "embedded": "SmolLM2-135M-Instruct (chat template), 5 bins x 4, caches 2048/4096, 8 cascades vs 1, "
                       "stride 1024."},
    paper_setup="LLaMA3.1-8B-Instruct, caches 32K/65K, 8 cascades, stride 4K, 5 bins x 20 per length.",
    metric="digit_acc",
)
FIG2 = Impl(
    title="Passkey accuracy up to 1M at the larger cache (Cascading Fig. 2)",
    sweeps={p: _fig8_sweeps(p, [PROFILES[p][1][-1]]) for p in PROFILES}, label=_label, render=_render(FIG8_NOTES),
    setup={"paper": "the 65536 half of Fig. 8.", "embedded": "the 4096 half of Fig. 8 (SmolLM2)."},
    paper_setup="LLaMA3.1-8B-Instruct, cache 65K, 8 cascades (the 65K half of Fig. 8).",
    metric="digit_acc",
)


# --- Fig. 12: the number of cascades ---------------------------------------------------------------
def _fig12_sweeps(profile: str) -> list[list[str]]:
    model, _, stride, cache = PROFILES[profile]
    n = ",".join(map(str, CASCADES_FIG12))
    return [[*task(profile, LENGTHS_FIG12), f"model={model}", *cascade(cache, n, stride)]]


def predicted(cascades: int, cache: int, length: int, sink: int = 64) -> float:
    """Fig. 12b: the chance (%) that the key lies in the cache's token span (Eq. 4, plus the sinks)."""
    span = cache // cascades * (2 ** cascades - 1) + sink
    return 100.0 * min(1.0, span / length)


def _fig12_render(item, impl, df, profile, out):
    cache = PROFILES[profile][3]
    pred = df.copy()
    pred["ours"] = [predicted(int(r.split()[0]), cache, int(c)) if r[0].isdigit() else None
                    for r, c in zip(df["row"], df["col"])]
    pred[["ci_lo", "ci_hi"]] = float("nan")
    diff = df.copy()
    diff["ours"] = df["ours"] - pred["ours"]
    diff[["ci_lo", "ci_hi"]] = float("nan")
    md = (header(item, impl, profile, df, "per-digit passkey accuracy in %, averaged over the insertion bins")
          + "\n## (a) accuracy\n" + tables(df, 0, col_name=lambda c: f"{int(c) // 1024}K", row_title="Cascades")
          + "\n## (b) predicted from the token span: min(1, (|C|/N (2^N - 1) + sinks) / context)\n"
          + tables(pred.assign(n=0), 0, col_name=lambda c: f"{int(c) // 1024}K", row_title="Cascades")
          + "\n## (c) accuracy minus prediction (points)\n"
          + tables(diff.assign(n=0), 0, col_name=lambda c: f"{int(c) // 1024}K", row_title="Cascades")
          + facts_note(item.key))
    plt = render._plt()
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.6))
    for ax, frame, title in zip(axes, (df, pred, diff), ("(a) accuracy", "(b) predicted", "(c) a - b")):
        for i, r in enumerate(frame["row"].unique()):
            s = frame[frame["row"] == r].assign(x=lambda d: d["col"].astype(int)).sort_values("x")
            ax.plot(s["x"], s["ours"], "o-", color=f"C{i}", label=r)
        ax.set_xscale("log", base=2)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("context (tokens)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("%")
    axes[2].legend(fontsize=6)
    fig.suptitle(f"{item.key} ({profile}): number of cascades at a {cache}-token cache", fontsize=9)
    return render.write(out, item.key, md, df, fig)


FIG12 = Impl(
    title="Number of cascades vs passkey accuracy at a 4K cache, with the token-span prediction (Cascading Fig. 12)",
    sweeps={p: _fig12_sweeps(p) for p in PROFILES},
    label=lambda v: ("", f"{int(v['method.cascades'])} cascades", int(v["task.lengths"][0])),
    render=_fig12_render,
    setup={"paper": "llama31_8b, cache 4096 (+64 sinks), 1-32 cascades, 4K-262K, 5 bins x 20, stride 4096.",
           "embedded": "SmolLM2-135M-Instruct, cache 4096 (+64 sinks), 1-32 cascades, 4K-262K, 5 bins x 4, "
                       "stride 1024."},
    paper_setup="LLaMA3.1-8B-Instruct (Table 5: ablation), cache 4K, contexts 4K-262K, averaged over insertion "
                "locations (cascade counts and samples not stated).",
    metric="digit_acc",
)

for _key, _impl in {"cascade.fig8": FIG8, "cascade.fig2": FIG2, "cascade.fig12": FIG12}.items():
    register(_key, _impl)
