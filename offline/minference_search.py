"""MInference's offline per-head pattern search: `python -m offline.minference_search model=<name> ...`
(Hydra config conf/minference_search.yaml). Writes methods/patterns/<model>.json for `method=minference`.

Reference (minference/modules/minference_forward.py): the model runs one long sample with dense
attention (`is_search`); for every layer and query head, each candidate configuration of the three
patterns runs through the real sparse kernel and is scored against the dense output:
  output_count (`search_pattern_v2`, the score of the committed *_kv_out_v32_fit_o_best_pattern.json
               files): the number of output elements with |dense - sparse| > 5e-3, lowest wins;
  recall       (`search_pattern`, v1): the dense attention mass inside the pattern's mask, averaged
               over the queries from 2500 on, highest wins (v1 then rewrote A-shape and block-sparse
               winners to vertical-slash; not reproduced).
Ties keep the earlier candidate (strict comparison, as the reference). Candidates are the reference's
list at `ref_len`, sizes scaled linearly to the sample length (int(size x scale)); candidates that the
method's clamps make identical are scored once. The sparse output is the method's own masked prefill
(methods/parts/minference_patterns.sparse_prefill) with the method options the file will be used with.
The sample: PG-19 text with a passkey at `depth` and the question at the end (the reference used one
InfiniteBench KV-retrieval example, not available offline).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from common.errors import ConfigError, HarnessError
from methods import ModelInfo
from methods.full import Full
from methods.minference import MInferenceConfig
from methods.parts import minference_patterns as P
from runners.results import git_commit

ROOT = Path(__file__).resolve().parents[1]
NEEDLE = " The pass key is {key}. Remember it. {key} is the pass key. "
QUESTION = "\nWhat is the pass key? The pass key is"


def candidates(cfg, length: int) -> tuple[float, list[P.Pattern]]:
    scale = float(cfg.scale) if cfg.get("scale") is not None else length / float(cfg.ref_len)
    out = []
    for row in cfg.candidates:
        kind, a, b = str(row[0]), int(row[1]), int(row[2])
        if kind not in P.KINDS:
            raise ConfigError(f"candidates: unknown pattern {kind!r} (one of {', '.join(P.KINDS)})")
        out.append(P.Pattern(kind, a, b).scaled(scale))
    if not out:
        raise ConfigError("candidates: at least one candidate is needed")
    return scale, out


def effective(p: P.Pattern, N: int, c: P.Consts) -> tuple:
    """What a candidate attends at length N after the method's clamps (equal keys = equal masks)."""
    if p.kind == "vertical_slash":
        return p.kind, min(N, max(p.a, c.min_vertical)), min(N, max(p.b, c.min_slash))
    if p.kind == "block_sparse":
        return p.kind, max(1, min(p.a, N // c.block)), 0
    if p.kind == "a_shape":
        return p.kind, min(p.a, N), min(p.b, N)
    return (p.kind,)


def score_head(q, k, v, cands, c: P.Consts, scale: float, criterion: str, tol: float, recall_from: int,
               chunk: int) -> tuple[int, float]:
    """(index of the winning candidate, its score) for one head: q [1, N, D], k, v [1, N, D] rotated."""
    N = q.shape[1]
    pos = torch.arange(N, device=q.device)
    q4, k4, v4 = q[:, None], k[:, None], v[:, None]
    if criterion == "output_count":
        ref = torch.nn.functional.scaled_dot_product_attention(q4, k4, v4, is_causal=True, scale=scale)[:, 0]
    else:
        logits = (q[0].float() @ k[0].float().T) * scale
        probs = torch.softmax(logits.masked_fill(pos[None, :] > pos[:, None], float("-inf")), -1)[recall_from:]
    seen: dict[tuple, float] = {}
    best, best_score = 0, None
    for i, p in enumerate(cands):
        key = effective(p, N, c)
        if key not in seen:
            if criterion == "output_count":
                out, _ = P.sparse_prefill(q4, k4, v4, pos, [p], c, scale, chunk)
                seen[key] = float(((out.view_as(ref) - ref).abs() > tol).sum())
            else:
                index = P.head_index(p, q, k, pos, c, scale)
                mask = P.rows_mask(p, index, pos[recall_from:], N, 1, c)[0]
                seen[key] = float((probs * mask).sum(-1).mean())
        s = seen[key]
        better = best_score is None or (s < best_score if criterion == "output_count" else s > best_score)
        if better:
            best, best_score = i, s
    return best, best_score


class _Searcher(Full):
    """Dense attention (the reference searches with dense layers) that scores every head on the way."""

    def __init__(self, cands, consts, cfg):
        super().__init__({"name": "full"})
        self.cands, self.consts, self.search_cfg = cands, consts, cfg
        self.found: dict[int, list] = {}

    def attend(self, layer, q, k, v, rope):
        out = super().attend(layer, q, k, v, rope)
        if self.step.phase == "prefill":
            qr = rope.apply(q, self.step.positions)
            keys, values = self.store.view(layer, self.step.end)
            g = q.shape[1] // keys.shape[1]
            s = self.search_cfg
            row = []
            for h in range(q.shape[1]):
                i, score = score_head(qr[:, h], keys[:, h // g], values[:, h // g], self.cands, self.consts,
                                      self.info.scaling, s["criterion"], s["tolerance"], s["recall_from"],
                                      s["chunk"])
                p = self.cands[i]
                row.append(P.Pattern(p.kind, p.a, p.b, round(score, 6)))
            self.found[layer] = row
            print(f"layer {layer}: " + " ".join(p.text() for p in row), file=sys.stderr, flush=True)
        return out


def sample_ids(tokenizer, cfg) -> torch.Tensor:
    """PG-19 text cut to the length, a passkey line at `depth`, the question last: [1, length]."""
    from offline.heads_data import load_books

    s = cfg.sample
    n = int(s.length)
    text = load_books(_path(s.books), None, n * 12)
    enc = lambda t: tokenizer.encode(t, add_special_tokens=False)
    key = torch.randint(10000, 99999, (1,), generator=torch.Generator().manual_seed(int(s.seed))).item()
    needle, question = enc(NEEDLE.format(key=key)), enc(QUESTION)
    hay = enc(text)
    room = n - len(needle) - len(question)
    if room < 1 or len(hay) < room:
        raise ConfigError(f"sample.length={n} does not fit the books' text and the passkey lines")
    at = int(room * float(s.depth))
    ids = hay[:at] + needle + hay[at:room] + question
    return torch.tensor([ids])


def search(cfg: DictConfig, model=None, tokenizer=None, ids: torch.Tensor | None = None) -> dict:
    """Run the search and write the pattern file; model/tokenizer/ids given (tests) skip loading."""
    if cfg.criterion not in ("output_count", "recall"):
        raise ConfigError(f"criterion={cfg.criterion!r} must be output_count or recall")
    from runners import models
    from runners.engine import Engine

    device = models.resolve_device(cfg.device)
    dtype = models.resolve_dtype(cfg.dtype, device)
    if model is None:
        model, tokenizer = models.load(cfg.model, device, dtype)
    if ids is None:
        if tokenizer is None:
            raise HarnessError("the search sample needs the model's tokenizer (model.path=DIR)")
        ids = sample_ids(tokenizer, cfg)
    ids = ids.to(device)
    N = ids.shape[1]
    info = ModelInfo.from_hf_config(model.config)
    mcfg = MInferenceConfig.parse({**OmegaConf.to_container(cfg.method, resolve=True), "patterns": "all:dense"})
    consts = mcfg.consts()
    scale, cands = candidates(cfg, N)
    recall_from = int(cfg.recall_from) if cfg.get("recall_from") is not None else round(2500 * scale)
    if cfg.criterion == "recall" and not 0 <= recall_from < N:
        raise ConfigError(f"recall_from={recall_from} must lie in [0, {N})")
    method = _Searcher(cands, consts, {"criterion": cfg.criterion, "tolerance": float(cfg.tolerance),
                                       "recall_from": recall_from, "chunk": mcfg.query_chunk})
    t0 = time.time()
    with torch.inference_mode():
        eng = Engine(model, method, use_graphs=False)
        eng.reset(1, N)
        eng.prefill(ids)
    heads = [method.found[layer] for layer in range(info.num_layers)]
    model_name = str(cfg.model.name)
    out_path = _path(cfg.out) if cfg.get("out") else P.pattern_path(model_name)
    args = [a for a in sys.argv[1:] if a.split("=", 1)[0].lstrip("+~") != "out"]
    record = {"command": "python -m offline.minference_search " + " ".join(args), "commit": git_commit() or "unknown",
              "criterion": cfg.criterion, "tolerance": float(cfg.tolerance), "recall_from": recall_from,
              "sample": {**OmegaConf.to_container(cfg.sample, resolve=True), "tokens": N},
              "ref_len": int(cfg.ref_len), "scale": scale, "scaling": "size = int(reference size x scale)",
              "candidates_reference": [":".join(map(str, x)) for x in OmegaConf.to_container(cfg.candidates)],
              "candidates": [p.text() for p in cands], "method_options": {k: getattr(mcfg, k) for k in (
                  "last_q", "block_size", "init_columns", "local_slashes", "min_vertical", "min_slash",
                  "slash_cover")},
              "device": str(device), "dtype": str(dtype), "wall_s": round(time.time() - t0, 1)}
    P.save(out_path, model=model_name, heads=heads, search=record)
    summary = {"pattern_file": str(out_path), "counts": P.PatternSet(tuple(map(tuple, heads)), "").counts(),
               "wall_s": record["wall_s"]}
    print(json.dumps(summary))
    return summary


def _path(p) -> Path:
    p = Path(str(p))
    return p if p.is_absolute() else ROOT / p


def main() -> None:
    import hydra

    @hydra.main(config_path=str(ROOT / "conf"), config_name="minference_search", version_base="1.3")
    def _main(cfg: DictConfig) -> None:
        try:
            search(cfg)
        except HarnessError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(e.exit_code)

    _main()


if __name__ == "__main__":
    main()
