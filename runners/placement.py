"""Loading one model's layers onto several GPUs (the weights half of runners/pipeline.py).

Pretrained weights load through transformers' `device_map` (accelerate's big-model loading: each
shard's tensors go straight to their GPU, the host never holds the whole model: a 70B model is 140
GB). Random weights of real shapes are built on the meta device and each module is materialized
on its GPU (a 70B model never exists on one device). An existing model (a small one, tests) is
moved module by module with `place`.
"""
from __future__ import annotations

import torch


def device_map(num_layers: int, placement) -> dict[str, str]:
    """The transformers/accelerate device map: layer i on its segment's GPU; the embedding, final
    norm, rotary module and head on the first GPU (the engine samples there, and a tied head must
    sit with the embedding)."""
    first = str(placement[0][0])
    out = {"model.embed_tokens": first, "model.rotary_emb": first, "model.norm": first, "lm_head": first}
    for dev, a, b in placement:
        for i in range(a, b):
            out[f"model.layers.{i}"] = str(dev)
    if len([k for k in out if k.startswith("model.layers.")]) != num_layers:
        raise ValueError(f"placement covers {len(out) - 4} layers of {num_layers}")
    return out


def place(model, placement):
    """Move an already-built model's modules per `placement` (in place; returns the model)."""
    first = torch.device(placement[0][0])
    inner = model.model
    for mod in (inner.embed_tokens, inner.norm, inner.rotary_emb, model.lm_head):
        mod.to(first)
    for dev, a, b in placement:
        for i in range(a, b):
            inner.layers[i].to(torch.device(dev))
    return model


def load_split(model_cfg, dtype, placement, source_fn, error_fn):
    from transformers import AutoModelForCausalLM

    from runners.models import config_from_arch

    if source_fn is not None:   # pretrained: accelerate's big-model loading, shard by shard to its GPU
        source, kwargs = source_fn(model_cfg)
        config = None
        try:
            return AutoModelForCausalLM.from_pretrained(
                source, dtype=dtype, device_map=device_map(_layers(source, kwargs, config), placement), **kwargs)
        except OSError as e:
            raise error_fn(source, e) from None
    config = config_from_arch(model_cfg.arch)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    _materialize(model, placement, config)
    return model


def _layers(source, kwargs, config) -> int:
    from transformers import AutoConfig

    return int(AutoConfig.from_pretrained(source, **kwargs).num_hidden_layers)


def _materialize(model, placement, config) -> None:
    """Random weights of the model built on meta, each module on its GPU (HF's init rule: normal
    with the config's initializer_range, norms 1, biases 0), seeded per module: the same weights
    for a given placement."""
    std = float(getattr(config, "initializer_range", 0.02))
    first = torch.device(placement[0][0])
    inner = model.model
    mods = [(inner.embed_tokens, first), (inner.norm, first)]
    if model.lm_head.weight is not inner.embed_tokens.weight:
        mods.append((model.lm_head, first))
    mods += [(inner.layers[i], torch.device(dev)) for dev, a, b in placement for i in range(a, b)]
    for n, (mod, dev) in enumerate(mods):
        mod.to_empty(device=dev)
        gen = torch.Generator(device=dev).manual_seed(n)
        with torch.no_grad():
            for name, p in mod.named_parameters():
                if name.endswith("bias"):
                    p.zero_()
                elif p.dim() == 1:
                    p.fill_(1.0)
                else:
                    p.normal_(0.0, std, generator=gen)
    if getattr(config, "tie_word_embeddings", False):
        model.lm_head.weight = inner.embed_tokens.weight
    rot = type(inner.rotary_emb)(config=model.config)   # its inv_freq is computed, not loaded: build it for real
    inner.rotary_emb = rot.to(first)


def load_placed(model_cfg, device, dtype, tokenizer=None, placement=None):
    """runners.models.load on one device, or `load` over a placement of several segments."""
    from runners import models

    if placement is None or len(placement) < 2:
        return models.load(model_cfg, device, dtype, tokenizer=tokenizer)
    return load(model_cfg, dtype, placement, tokenizer)


def load(model_cfg, dtype, placement, tokenizer=None):
    """(model, tokenizer) with each layer's weights on its GPU as they load (the embedding, final norm
    and head on the first): runners.models.load's counterpart for a split run, kept out of models.py
    so the one-GPU loader (measured code of every engine benchmark) stays as it is."""
    from runners import models

    random = model_cfg.get("weights", "pretrained") == "random"
    model = load_split(model_cfg, dtype, placement, None if random else models._source, models._load_error)
    if tokenizer is None:
        tokenizer = models.load_tokenizer(model_cfg)
    return models._ready(model), tokenizer
