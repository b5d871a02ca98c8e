"""TidalDecode Figs. 1 and 3: the tokens each layer's exact top-k holds at one decode step
(bench/tidal_topk.py writes them through the engine; a dense probe on TidalDecode's own selection kernel
and rule, per query head as the reference selects).

Fig. 1 (the paper): one decoding step of Llama3-8B-Instruct on a 51-token prompt ("... The magic number
is: 15213 ... Answer: "; the model answers 15213); columns are layers, rows the tokens of the KV cache,
and the 5 tokens (10% sparsity) of highest attention score of the first attention head are yellow. The
claim: "strong spatial coherence", consecutive layers pick the same tokens. No numbers are printed.
Ours: the same prompt (raw text) on the embedded model, the first decode step (the prompt's greedy next
token fed back, attending the whole cache, itself included), top-5 of query head 0 per layer (left, as
the paper) and the share of all query heads whose top-5 holds each token (right).

Fig. 3 (the paper): LLaMA-3-8B, NIAH on PG-19-mini at 100K tokens, 100 requests, full attention, the top
256 tokens of each layer: (a) the overlap ratio |T_i ∩ T_j| / 256 of every pair of layers, (b) the
average recall of the tokens TidalDecode's sparse layers reuse, per choice of re-selection layer: below
20% without re-selection, almost 40% with layer 13, layers 11 and 13 best. Ours: the embedded model on
the harness's NIAH prompts (tasks/niah.py, TidalDecode's needle protocol) at 4096 tokens on the built-in
noise haystack (the repository ships no PG-19 text; the generator, haystack and length of the embedded
tidal.table1 and tidal.table7-12), one prompt per depth, 10 depths = 10 prompts (a CPU run on a shared
2-core machine, 2-4 minutes a prompt; the paper has 100; the intervals over prompts show the spread),
k = 256 (6.2% of the cache, where the paper's 256 of 100K is 0.26%: chance overlap k/N is in the table). Overlap per query head (the head index TidalDecode
reuses a set under), averaged over heads and prompts. Recall: every layer after the first selection layer
(layer 2: layers 0-1 dense, the method default) that is not a selection layer reuses the set of the latest
selection layer before it; recall = |T_src ∩ T_layer| / k averaged over those layers and heads, per prompt,
then its mean over prompts with a 95% normal interval. "KV-head sets" repeats (b) with one set per KV head
(tidal select=kv_head: the group's summed probabilities). Layers are numbered from 0, as
method.reselect_layer; the paper's "Layer 3" (its purple box) is its first selection layer, i.e. 0-based
layer 2 if the figure counts from 1 (not stated). These are oracle recalls on full-attention hidden states,
as the paper's; they do not run TidalDecode.
"""
from __future__ import annotations

import math

import pandas as pd

from analysis import provenance, render
from analysis.catalogue import Bench, BenchFile, Impl, paper_numbers, register
from analysis.stats import interval

NUMBERS = paper_numbers("tidal")
MEASURES = ("bench/tidal_topk.py", "methods/parts/selection.py", "methods/full.py", "kernels/attention.py",
            "kernels/topk.py", "runners/engine.py")
FIG1_FILES = [
    BenchFile("tidal_topk_fig1_smollm2.json", "python -m bench.tidal_topk fig1 --model smollm2", MEASURES, gpu=False),
    BenchFile("tidal_topk_fig1_llama3.json", "python -m bench.tidal_topk fig1 --model llama3 --hub-id "
              "meta-llama/Meta-Llama-3-8B-Instruct --dtype bfloat16", MEASURES)]
FIG3_FILES = [
    BenchFile("tidal_topk_fig3_smollm2.json", "python -m bench.tidal_topk fig3 --model smollm2 --rounds 1",
              MEASURES + ("tasks/niah.py",), gpu=False),
    BenchFile("tidal_topk_fig3_llama3.json", "python -m bench.tidal_topk fig3 --model llama3 --haystack pg19 "
              "--length 100000 --rounds 10 --dtype bfloat16", MEASURES + ("tasks/niah.py",))]
COLUMNS = ["block", "row", "col", "ours", "ci_lo", "ci_hi", "n", "unit", "file"]


def _frame(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=COLUMNS)


def _cell(x: dict) -> str:
    if x["ours"] is None or (isinstance(x["ours"], float) and math.isnan(x["ours"])):
        return render.DASH
    if x["ci_lo"] is None:
        return f"{x['ours']:.1f}%"
    return f"{x['ours']:.1f}% [{x['ci_lo']:.1f}–{x['ci_hi']:.1f}]"


