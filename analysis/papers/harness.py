"""harness.tpot: every registered method's decode cost in one table (issue 34), rendered from the one
benchmark file bench/every_method.py writes: per (context x batch) cell, decode ms/token, its floor
(bench/floors.py: weights + the KV rows, page bounds, representatives and score state it must read,
over the copy rate measured in the same run), the ratio, the speed-up over full attention measured
in the same process, prefill seconds (and their ratio to full's) and peak GPU memory. A method that
ran out of memory, failed, or was skipped by the run's time budget is a row that says so.

Not a paper item: no paper has this table. harness.pareto (harness_pareto.py) puts the speed-ups
beside one shared accuracy cell.
"""
from __future__ import annotations

import pandas as pd

from analysis import provenance, render
from analysis.catalogue import Bench, BenchFile, Impl, register

CODE = ("bench/every_method.py", "bench/timing.py", "bench/floors.py", "bench/engine.py", "runners/engine.py", "runners/graphs.py",
        "runners/layer_ops.py", "runners/models.py", "methods", "kernels", "conf/model/llama3.yaml")
# One file per cell or part of a cell: a cell of every method at 128K needs more than one 10-minute
# device call (prefills of 15-60 s each), so each cell is its own command and file, and a 128K cell is
# two (--shard: every other row, full attention in both as the reference of its speed-ups).
# --variants: InfLLM's and Ltri-LLM's device-resident path (offload=false), graph-captured, beside
# their faithful default (blocks in host memory behind an LRU cache: host-bound)
COMMAND_OF = ("python -m bench.every_method --model llama3 --weights random --cells {cell} --budget 4096 --warmup 3 "
              "--steps 12 --variants infllm:offload=false ltri:offload=false")
FILES = [BenchFile(f"every_method_llama3_{name}_h100.json", COMMAND_OF.format(cell=cell) + extra, CODE)
         for name, cell, extra in (("32k", "32768x1", ""), ("128k_s1of2", "131072x1", " --shard 1/2"),
                                   ("128k_s2of2", "131072x1", " --shard 2/2"), ("32kx8", "32768x8", ""))]
FILE = FILES[0]                 # 32K batch 1: harness.pareto's speed axis
COMMAND = FILE.command
COLUMNS = ["cell", "method", "status", "decode_ms", "floor_ms", "over_floor", "speedup_vs_full", "prefill_s",
           "prefill_vs_full", "first_decode_s", "peak_gib", "graphs", "heads", "note", "file"]


def cell_name(context: int, batch: int) -> str:
    return f"{round(context / 1024)}K B={batch}"


def table(sources) -> pd.DataFrame:
    """One line per (cell, method) of every file, in the file's order (cells as run, full first)."""
    out = []
    for src in sources:
        shard = (src.data or {}).get("shard", "1/1")
        for r in src.rows:
            note = r.get("error") or r.get("floor_note") or ""
            method = r["method"]
            if method == "full" and not shard.startswith("1/"):   # each part's own reference, in its process
                method = f"full (reference of part {shard})"
            out.append({"cell": cell_name(r["context"], r["batch"]), "method": method,
                        "status": r.get("status", "ok"), **{k: r.get(k) for k in COLUMNS[3:12]},
                        "heads": r.get("heads") or "", "note": note, "file": src.name})
    return pd.DataFrame(out, columns=COLUMNS)


def _num(v, fmt: str) -> str:
    return render.DASH if v is None or pd.isna(v) else format(v, fmt)


def markdown(df: pd.DataFrame) -> str:
    lines = []
    for cell in df["cell"].unique():
        b = df[df["cell"] == cell]
        lines += [f"\n### {cell}\n",
                  ("| method | decode ms | floor ms | x floor | speed-up over full | prefill s | prefill / full | "
                  "1st step s | peak GiB | graph | note |"), "|---|---|---|---|---|---|---|---|---|---|---|"]
        for _, r in b.iterrows():
            if r["status"] != "ok":
                lines.append(f"| {r['method']} | **{r['status']}** | | | | | | | | | {r['note']} |")
                continue
            lines.append(f"| {r['method']} | {_num(r['decode_ms'], '.2f')} | {_num(r['floor_ms'], '.2f')} | "
                         f"{_num(r['over_floor'], '.2f')}x | {_num(r['speedup_vs_full'], '.2f')}x | "
                         f"{_num(r['prefill_s'], '.2f')} | {_num(r['prefill_vs_full'], '.2f')}x | {_num(r['first_decode_s'], '.2f')} | "
                         f"{_num(r['peak_gib'], '.1f')} | {'yes' if r['graphs'] else 'no'} | {r['note']} |")
    return "\n".join(lines) + "\n"


