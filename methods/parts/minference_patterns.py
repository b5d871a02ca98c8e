"""MInference's three head patterns: the per-head pattern files, the online index estimation and
the masked sparse prefill (helpers of methods/minference.py and offline/minference_search.py).

Everything follows microsoft/MInference; the reference file/function of each rule is named where
it is implemented. Positions are absolute: a prefill over keys [0, N) whose queries sit at q_pos
(the whole prompt in the reference, where q_pos = 0..N-1). Shapes per head: q [B, T, D] rotated,
k, v [B, N, D] rotated (the reference repeats the KV heads and treats each query head alone).

A pattern is (kind, a, b):
  vertical_slash  a = vertical_size, b = slash_size      (reference "vertical_and_slash")
  a_shape         a = n_init,        b = n_local         (reference "stream_llm")
  block_sparse    a = top_k key blocks per query block   (reference "block_sparse"; its kernel's topk)
  dense           every causal key (a, b unused)
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from common.errors import ConfigError
from methods.parts.selection import tie_round, top_first

PATTERNS_DIR = Path(__file__).resolve().parents[1] / "patterns"
ROOT = PATTERNS_DIR.parents[1]
KINDS = ("vertical_slash", "a_shape", "block_sparse", "dense")
# the reference's names in its config files (minference/configs/*.json) -> ours
REF_NAMES = {"vertical_and_slash": "vertical_slash", "stream_llm": "a_shape", "block_sparse": "block_sparse"}
OUR_TO_REF = {v: k for k, v in REF_NAMES.items()}
SEARCH_HINT = "python -m offline.minference_search model={model}"
# minference_forward.py `minference_prefill_kernel`: a head missing from the config file
REFERENCE_DEFAULT = ("vertical_slash", 1000, 6096)


@dataclass(frozen=True)
class Pattern:
    kind: str
    a: int = 0
    b: int = 0
    score: float | None = None

    def scaled(self, factor: float) -> Pattern:
        """Sizes x factor, int() as the reference's `minference_ratio` does (not the block top-k count's
        kind: block_sparse scales too, a count of blocks)."""
        if factor == 1.0 or self.kind == "dense":
            return self
        return Pattern(self.kind, int(self.a * factor), int(self.b * factor), self.score)

    def text(self) -> str:
        return self.kind if self.kind == "dense" else f"{self.kind}:{self.a}:{self.b}"


@dataclass(frozen=True)
class PatternSet:
    heads: tuple[tuple[Pattern, ...], ...]   # [layer][query head]
    source: str

    def counts(self) -> dict:
        out = {k: 0 for k in KINDS}
        for row in self.heads:
            for p in row:
                out[p.kind] += 1
        return {k: n for k, n in out.items() if n}


def pattern_path(model: str) -> Path:
    return PATTERNS_DIR / f"{model}.json"


def parse_one(text: str, spec: str) -> Pattern:
    parts = text.strip().split(":")
    kind = REF_NAMES.get(parts[0], parts[0])
    need = {"vertical_slash": 2, "a_shape": 2, "block_sparse": 1, "dense": 0}.get(kind)
    if need is None:
        raise ConfigError(f"method.patterns={spec!r}: unknown pattern {parts[0]!r} (one of {', '.join(KINDS)})")
    try:
        sizes = [int(x) for x in parts[1:]]
    except ValueError:
        sizes = None
    if sizes is None or len(sizes) != need or any(s < 1 for s in sizes):
        form = {2: ":A:B", 1: ":TOPK", 0: ""}[need]
        raise ConfigError(f"method.patterns={spec!r}: {kind} takes {need} positive integer size(s): {kind}{form}")
    return Pattern(kind, *(sizes + [0, 0])[:2])


def resolve(spec: str, *, model: str | None, num_layers: int, num_heads: int) -> PatternSet:
    """auto (methods/patterns/<model>.json) | a file path | all:<pattern> | mix:<p1>,<p2>,... (cycled over
    the query heads of every layer); a pattern is vertical_slash:V:S | a_shape:INIT:LOCAL | block_sparse:K
    | dense. One ConfigError line for anything wrong."""
    spec = str(spec).strip()
    for prefix in ("all:", "mix:"):
        if spec.startswith(prefix):
            body = spec[len(prefix):]
            items = [body] if prefix == "all:" else body.split(",")
            pats = [parse_one(x, spec) for x in items]
            row = tuple(pats[h % len(pats)] for h in range(num_heads))
            return PatternSet(tuple(row for _ in range(num_layers)), spec)
    if spec == "auto":
        if not model or "${" in str(model):
            raise ConfigError(f"method.patterns=auto needs the model's name in method.pattern_model (Hydra sets it "
                              f"from model.name), got {model!r}; or pass method.patterns=PATH|all:<pattern>")
        path = pattern_path(model)
        if not path.exists():
            raise ConfigError(f"no MInference pattern file for model {model} ({path.relative_to(ROOT)}): search one "
                              f"with `{SEARCH_HINT.format(model=model)}` (see methods/patterns/README.md), or pass "
                              f"method.patterns=PATH|all:vertical_slash:1000:6096")
    else:
        path = Path(spec) if Path(spec).is_absolute() or Path(spec).exists() else ROOT / spec
        if not path.exists():
            raise ConfigError(f"method.patterns={spec!r}: no such pattern file (or use all:<pattern> / mix:<p>,<p>)")
    ps = load(path)
    shape = (len(ps.heads), len(ps.heads[0]) if ps.heads else 0)
    if shape != (num_layers, num_heads) or any(len(r) != num_heads for r in ps.heads):
        raise ConfigError(f"method.patterns={spec!r} holds {shape[0]} layers x {shape[1]} query heads but the model "
                          f"has {num_layers} x {num_heads}")
    return ps


def load(path: Path) -> PatternSet:
    """Our file ({"layers": [...], ...}) or a reference config (a bare list of {head: [type, v, s, score]})."""
    try:
        data = json.loads(Path(path).read_text())
        layers = data["layers"] if isinstance(data, dict) else data
        heads = []
        for row in layers:
            n = len(row)
            entries = [row[str(h)] if isinstance(row, dict) else row[h] for h in range(n)]
            heads.append(tuple(_entry(e) for e in entries))
    except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
        raise ConfigError(f"pattern file {path} is not a valid pattern file ({type(e).__name__}: {e})") from None
    try:
        source = str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        source = str(path)
    return PatternSet(tuple(heads), source)


def _entry(e) -> Pattern:
    kind = REF_NAMES.get(e[0], e[0])
    if kind not in KINDS:
        raise ValueError(f"unknown pattern {e[0]!r}")
    score = float(e[3]) if len(e) > 3 and e[3] is not None else None
    return Pattern(kind, int(e[1]), int(e[2]), score)


def save(path: Path, *, model: str, heads, search: dict) -> Path:
    """Write a pattern file: one row per layer of {query head: [reference type, a, b, score]}."""
    rows = [{str(h): [OUR_TO_REF.get(p.kind, p.kind), p.a, p.b, p.score] for h, p in enumerate(r)} for r in heads]
    counts = PatternSet(tuple(tuple(r) for r in heads), "").counts()
    head = {"model": model, "num_layers": len(rows), "num_heads": len(rows[0]), "counts": counts, "search": search}
    body = json.dumps(head, indent=1)[:-2]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body + ",\n \"layers\": [\n  " + ",\n  ".join(json.dumps(r) for r in rows) + "\n ]\n}\n")
    return path


# --- online index estimation ------------------------------------------------------------------------

@dataclass(frozen=True)
class Consts:
    """The reference's constants (method options): see methods/minference.py for each one's source."""
    last_q: int = 64
    block: int = 64
    init_columns: int = 30
    local_slashes: int = 100
    min_vertical: int = 30
    min_slash: int = 50
    cover: str = "block"


def vertical_slash_index(q, k, q_pos, vertical: int, slash: int, c: Consts, scale: float):
    """(columns [B, v], slash offsets [B, s]) of one head. minference_forward.py `vertical_and_slash_kernel`:
    sizes clamped to [min, N]; the last `last_q` queries attend (causal, scaled, softmax in fp32) to every
    key; vertical = the attention summed over them, the first `init_columns` columns forced; slash score of
    offset d = the attention summed along the diagonal key = query - d (`sum_all_diagonal_matrix`), the
    `local_slashes` nearest diagonals forced. Forced ties go to the lower column / nearer diagonal."""
    N = k.shape[1]
    v_n, s_n = min(N, max(vertical, c.min_vertical)), min(N, max(slash, c.min_slash))
    w = min(c.last_q, q.shape[1])
    qw, pw = q[:, -w:].float(), q_pos[-w:]
    logits = (qw @ k.float().transpose(1, 2)) * scale                      # [B, w, N]
    j = torch.arange(N, device=q.device)
    logits = logits.masked_fill(j[None, None, :] > pw[None, :, None], float("-inf"))
    p = torch.softmax(logits, -1)
    vert = tie_round(p.sum(1))
    vert[:, : c.init_columns] = float("inf")
    # diagonal d of query row r holds key pw[r] - d: gather each row's keys by offset
    d = torch.arange(N, device=q.device)
    key = pw[:, None] - d[None, :]                                         # [w, N]
    diag = p.gather(2, key.clamp(min=0).expand(p.shape[0], -1, -1)) * (key >= 0)
    sl = tie_round(diag.sum(1))
    sl[:, : c.local_slashes] = float("inf")
    return top_first(vert, v_n), top_first(sl, s_n)


def block_sparse_index(q, k, q_pos, top_k: int, c: Consts) -> torch.Tensor:
    """Selected key blocks [B, n_qb, n_kb] bool of one head, query blocks by absolute position.
    block_sparse_flash_attention.py `_build_block_index`: q and k mean-pooled per block of `block`
    tokens with zero padding (the last, partial block's sum / block), pooled q . k (no scale), causal
    over blocks, the top min(top_k, N // block) per query block; the kernel reads the first
    min(top_k, m + 1) of them, sorted, i.e. only causal blocks. top_k is at least 1 here (the reference
    selects none below one block and divides by zero)."""
    B, D = q.shape[0], q.shape[2]
    N, bs = k.shape[1], c.block
    n_kb = -(-N // bs)
    n_qb = -(-(int(q_pos[-1]) + 1) // bs)
    kp = torch.zeros(B, n_kb * bs, D, dtype=torch.float32, device=k.device)
    kp[:, :N] = k.float()
    kp = kp.view(B, n_kb, bs, D).sum(2) / bs
    qp = torch.zeros(B, n_qb * bs, D, dtype=torch.float32, device=q.device)
    qp[:, q_pos] = q.float()
    qp = qp.view(B, n_qb, bs, D).sum(2) / bs
    s = qp @ kp.transpose(1, 2)                                            # [B, n_qb, n_kb]
    m, n = torch.arange(n_qb, device=q.device), torch.arange(n_kb, device=q.device)
    causal = n[None, :] <= m[:, None]
    s = tie_round(s.masked_fill(~causal, float("-inf")))
    kk = max(1, min(top_k, N // bs))
    idx = top_first(s, min(kk, n_kb))
    sel = torch.zeros(B, n_qb, n_kb, dtype=torch.bool, device=q.device)
    sel.scatter_(2, idx, True)
    return sel & causal


# --- masks -------------------------------------------------------------------------------------------

def head_index(p: Pattern, q, k, q_pos, c: Consts, scale: float):
    """What a head's mask is built from (estimated once per prefill, before the query chunks)."""
    if p.kind == "vertical_slash":
        return vertical_slash_index(q, k, q_pos, p.a, p.b, c, scale)
    if p.kind == "block_sparse":
        return block_sparse_index(q, k, q_pos, p.a, c)
    return None


def layer_index(heads, q, k, q_pos, c: Consts, scale: float, per_call: int = 8):
    """head_index of every query head of a layer (q [B, Hq, T, D], k [B, Hkv, N, D]; query head h reads KV
    head h // (Hq // Hkv)), vertical-slash heads of equal sizes estimated `per_call` at a time as one batch
    (the rule is per row of the batch: the same index as one head at a time, in fewer launches; per_call
    bounds the [heads, last_q, N] fp32 temporaries)."""
    B, Hq = q.shape[:2]
    g = Hq // k.shape[1]
    index: list = [None] * Hq
    groups: dict = {}
    for h, p in enumerate(heads):
        if p.kind == "vertical_slash":
            groups.setdefault((p.a, p.b), []).append(h)
        else:
            index[h] = head_index(p, q[:, h], k[:, h // g], q_pos, c, scale)
    w = min(c.last_q, q.shape[2])
    for (a, b), hs in groups.items():
        for i in range(0, len(hs), per_call):
            part = hs[i:i + per_call]
            n = len(part)
            qs = q[:, part, -w:].flatten(0, 1)                                  # [B * n, w, D]
            ks = k[:, [h // g for h in part]].flatten(0, 1)                     # [B * n, N, D]
            cols, offs = vertical_slash_index(qs, ks, q_pos, a, b, c, scale)
            cols, offs = cols.unflatten(0, (B, n)), offs.unflatten(0, (B, n))
            for j, h in enumerate(part):
                index[h] = (cols[:, j], offs[:, j])
    return index


def rows_mask(p: Pattern, index, rows: torch.Tensor, N: int, B: int, c: Consts) -> torch.Tensor:
    """The mask [B, len(rows), N] bool of query positions `rows` of one head (causal included)."""
    dev = rows.device
    j = torch.arange(N, device=dev)
    causal = (j[None, :] <= rows[:, None]).expand(B, -1, -1)
    if p.kind == "dense":
        return causal.clone()
    if p.kind == "a_shape":   # streaming_kernel.py `streaming_forward`: window of n_local incl. itself + n_init sinks
        dist = rows[:, None] - j[None, :]
        return causal & ((dist < p.b) | (j[None, :] < p.a))
    if p.kind == "block_sparse":
        sel = index[:, rows // c.block]                                    # [B, R, n_kb]
        return causal & sel.repeat_interleave(c.block, -1)[..., :N]
    cols, offs = index
    m = torch.zeros(B, N, dtype=torch.bool, device=dev)
    m.scatter_(1, cols, True)
    out = m[:, None, :].expand(-1, len(rows), -1).clone()
    if c.cover == "token":    # the paper's diagonals: key = query - offset
        on = torch.zeros(B, N, dtype=torch.bool, device=dev)
        on.scatter_(1, offs, True)
        dist = (rows[:, None] - j[None, :]).clamp(min=0)
        out |= on.gather(1, dist.flatten().expand(B, -1)).view(B, len(rows), N)
    else:
        out |= slash_blocks(offs, rows, N, c.block)
    return out & causal


def slash_blocks(offs: torch.Tensor, rows: torch.Tensor, N: int, bs: int) -> torch.Tensor:
    """Keys covered by the chosen diagonals for each query's block [B, R, N]: the CUDA index builder
    (csrc/vertical_slash_index.cu `convert_vertical_slash_indexes`) turns diagonal d (d < end of the
    query block [start_m, end_m)) into the key range [e - bs, e), e = max(end_m - d, bs); the kernel
    attends the whole range from every query of the block (causal). Not reproduced: its range merge
    (`range_end += BLOCK_SIZE_M`), which may add up to bs - 1 keys past two adjacent ranges."""
    B, dev = offs.shape[0], offs.device
    qb = torch.unique(rows // bs)
    end = (qb + 1) * bs                                                    # [Q]
    e = (end[None, :, None] - offs[:, None, :]).clamp(min=bs)              # [B, Q, s]
    live = offs[:, None, :] < end[None, :, None]
    diff = torch.zeros(B, len(qb), N + bs + 1, dtype=torch.int32, device=dev)
    ones = live.to(torch.int32)
    diff.scatter_add_(2, (e - bs).clamp(max=N + bs), ones)
    diff.scatter_add_(2, e.clamp(max=N + bs), -ones)
    cover = diff.cumsum(2)[..., :N] > 0                                    # [B, Q, N]
    pos = torch.searchsorted(qb, rows // bs)
    return cover[:, pos]


def sparse_prefill(q, k, v, q_pos, heads, c: Consts, scale: float, chunk: int = 1024):
    """Causal attention of q [B, Hq, T, D] over k, v [B, Hkv, N, D] (rotated) with each query head's
    pattern mask -> ([B, T, Hq * D], fraction of the causal (query, key) pairs attended). Built per query
    chunk of `chunk` rows so the mask stays [B, Hq, chunk, N]; the masked softmax is torch SDPA."""
    B, Hq, T, D = q.shape
    N, g = k.shape[2], Hq // k.shape[1]
    kr, vr = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    index = [head_index(p, q[:, h], kr[:, h], q_pos, c, scale) for h, p in enumerate(heads)]
    out = torch.empty(B, Hq, T, D, dtype=q.dtype, device=q.device)
    kept = 0
    for i0 in range(0, T, chunk):
        rows = q_pos[i0:i0 + chunk]
        mask = torch.stack([rows_mask(p, index[h], rows, N, B, c) for h, p in enumerate(heads)], 1)
        kept += int(mask.sum())
        out[:, :, i0:i0 + chunk] = torch.nn.functional.scaled_dot_product_attention(
            q[:, :, i0:i0 + chunk], kr, vr, attn_mask=mask, scale=scale)
    causal = int(((q_pos + 1).sum()) * B * Hq)
    return out.transpose(1, 2).reshape(B, T, Hq * D), kept / max(causal, 1)
