"""Head identification training: `python -m offline.train_heads model=<name> recipe=<recipe> ...`
(Hydra config conf/train_heads.yaml). Writes a head file (methods/heads/<model>-<recipe>.json) that
`method=lychee` / `method=duo` read, and the training curves lychee.fig7 renders.

Per step (train_kuma.py): one passkey-in-book sample; the context prefilled densely without
gradients; the answer segment through the teacher (dense) and the student (offline/student.py) with
z sampled from the gates (one z for every head); loss = distillation + the sparsity term:
  hardkuma, hardconcrete  the Lagrangian on the density mean P(z != 0) (offline/gates.Lagrangian)
  direct                  DuoAttention's reg_weight x mean |alpha| (its own regulariser)
AdamW(lr) on the gate parameters, warm-up/decay schedule (offline/gates.lr_lambda).
Final set: hardkuma retrieval_prob (`final`) > 0.5; hardconcrete its deterministic gate > 0.5;
direct the top round(target_density x heads) gates (DuoAttention sparsifies by quantile); for the
lychee student layer 0 is then forced to retrieval (p_full[0, :] = 1 in the code).
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
from methods.parts import headfile
from offline import gates as G
from offline.heads_data import PasskeyBook, load_books
from offline.student import Student

ROOT = Path(__file__).resolve().parents[1]
RECIPES = {"passkey-hardkuma": ("hardkuma", "lychee"), "passkey-hardconcrete": ("hardconcrete", "lychee"),
           "passkey-direct": ("direct", "lychee"), "passkey-duo": ("direct", "duo")}


def build_gate(kind: str, info: ModelInfo, cfg) -> torch.nn.Module:
    L, H = info.num_layers, info.num_kv_heads
    g = cfg.gate
    if kind == "hardkuma":
        return G.HardKumaGate(L, H, g.a0, g.b0, tuple(g.stretch), final=cfg.final)
    if kind == "hardconcrete":
        return G.HardConcreteGate(L, H, g.log_alpha0, g.beta, tuple(g.stretch))
    return G.DirectGate(L, H, g.direct_init)


def final_roles(gate, kind: str, student: str, target: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(roles bool [L, H], scores [L, H]) from the trained gates (module docstring)."""
    p = gate.retrieval_prob().float().cpu()
    if kind == "direct":
        n = round(target * p.numel())
        roles = torch.zeros_like(p, dtype=torch.bool).flatten()
        roles[p.flatten().topk(n).indices] = True
        roles = roles.view_as(p)
    else:
        roles = p > 0.5
    if student == "lychee":
        roles[0] = True
        p = p.clone()
        p[0] = 1.0
    return roles, p


def distill(teacher: torch.Tensor, pred: torch.Tensor, loss: str) -> torch.Tensor:
    if loss == "hidden":   # train_kuma.py: (diff^2).mean(-1).sum() / labels_len
        return (teacher.float() - pred.float()).pow(2).mean(-1).sum() / teacher.shape[1]
    return (teacher.float() - pred.float()).pow(2).sum(-1).sum() / teacher.shape[0]   # paper eq. 6