def header(item, impl, sources) -> str:
    d = next((s.data for s in sources if s.data), {}) or {}
    heads = sorted({f"{r['method']}: {r['heads']}" for s in sources for r in s.rows if r.get("heads")})
    rates = [(s.name, s.data.get("bandwidth_bytes_s")) for s in sources if s.data]
    # each file measures its own copy rate: say each (a cold GPU's first copy can read low, and a
    # lower rate makes every floor of that file higher and its x-floor lower)
    rate_text = "; ".join(f"{(bw or 0) / 1e12:.2f} TB/s in {name}" for name, bw in rates) or "?"
    skipped = sum(r.get("status") == "skipped" for s in sources for r in s.rows)
    lines = [f"# {item.key}: {impl.title}", "",
             (f"Ours: {impl.setup['paper']} Device: **{d.get('device', '?')}**; {d.get('dtype', '?')}; "
             f"{d.get('weights', '?')} weights. Budget K = {d.get('budget', '?')} tokens per head for every "
             f"method ({d.get('budget_knob', '')}). Heads: {'; '.join(heads) or 'none needed'}."),
             "", (f"Decode ms: median of {d.get('steps', '?')} steps timed one by one with CUDA events after "
             f"{d.get('warmup', '?')} warm-up steps (CUDA graphs where the method is graph-safe: column `graph`); "
             f"floor: bytes the step must read (bench/floors.py) over "
             f"the copy rate measured in each file's run ({rate_text}); speed-up over full and prefill / "
             f"full: against full attention in the same cell of the same process; 1st step s: the first decode "
              f"step (graph capture, and work done once before decoding, e.g. Tactic's clustering); peak GiB: "
             f"{d.get('peak_note', '')}."),
             (f"Cells run in order; in each, full attention first (the file says in which order the others ran); a cell whose projected prefill would end past "
             f"the run's time budget ({d.get('time_budget_s', '?')} s, the env BENCH_TIME_BUDGET) is **skipped** "
             f"({skipped} here), a failure is a row with its error. Whole run: {d.get('elapsed_s', 0):.0f} s."
             + "".join(f" {s.name} ended before its last row (the call's time limit): the rows it did not reach are "
                       "skipped." for s in sources if s.data and s.data.get("complete") is False))]
    return "\n".join(lines) + "\n" + provenance.markdown(sources)


def figure(df: pd.DataFrame):
    plt = render._plt()
    cells = list(df["cell"].unique()) or [""]
    fig, axes = plt.subplots(1, len(cells), figsize=(4.2 * len(cells), 5.5), sharey=True, squeeze=False)
    methods = list(dict.fromkeys(df["method"]))
    for ax, cell in zip(axes[0], cells):
        b = df[(df["cell"] == cell)].set_index("method")
        ys = range(len(methods))
        ms = [b.loc[m, "decode_ms"] if m in b.index and b.loc[m, "status"] == "ok" else 0 for m in methods]
        fl = [b.loc[m, "floor_ms"] if m in b.index and b.loc[m, "status"] == "ok" else float("nan") for m in methods]
        ax.barh(list(ys), ms, color="tab:blue", label="decode ms")
        ax.scatter(fl, list(ys), color="black", marker="|", s=120, label="floor", zorder=3)
        for y, m in zip(ys, methods):
            if m in b.index and b.loc[m, "status"] != "ok":
                ax.text(0, y, f" {b.loc[m, 'status']}", va="center", fontsize=7, color="tab:red")
        ax.set_title(cell)
        ax.set_xlabel("decode ms / token")
        if any(v > 0 for v in ms):                     # a cell with no measured row has nothing to scale
            ax.set_xscale("log")
    axes[0][0].set_yticks(range(len(methods)), methods)
    axes[0][0].invert_yaxis()
    axes[0][-1].legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    return fig


def render_tpot(item, impl, sources, out_root) -> list:
    df = table(sources)
    md = header(item, impl, sources) + markdown(df)
    df = df.assign(provenance=df["file"].map({s.name: s.short() for s in sources}))
    return render.write(out_root, item.key, md, df, figure(df))


SETUP = ("bench/every_method.py over every registered method (the registry, no list), Llama-3-8B shape (32 "
         "layers, 32/8 heads, D 128), random weights, each method with its YAML defaults and its budget option "
         "at K; contexts x batches as the cells say (batch 8 only at 32K: full attention's KV cache at 128K x 8 "
         "is 128 GiB).")
register("harness.tpot", Impl(title="every method's decode cost: ms, x its floor, speed-up over full, prefill, "
                              "peak memory", sweeps={}, label=lambda v: ("", "", ""), render=None, metric="ms",
                              setup={"paper": SETUP}, paper_setup="none: no paper has this table.",
                              bench=Bench(FILES, render_tpot)))
