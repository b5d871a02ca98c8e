"""Head files: which KV heads of a model are retrieval heads (LycheeDecode, DuoAttention).

A head file is a small JSON in `methods/heads/<model>-<recipe>.json` (model = the conf/model name,
recipe = how the roles were learned, e.g. `passkey-hardkuma`), written by the head-identification
trainer (`python -m offline.train_heads`):

    {"model": "smollm2", "recipe": "passkey-hardkuma", "num_layers": 30, "num_kv_heads": 3,
     "heads":  [[1, 1, 1], [0, 1, 0], ...],      # layers x KV heads, 1 = retrieval
     "scores": [[0.98, ...], ...],               # the per-head value the set was cut from (ranking)
     "score": "kuma_mean", "training": {...}}    # what `scores` is; how the file was made

`resolve` turns the `heads` option of a method into roles, one line of ConfigError for anything
wrong. Besides `auto` (the file named by model and recipe) and a path, two specs need no file, for
tests and baselines:
    random:<seed>[:<n>]   n retrieval KV heads drawn uniformly outside the forced layer 0 (default
                          n: 3/32 of those heads, the paper's 24/256 for Llama-3-8B)
    inline:<rows>         rows of 0/1 per layer, separated by '/', e.g. inline:11/01/10
    all                   every head retrieval
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from common.errors import ConfigError

HEADS_DIR = Path(__file__).resolve().parents[1] / "heads"
ROOT = HEADS_DIR.parents[1]
DEFAULT_DENSITY = 24 / 256  # the reference's desired_density for Llama-3-8B (0.09375)
TRAIN_HINT = "python -m offline.train_heads model={model} recipe={recipe}"


@dataclass(frozen=True)
class HeadSet:
    roles: tuple[tuple[bool, ...], ...]      # [layer][kv head] True = retrieval
    source: str                              # what the roles came from (recorded in every row)
    scores: tuple[tuple[float, ...], ...] | None = None

    @property
    def count(self) -> int:
        return sum(sum(r) for r in self.roles)

    def scaled(self, factor: float, keep_layer0: bool) -> "HeadSet":
        """The top round(factor * count) heads by score (DuoAttention*: twice the retrieval heads).
        Ties and missing scores fall back to the binary roles first, then position order."""
        if factor == 1.0:
            return self
        n_layers, n_heads = len(self.roles), len(self.roles[0])
        target = min(n_layers * n_heads, max(0, round(factor * self.count)))
        def key(lh):
            layer, h = lh
            s = self.scores[layer][h] if self.scores is not None else 0.0
            return (-(layer == 0 and keep_layer0), -s, -self.roles[layer][h], layer, h)
        order = sorted(((layer, h) for layer in range(n_layers) for h in range(n_heads)), key=key)
        keep = set(order[:target])
        roles = tuple(tuple((layer, h) in keep for h in range(n_heads)) for layer in range(n_layers))
        return HeadSet(roles, f"{self.source} scaled x{factor:g} ({target} heads)", self.scores)


def head_path(model: str, recipe: str) -> Path:
    return HEADS_DIR / f"{model}-{recipe}.json"


def resolve(spec: str, *, model: str, recipe: str, num_layers: int, num_kv_heads: int,
            force_layer0: bool, method: str) -> HeadSet:
    """The head roles named by `spec` (see the module docstring) for a model of this shape."""
    spec = str(spec).strip()
    if spec == "all":
        return HeadSet(tuple(tuple([True] * num_kv_heads) for _ in range(num_layers)), "all")
    if spec.startswith("random:"):
        return _random(spec, num_layers, num_kv_heads, force_layer0)
    if spec.startswith("inline:"):
        rows = spec[len("inline:"):].split("/")
        if any(set(r) - {"0", "1"} or not r for r in rows):
            raise ConfigError(f"method.heads={spec!r}: inline rows are 0/1 digits per KV head separated by '/'")
        hs = HeadSet(tuple(tuple(c == "1" for c in r) for r in rows), spec)
    else:
        if spec == "auto":
            if not model or "${" in model:
                raise ConfigError(f"method.heads=auto needs the model's name in method.head_model (Hydra sets it "
                                  f"from model.name), got {model!r}; or pass method.heads=PATH")
            path = head_path(model, recipe)
            if not path.exists():
                raise ConfigError(
                    f"no {method} head file for model {model} ({path.relative_to(ROOT)}): train one on the model's "
                    f"weights with `{TRAIN_HINT.format(model=model, recipe=recipe)}` (see methods/heads/README.md), "
                    f"or pass method.heads=PATH|random:SEED")
        else:
            path = Path(spec) if Path(spec).is_absolute() or Path(spec).exists() else ROOT / spec
            if not path.exists():
                raise ConfigError(f"method.heads={spec!r}: no such head file")
        hs = load(path)
    _check_shape(hs, spec, num_layers, num_kv_heads)
    if force_layer0 and not all(hs.roles[0]):
        raise ConfigError(f"method.heads={spec!r}: layer 0 must be all retrieval heads (sparse heads need a set "
                          f"written by an earlier layer; the reference trainer forces p_full[0, :] = 1)")
    return hs


def load(path: Path) -> HeadSet:
    try:
        data = json.loads(Path(path).read_text())
        roles = tuple(tuple(bool(int(x)) for x in row) for row in data["heads"])
        scores = data.get("scores")
        scores = tuple(tuple(float(x) for x in row) for row in scores) if scores is not None else None
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConfigError(f"head file {path} is not a valid head file ({type(e).__name__}: {e})") from None
    try:
        source = str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        source = str(path)
    return HeadSet(roles, source, scores)


def save(path: Path, *, model: str, recipe: str, roles, scores, score: str, training: dict) -> Path:
    """Write a head file (roles and scores as nested lists of layers x KV heads)."""
    roles = [[int(bool(x)) for x in row] for row in roles]
    data = {"model": model, "recipe": recipe, "num_layers": len(roles), "num_kv_heads": len(roles[0]),
            "retrieval_heads": sum(map(sum, roles)), "heads": roles,
            "scores": [[round(float(x), 6) for x in row] for row in scores], "score": score, "training": training}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # one row per layer: the file stays small and diffs read layer by layer
    body = json.dumps({k: v for k, v in data.items() if k not in ("heads", "scores")}, indent=1)[:-2]
    rows = lambda m: ",\n  ".join(json.dumps(r) for r in m)
    path.write_text(f"{body},\n \"heads\": [\n  {rows(roles)}\n ],\n \"scores\": [\n  {rows(data['scores'])}\n ]\n}}\n")
    return path


def _random(spec: str, num_layers: int, num_kv_heads: int, force_layer0: bool) -> HeadSet:
    parts = spec.split(":")
    try:
        seed = int(parts[1])
        n = int(parts[2]) if len(parts) > 2 else None
    except (IndexError, ValueError):
        raise ConfigError(f"method.heads={spec!r}: use random:<seed> or random:<seed>:<n heads>") from None
    first = 1 if force_layer0 else 0
    pool = [(layer, h) for layer in range(first, num_layers) for h in range(num_kv_heads)]
    n = round(DEFAULT_DENSITY * len(pool)) if n is None else n
    if not 0 <= n <= len(pool):
        raise ConfigError(f"method.heads={spec!r}: n must lie in [0, {len(pool)}] for this model")
    chosen = set(random.Random(seed).sample(pool, n))
    roles = tuple(tuple((layer < first) or ((layer, h) in chosen) for h in range(num_kv_heads))
                  for layer in range(num_layers))
    return HeadSet(roles, spec)


def _check_shape(hs: HeadSet, spec: str, num_layers: int, num_kv_heads: int) -> None:
    shape = (len(hs.roles), len(hs.roles[0]) if hs.roles else 0)
    if shape != (num_layers, num_kv_heads) or any(len(r) != num_kv_heads for r in hs.roles):
        raise ConfigError(f"method.heads={spec!r} holds {shape[0]} layers x {shape[1]} KV heads but the model has "
                          f"{num_layers} x {num_kv_heads}")