def train(cfg: DictConfig, model=None, tokenizer=None) -> dict:
    """Train the gates and write the head file and curves; `model`/`tokenizer` given (tests) skip loading."""
    if cfg.recipe not in RECIPES:
        raise ConfigError(f"recipe={cfg.recipe!r} is not one of {', '.join(RECIPES)} (HotpotQA data is not available here)")
    if cfg.loss not in ("hidden", "logits") or cfg.final not in ("kuma_mean", "p_one", "hard_mean") \
            or cfg.student.mask not in ("reference", "inference"):
        raise ConfigError("loss must be hidden|logits, final kuma_mean|p_one|hard_mean, student.mask reference|inference")
    kind, student_kind = RECIPES[cfg.recipe]
    from runners import models

    device = models.resolve_device(cfg.device)
    dtype = models.resolve_dtype(cfg.dtype, device)
    torch.manual_seed(int(cfg.seed))
    if model is None:
        model, tokenizer = models.load(cfg.model, device, dtype)
    if tokenizer is None:
        raise HarnessError("head training needs the model's tokenizer (model.path=DIR)")
    info = ModelInfo.from_hf_config(model.config)
    d = cfg.data
    books = load_books(_path(d.books), list(d.splits) if d.splits else None, int(d.context_max) * 12)
    data = PasskeyBook(tokenizer, books, context_min=int(d.context_min), context_max=int(d.context_max),
                       n_lengths=int(d.n_lengths), num_passkeys=int(d.num_passkeys),
                       passkey_length=int(d.passkey_length), depth_min=float(d.depth_min),
                       depth_max=float(d.depth_max), n_depths=int(d.n_depths), seed=int(cfg.seed),
                       buffer=int(d.get("buffer", 300)))
    s = cfg.student
    student = Student(model, info, mask=s.mask, student=student_kind, ratio=float(s.ratio), sink=int(s.sink),
                      recent=int(s.recent), duo_sink=int(s.duo_sink), duo_recent=int(s.duo_recent))
    gate = build_gate(kind, info, cfg).to(device)
    opt = torch.optim.AdamW(gate.parameters(), lr=float(cfg.lr), weight_decay=0.0)
    steps = int(cfg.steps)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda=G.lr_lambda(steps))
    lag = G.Lagrangian(float(cfg.target_density), cfg.lagrangian.lambda0, cfg.lagrangian.lr, cfg.lagrangian.alpha,
                       lam_max=cfg.lagrangian.max)
    gen = torch.Generator(device=device).manual_seed(int(cfg.seed))
    curves = {"steps": [], "density": [], "distill": [], "reg": [], "lambda": [], "lr": [], "retrieval_prob": [],
              "gate_states": {}, "context_len": []}
    logger = _Wandb(cfg)
    pdf_steps = {int(x) for x in cfg.log.pdf_steps}
    reuse = int(cfg.get("steps_per_sample", 1))
    ckpt = _path(cfg.checkpoint) if cfg.get("checkpoint") else None
    start = _resume(ckpt, gate, opt, sched, lag, gen, data, curves) if ckpt and ckpt.exists() else 0
    budget_s = 60 * float(cfg.get("max_minutes") or 0)
    t0 = time.time()
    wall0 = float(curves.get("wall_s", 0.0))   # the earlier calls' training time (a resumed run)
    bar = _bar(steps, cfg.log.progress)
    bar.update(start)
    for step in range(start, steps):
        # checkpoints fall on sample boundaries (a sample's cache and teacher are not saved)
        if ckpt and step > start and step % reuse == 0 and (step % int(cfg.get("checkpoint_every", 50)) < reuse
                                                             or (budget_s and time.time() - t0 > budget_s)):
            curves["wall_s"] = round(wall0 + time.time() - t0, 1)
            _save(ckpt, step, gate, opt, sched, lag, gen, data, curves)
            if budget_s and time.time() - t0 > budget_s:
                bar.close()
                print(json.dumps({"stopped_at": step, "steps": steps, "checkpoint": str(ckpt),
                                  "resume": "run the same command again"}))
                return {"stopped_at": step, "checkpoint": str(ckpt)}
        if step in pdf_steps:
            curves["gate_states"][step] = gate.state()
        out = "hidden" if cfg.loss == "hidden" else "logits"
        if step % reuse == 0 or step == start:  # a new sample: its cache and teacher serve `reuse` gate steps
            ctx, lab = (t.to(device) for t in data.next())
            cache = student.prefill(ctx, int(d.prefill_chunk))
            with torch.no_grad():
                teacher = student.forward(lab, cache, None, out)
        z = gate.sample(gen)
        dl = distill(teacher, student.forward(lab, cache, z, out), cfg.loss)
        density = gate.density()
        reg = cfg.gate.reg_weight * gate.l1() if kind == "direct" else lag.penalty(density)
        (dl + reg).backward()
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if kind == "direct":
            gate.clamp_()
        if step % int(cfg.log.every) == 0 or step == steps - 1:
            prob = gate.retrieval_prob().float().cpu()
            point = {"density": float(density.detach()), "distill": float(dl.detach()), "reg": float(reg.detach()),
                     "lambda": float(lag.lam), "lr": opt.param_groups[0]["lr"]}
            for key, val in point.items():
                curves[key].append(val)
            curves["steps"].append(step)
            curves["context_len"].append(int(ctx.shape[1]))
            curves["retrieval_prob"].append([[round(x, 4) for x in row] for row in prob.tolist()])
            logger.log(step, {**point, "retrieval_heads": int((prob > 0.5).sum())})
        bar.update(1)
        bar.set_description(f"len={ctx.shape[1]}/{lab.shape[1]} density={float(density.detach()):.3f} dl={float(dl.detach()):.4f}")
    bar.close()
    if steps in pdf_steps or steps - 1 not in curves["gate_states"]:
        curves["gate_states"][steps] = gate.state()
    roles, scores = final_roles(gate, kind, student_kind, float(cfg.target_density))
    model_name = str(cfg.model.name)
    out_path = _path(cfg.out) if cfg.out else headfile.head_path(model_name, cfg.recipe)
    # the command without where files go (checkpoint=, out=, curves=): a machine's paths do not change
    # the heads (as bench provenance leaves out --out)
    args = [a for a in sys.argv[1:] if a.split("=", 1)[0].lstrip("+~") not in ("checkpoint", "out", "curves")]
    training = {"command": "python -m offline.train_heads " + " ".join(args), "commit": _commit(),
                "gate": kind, "student": student_kind, "steps": steps, "final": cfg.final if kind == "hardkuma" else
                gate.final, "target_density": float(cfg.target_density), "final_density": float(gate.density().detach()),
                "expected_l0": float(gate.density().detach()) * roles.numel(), "loss": cfg.loss, "mask": s.mask,
                "data": OmegaConf.to_container(d, resolve=True), "device": str(device), "dtype": str(dtype),
                "wall_s": round(wall0 + time.time() - t0, 1), "seed": int(cfg.seed), "steps_per_sample": reuse, "lr": float(cfg.lr)}
    headfile.save(out_path, model=model_name, recipe=cfg.recipe, roles=roles.tolist(), scores=scores.tolist(),
                  score=training["final"], training=training)
    curves_path = _path(cfg.curves) if cfg.curves else ROOT / "results" / "train_heads" / f"{model_name}-{cfg.recipe}.json"
    curves_path.parent.mkdir(parents=True, exist_ok=True)
    curves_path.write_text(json.dumps({"model": model_name, "recipe": cfg.recipe, "training": training, **curves}))
    logger.finish()
    summary = {"head_file": str(out_path), "curves": str(curves_path), "retrieval_heads": int(roles.sum()),
               "final_density": training["final_density"], "target_density": training["target_density"],
               "wall_s": training["wall_s"]}
    print(json.dumps(summary))
    return summary


