"""Head-identification training curves for lychee.fig7 (P(retrieval) per head over steps, Kumaraswamy PDFs).

Runs offline.train_heads with the Hydra overrides given, its head file to a scratch path (method=lychee
and method=duo read the committed head files, which `python -m offline.train_heads` writes itself), and
writes the curves it records (per logged step: density, losses, P(retrieval) per layer x KV head; gate
states at log.pdf_steps) with the command and commit, as every benchmark file, to --out:

    python -m bench.train_curves steps=60 recipe=passkey-hardkuma ... --out results/bench/FILE.json
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from bench.engine import CONF, provenance


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("overrides", nargs="*", help="conf/train_heads.yaml overrides (key=value)")
    ap.add_argument("--out", default=None, help="write the JSON here (default: print a summary only)")
    args = ap.parse_args(argv)
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from offline.train_heads import train

    bad = [o for o in args.overrides if o.split("=", 1)[0].lstrip("+~") in ("out", "curves", "checkpoint")]
    if bad:
        raise SystemExit(f"error: {' '.join(bad)}: this command chooses where the head file and curves go")
    with tempfile.TemporaryDirectory() as tmp:
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = compose(config_name="train_heads",
                          overrides=[*args.overrides, f"out={tmp}/heads.json", f"curves={tmp}/curves.json"])
        train(cfg)
        curves = json.loads(Path(tmp, "curves.json").read_text())
    curves.pop("command", None)
    out = {**provenance("bench.train_curves", argv), "device": curves["training"]["device"], **curves}
    final = curves["retrieval_prob"][-1] if curves.get("retrieval_prob") else []
    print(f"{curves['recipe']}: {len(curves.get('steps', []))} logged steps, final density "
          f"{curves['training']['final_density']:.4f}, {sum(p > 0.5 for row in final for p in row)} heads > 0.5")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