def _md_table(rows: list[dict], row_title: str) -> str:
    cols = list(dict.fromkeys(r["col"] for r in rows))
    out = ["| " + " | ".join([row_title, *cols, "n"]) + " |", "|" + "---|" * (len(cols) + 2)]
    for name in dict.fromkeys(r["row"] for r in rows):
        cells = {r["col"]: r for r in rows if r["row"] == name}
        n = next(iter(cells.values()))["n"]
        out.append("| " + " | ".join([str(name), *(_cell(cells[c]) if c in cells else "" for c in cols), str(n)]) + " |")
    return "\n".join(out) + "\n"


def _label(token: str) -> str:
    """A token as a tick label: whitespace made visible, no mathtext."""
    return repr(token) if not token.strip() else token.replace("$", r"\$")


def _present(sources):
    return [s for s in sources if s.data is not None]


def _head(item, impl, sources) -> str:
    return (f"# {item.key}: {impl.title}\n\nOurs: {impl.setup['embedded']}\nPaper profile: {impl.setup['paper']}\n"
            f"Paper: {impl.paper_setup}\n")


# --- Fig. 1 ---------------------------------------------------------------------------------------
def head_overlap(top: list[list[int]], min_gap: int, max_gap: int | None = None) -> float:
    """Mean |T_i ∩ T_j| / k of the drawn head over layer pairs min_gap <= j - i (<= max_gap)."""
    sets = [{p for p in t if p >= 0} for t in top]
    k = len(top[0])
    vals = [len(sets[i] & sets[j]) / k for i in range(len(sets)) for j in range(i + min_gap, len(sets))
            if max_gap is None or j - i <= max_gap]
    return sum(vals) / len(vals)


