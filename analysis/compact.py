"""Compact, committed copies of the result runs that committed tables are rendered from.

results/runs/ is not committed (large, machine-local); a table rendered from it could not be checked
or re-rendered on another checkout. So every run a rendered table uses is copied, in this compact
form, to results/rows/<task>/<model>/<method>/<run id>.jsonl (committed), and tables are rendered
from those copies only: a fresh clone re-renders them byte for byte with no model run.

File format (JSON Lines): line 1 is the header: the run's id, resolved config (minus the
machine-local runner keys), whether it finished, its commit, device and dtype, the method's budget
semantics, the task's protocol, and the column names; every further line is one sample as a list
in those columns: its id, its task parameters (params.*), its metrics (metrics.*) and the few method
statistics of KEPT_ATTENDED (attended.*). Predictions, timings and the other attention statistics
stay in results/runs.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FORMAT = "sparse-decode-harness compact rows 1"
LOCAL_KEYS = {"runner": ("wandb", "progress", "results_dir")}    # where/how it logged, not what it ran
GROUPS = ("params", "metrics", "attended")
# method statistics worth committing (per-sample facts some items plot: Ltri-LLM's needle recall by
# layer and step, index vectors per block); the rest of `attended` (per-layer counts) stays in runs/
KEPT_ATTENDED = ("needle_recall", "vectors_per_block", "index_vectors")


def path_for(root: Path, task: str, model: str, method: str, run_id: str) -> Path:
    return Path(root) / task / model / method / f"{run_id}.jsonl"


def _portable(config: dict) -> dict:
    out = json.loads(json.dumps(config, default=str))
    for group, keys in LOCAL_KEYS.items():
        for k in keys:
            (out.get(group) or {}).pop(k, None)
    return out


def encode(run_id: str, config: dict, samples: list[dict], complete: bool, time: float,
           commit: str | None) -> str:
    """The compact text of one run (deterministic: equal inputs give equal bytes)."""
    columns = ["id"] + [f"{g}.{k}" for g in GROUPS for k in sorted({k for s in samples for k in (s.get(g) or {})})
                        if g != "attended" or k in KEPT_ATTENDED]
    first = samples[0] if samples else {}
    head = {"format": FORMAT, "run_id": run_id, "task": config["task"]["name"], "model": config["model"]["name"],
            "method": config["method"]["name"], "complete": bool(complete), "n_rows": len(samples),
            "time": round(float(time), 3), "commit": commit, "device": first.get("device"),
            "dtype": first.get("dtype"), "semantics": first.get("semantics"), "protocol": first.get("protocol"),
            "config": _portable(config), "columns": columns}
    lines = [json.dumps(head, sort_keys=True, default=str)]
    for s in samples:
        row = [s.get("id")]
        for col in columns[1:]:
            group, key = col.split(".", 1)
            row.append((s.get(group) or {}).get(key))
        lines.append(json.dumps(row, default=str))
    return "\n".join(lines) + "\n"


def read_head(path: Path) -> dict[str, Any]:
    with open(path) as f:
        head = json.loads(f.readline())
    if head.get("format") != FORMAT:
        raise ValueError(f"{path}: not a compact rows file of this version ({head.get('format')!r})")
    return head


def read_rows(path: Path) -> list[dict]:
    """The samples back as run rows: {"id", "params": {...}, "metrics": {...}, "attended": {...}}."""
    lines = Path(path).read_text().splitlines()
    columns = json.loads(lines[0])["columns"]
    out = []
    for line in lines[1:]:
        if not line.strip():
            continue
        values = json.loads(line)
        row: dict[str, Any] = {"id": values[0], **{g: {} for g in GROUPS}}
        for col, v in zip(columns[1:], values[1:]):
            group, key = col.split(".", 1)
            if v is not None:
                row[group][key] = v
        out.append(row)
    return out


def export(cells, root: Path) -> dict[str, int]:
    """Copy the run each cell uses from results/runs into the compact store under `root`.

    Only runs read from results/runs are copied; a copy is written when absent or holding fewer
    rows (never replaced by fewer), so export only ever adds rows. Returns counts per outcome."""
    counts = {"written": 0, "unchanged": 0, "committed": 0, "kept (fewer rows here)": 0}
    seen = set()
    for c in cells:
        run = c.run
        if run is None or run.n_rows == 0 or run.source == "view" or (run.source, run.path) in seen:
            continue                  # (nothing kept yet; a view's run is exported through its own cell)
        seen.add((run.source, run.path))
        if run.source != "runs":
            counts["committed"] += 1
            continue
        summary, rows = _summary(run.path), run.rows()
        # the time of its last sample, not a file's mtime: a copy of the same rows is the same text
        time = max((r["timestamp"] for r in rows if isinstance(r.get("timestamp"), (int, float))), default=run.mtime)
        text = encode(run.run_id, run.config, rows, run.has_summary, time,
                      (summary.get("environment") or {}).get("git_commit"))
        dest = path_for(root, c.values["task"], c.values["model"], c.values["method"], run.run_id)
        if dest.exists():
            old = read_head(dest)
            if _same(dest.read_text(), text):
                counts["unchanged"] += 1
                continue
            if (old["n_rows"], old["complete"]) > (run.n_rows, run.has_summary):
                counts["kept (fewer rows here)"] += 1
                continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(text)
        counts["written"] += 1
    return counts


def _same(a: str, b: str) -> bool:
    """Equal copies of a run, whatever their `time` (a file's mtime where samples carry no timestamp)."""
    (ha, _, ra), (hb, _, rb) = a.partition("\n"), b.partition("\n")
    da, db = json.loads(ha), json.loads(hb)
    da.pop("time", None)
    db.pop("time", None)
    return da == db and ra == rb


def _summary(run_dir: Path) -> dict:
    p = Path(run_dir) / "summary.json"
    try:
        return json.loads(p.read_text()) if p.exists() else {}
    except json.JSONDecodeError:
        return {}