def _save(path: Path, step, gate, opt, sched, lag, gen, data, curves) -> None:
    """Everything the loop needs to continue exactly: gates, optimiser, schedule, multiplier, RNGs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"step": step, "gate": gate.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                "lam": lag.lam, "c_ma": lag.c_ma, "gen": gen.get_state(), "data_gen": data.gen.get_state(),
                "data_order": list(data._order), "curves": curves}, tmp)
    tmp.replace(path)


def _resume(path: Path, gate, opt, sched, lag, gen, data, curves) -> int:
    state = torch.load(path, weights_only=False)
    gate.load_state_dict(state["gate"])
    opt.load_state_dict(state["opt"])
    sched.load_state_dict(state["sched"])
    lag.lam, lag.c_ma = state["lam"], state["c_ma"]
    gen.set_state(state["gen"])
    data.gen.set_state(state["data_gen"])
    data._order = list(state["data_order"])
    curves.update(state["curves"])
    print(f"resuming from {path} at step {state['step']}", file=sys.stderr)
    return int(state["step"])


def _path(p) -> Path:
    p = Path(str(p))
    return p if p.is_absolute() else ROOT / p


def _commit() -> str:
    """git's short HEAD, or HARNESS_COMMIT on a copy of the tree without .git (the GPU machine)."""
    from runners.results import git_commit

    return git_commit() or "unknown"


def _bar(total: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, disable=not enabled, file=sys.stderr, mininterval=2.0)


class _Wandb:
    """Scalars of the training curve, offline by default (runner-style `log.wandb.mode`)."""

    def __init__(self, cfg):
        self.run = None
        w = cfg.log.wandb
        if w.mode == "disabled":
            return
        import os

        import wandb

        os.makedirs(_path(w.dir), exist_ok=True)
        os.environ.setdefault("WANDB_SILENT", "true")
        self.run = wandb.init(project=w.project, mode=w.mode, dir=str(_path(w.dir)), job_type="train_heads",
                              name=f"train_heads-{cfg.model.name}-{cfg.recipe}", reinit="finish_previous",
                              config=OmegaConf.to_container(cfg, resolve=True),
                              settings=wandb.Settings(console="off", silent=True))

    def log(self, step: int, values: dict) -> None:
        if self.run is not None:
            self.run.log(values, step=step)

    def finish(self) -> None:
        if self.run is not None:
            self.run.finish()


def main() -> None:
    import hydra

    @hydra.main(config_path=str(ROOT / "conf"), config_name="train_heads", version_base="1.3")
    def _main(cfg: DictConfig) -> None:
        try:
            train(cfg)
        except HarnessError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(e.exit_code)

    _main()


if __name__ == "__main__":
    main()