def fig1_summary(d: dict, name: str) -> list[dict]:
    """Top-k overlap of adjacent layers (drawn head, all query heads) and of layers 8+ apart (drawn head),
    beside chance k/N."""
    adj, head, n, L = d["adjacent"], d["head"], len(d["tokens"]), d["layers"]
    flat = [x for row in adj for x in row]
    cells = [("adjacent layers (l, l+1), mean", f"query head {head}", sum(r[head] for r in adj) / len(adj), len(adj)),
             ("adjacent layers (l, l+1), mean", "all query heads", sum(flat) / len(flat), len(adj)),
             ("adjacent layers (l, l+1), mean", "chance k/N", d["k"] / n, len(adj))]
    if L > 8:
        cells += [("layers 8 or more apart, mean", f"query head {head}", head_overlap(d["top"], 8), (L - 8) * (L - 7) // 2),
                  ("layers 8 or more apart, mean", "chance k/N", d["k"] / n, (L - 8) * (L - 7) // 2)]
    return [{"block": d["model"], "row": row, "col": col, "ours": 100 * v, "ci_lo": None, "ci_hi": None, "n": m,
             "unit": "%", "file": name} for row, col, v, m in cells]


def render_fig1(item, impl, sources, out):
    present = _present(sources)
    plt = render._plt()
    fig, axes = plt.subplots(1, 2 * max(1, len(present)), figsize=(9 * max(1, len(present)), 11), squeeze=False)
    rows, md = [], [_head(item, impl, sources)]
    for i, src in enumerate(present):
        d = src.data
        L, toks, head = d["layers"], d["tokens"], d["head"]
        mask = [[1.0 if t in d["top"][layer] else 0.0 for layer in range(L)] for t in range(len(toks))]
        share = [[d["head_share"][layer][t] for layer in range(L)] for t in range(len(toks))]
        for ax, grid, title in ((axes[0][2 * i], mask, f"top-{d['k']} of query head {head} (yellow)"),
                                (axes[0][2 * i + 1], share, (f"share of the {d['query_heads']} query heads whose "
                                                            f"top-{d['k']} holds the token"))):
            im = ax.imshow(grid, aspect="auto", cmap="viridis", vmin=0, vmax=1, interpolation="nearest")
            ax.set_yticks(range(len(toks)), [_label(t) for t in toks], fontsize=5)
            ax.set_xticks(range(0, L, 2), range(0, L, 2), fontsize=6)
            ax.set_xlabel("layer", fontsize=7)
            ax.set_title(f"{d['model']}: {title}", fontsize=8)
        fig.colorbar(im, ax=axes[0][2 * i + 1], fraction=0.04)
        summary = fig1_summary(d, src.name)
        rows += summary
        md += [f"\n### {d['model']} ({src.name})\n",
               (f"{d['prompt_tokens']} prompt tokens; the step analysed feeds the greedy first answer token "
               f"{d['query_token']!r}; the model's greedy answer: {d['model_answer']!r}. Top-{d['k']} = "
               f"{100 * d['k'] / len(toks):.0f}% of the {len(toks)} cached tokens.\n"),
               _md_table(summary, "top-k overlap"),
               f"\nQuery head {head}'s top-{d['k']} per layer (cache positions: tokens):\n"]
        md += [f"- L{layer}: " + ", ".join(f"{p}: {toks[p]!r}" for p in d["top"][layer] if p >= 0)
               for layer in range(L)]
    if not present:
        axes[0][0].set_axis_off()
        md.append("\nNot measured yet.\n")
    md.append("\n" + __doc__.split("\n\nFig. 3")[0].split("\n\n", 1)[1] + "\n" + provenance.markdown(sources))
    fig.suptitle(f"{item.key}: exact top-k tokens per layer at one decode step (rows: cached tokens)", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    return render.write(out, item.key, "\n".join(md), _frame(rows), fig)


# --- Fig. 3 ---------------------------------------------------------------------------------------
def recall_rows(d: dict, name: str) -> list[dict]:
    """Recall per re-selection choice, mean over prompts with a 95% interval, per set granularity."""
    out = []
    for key, col in (("recall_query_head", "query-head sets (reference)"), ("recall_kv_head", "KV-head sets")):
        for j, r in enumerate(d["reselect"]):
            vals = [s[key][j] for s in d["samples"]]
            lo, hi, _ = interval(vals)
            out.append({"block": d["model"], "row": "none" if r == "none" else f"L{r}", "col": col,
                        "ours": 100 * sum(vals) / len(vals), "ci_lo": 100 * lo, "ci_hi": 100 * hi, "n": len(vals),
                        "unit": "%", "file": name})
    return out


def overlap_by_distance(d: dict, distances=(1, 2, 4, 8, 16)) -> list[tuple[int, float]]:
    """Mean overlap of the layer pairs (i, i+dist), i from the first selection layer on."""
    ov, first = d["overlap_mean"], d["first_layer"]
    L = len(ov)
    return [(dist, sum(ov[i][i + dist] for i in range(first, L - dist)) / (L - dist - first))
            for dist in distances if L - dist > first]


def _fig3_text(d: dict, rows: list[dict], name: str) -> list[str]:
    q = [r for r in rows if r["col"].startswith("query")]
    none, rest = q[0], q[1:]
    best = max(rest, key=lambda r: r["ours"])
    n_tok = sum(s["tokens"] for s in d["samples"]) / len(d["samples"])
    answered = sum(s["answered"] for s in d["samples"])
    dist = ", ".join(f"{k}: {100 * v:.1f}%" for k, v in overlap_by_distance(d))
    return [f"\n### {d['model']} ({name})\n",
            (f"{len(d['samples'])} NIAH prompts, {d['haystack']} haystack, {n_tok:.0f} tokens; full attention answers "
            f"{answered:.0f} of them. Top-{d['k']} = {100 * d['k'] / (n_tok + 1):.1f}% of the cache, so two random "
            f"sets overlap by {100 * d['k'] / (n_tok + 1):.1f}% on average.\n"),
            (f"(a) Mean overlap of layer pairs (i, i+d) from the first selection layer (L{d['first_layer']}) on, by "
            f"distance d: {dist}.\n"),
            (f"(b) Recall without re-selection: {_cell(none)}; best re-selection layer L{best['row'][1:]}: "
            f"{_cell(best)} (query-head sets). Paper (LLaMA-3-8B, 100K, 32 layers): below 20% without, almost "
            f"40% at layer 13, layers 11 and 13 best.\n")]


def render_fig3(item, impl, sources, out):
    present = _present(sources)
    plt = render._plt()
    fig, axes = plt.subplots(max(1, len(present)), 2, figsize=(13, 5.5 * max(1, len(present))), squeeze=False)
    rows, md = [], [_head(item, impl, sources)]
    for (ax_a, ax_b), src in zip(axes, present):
        d = src.data
        rec = recall_rows(d, src.name)
        rows += rec
        md += _fig3_text(d, rec, src.name) + ["\n" + _md_table(rec, "re-selection layer")]
        ov, first = d["overlap_mean"], d["first_layer"]
        L = len(ov)
        im = ax_a.imshow(ov, cmap="viridis", vmin=0, vmax=1, interpolation="nearest")
        fig.colorbar(im, ax=ax_a, fraction=0.046)
        best = max((r for r in rec if r["col"].startswith("query") and r["row"] != "none"), key=lambda r: r["ours"])
        for layer, color in ((first, "magenta"), (int(best["row"][1:]), "red")):   # the paper's purple / red boxes
            ax_a.add_patch(plt.Rectangle((layer + 0.5, layer - 0.5), L - layer - 1, 1, fill=False, ec=color, lw=1.5))
        ax_a.set_xlabel("layer j", fontsize=8)
        ax_a.set_ylabel("layer i", fontsize=8)
        ax_a.set_title(f"(a) {d['model']}: top-{d['k']} overlap |Ti ∩ Tj| / k (mean over heads, {len(d['samples'])} "
                       f"prompts); boxes: L{first} (first selection), L{best['row'][1:]} (best re-selection)", fontsize=7)
        for col, style in (("query-head sets (reference)", "-o"), ("KV-head sets", "--s")):
            pts = [r for r in rec if r["col"] == col]
            xs = [int(r["row"][1:]) for r in pts[1:]]
            ys = [r["ours"] for r in pts[1:]]
            ax_b.errorbar(xs, ys, yerr=[[max(0.0, y - r["ci_lo"]) for y, r in zip(ys, pts[1:])],
                                        [max(0.0, r["ci_hi"] - y) for y, r in zip(ys, pts[1:])]],
                          fmt=style, ms=3, capsize=2, label=f"{col}: re-selection at layer x")
            ax_b.axhline(pts[0]["ours"], ls=":", color=ax_b.lines[-1].get_color(), label=f"{col}: none")
        ax_b.axhline(100 * d["k"] / (d["samples"][0]["tokens"] + 1), color="grey", lw=0.8, label="chance k/N")
        ax_b.set_xlabel("re-selection layer", fontsize=8)
        ax_b.set_ylabel("recall of the reused sets (%)", fontsize=8)
        ax_b.set_title(f"(b) {d['model']}: recall vs re-selection layer (mean, 95% interval over prompts)", fontsize=7)
        ax_b.grid(alpha=0.3)
        ax_b.legend(fontsize=6)
    if not present:
        axes[0][0].set_axis_off()
        axes[0][1].set_axis_off()
        md.append("\nNot measured yet.\n")
    md.append("\nFig. 3" + __doc__.split("\n\nFig. 3", 1)[1] + "\n" + provenance.markdown(sources))
    fig.suptitle(f"{item.key}: top-{(present[0].data['k'] if present else 256)} tokens across layers at one decode "
                 f"step", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    return render.write(out, item.key, "\n".join(md), _frame(rows), fig)


F1, F3 = NUMBERS["fig1"], NUMBERS["fig3"]
FIG1 = Impl(
    title="Top-k tokens per layer at one decode step (TidalDecode Fig. 1)",
    sweeps={}, label=lambda v: ("", "", ""), render=None, metric="overlap",
    setup={"embedded": "bench/tidal_topk.py fig1: SmolLM2-135M-Instruct, the paper's prompt as raw text, dense "
                       "attention (fp32, CPU), exact top-5 of q.k per layer at the first decode step.",
           "paper": f"`{FIG1_FILES[1].command}` (Meta-Llama-3-8B-Instruct from the hub; a GPU)."},
    paper_setup=f"{F1['model']}; a {F1['prompt_tokens']}-token prompt; top-{F1['k']} of head {F1['head']} per layer; "
                f"heat map only.",
    bench=Bench(FIG1_FILES, render_fig1))
FIG3 = Impl(
    title="Top-256 overlap between layers and recall vs re-selection layer (TidalDecode Fig. 3)",
    sweeps={}, label=lambda v: ("", "", ""), render=None, metric="recall",
    setup={"embedded": "bench/tidal_topk.py fig3: SmolLM2-135M-Instruct, 10 NIAH prompts (4096 tokens, noise "
                       "haystack, 10 depths x 1 round), dense attention (fp32, CPU), exact top-256 of q.k per layer "
                       "and query head at the first decode step.",
           "paper": f"`{FIG3_FILES[1].command}` (Llama-3-8B-Instruct-Gradient-1048k and PG-19 from the hub, "
                    f"10 depths x 10 rounds = 100 prompts; a GPU)."},
    paper_setup=f"{F3['model']}; NIAH on {F3['haystack']}, {F3['length']} tokens, {F3['samples']} requests, "
                f"top-{F3['k']}.",
    bench=Bench(FIG3_FILES, render_fig3))

register("tidal.fig1", FIG1)
register("tidal.fig3", FIG3)
