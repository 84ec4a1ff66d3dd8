"""A learned reward model as a reward function, scored as TRL 1.16's GRPOTrainer scores one.

    rewards: [{name: reward_model, path: models/my-rm, weight: 1.0}]       a recipe
    GRPOTrainer(..., reward_funcs="models/my-rm")                           TRL's spelling (a local directory)
    GRPOTrainer(..., reward_funcs=rm_model, reward_processing_classes=rm_tok)   a loaded model and its tokenizer

A reward model is a sequence-classification network with one output (transformers'
AutoModelForSequenceClassification, loaded with num_labels=1). Its score of a completion is
(trl/trainer/grpo_trainer.py, `_calculate_rewards`):

    text   = prompt + completion                                   standard format (string prompts)
    text   = reward_tokenizer.apply_chat_template(prompt + completion, tokenize=False, **chat_template_kwargs)
                                                                   conversational format (message lists)
    ids    = reward_tokenizer(texts, padding=True, padding_side="right", add_special_tokens=False)
    score  = model(**ids).logits[:, 0]                             under torch.inference_mode

The model reads the score at the last token that is not padding, so its config's pad_token_id is the
tokenizer's pad token (its EOS when it has none), as TRL sets it. The texts of one call (one group of G
completions in training: grpolab.rewards.scoring) go through one forward pass (`batch_size` rows at a
time when set), without a KV cache. The trainer moves the model to the policy's device and runs its
forward under the run's autocast dtype (`place_reward_models`), as accelerate runs a prepared model under
the mixed precision; the weights keep the dtype they were loaded in (dtype=auto: the checkpoint's, as
transformers 5 loads it). Nothing is downloaded: `path` is a local directory.
"""

from __future__ import annotations

import contextlib
import inspect
import json
from pathlib import Path
from typing import Any

from grpolab.util.fields import ConfigError

DTYPES = ("auto", "float32", "bfloat16")


def is_conversational(prompt: object) -> bool:
    """TRL's test (trl.data_utils.is_conversational) on one prompt: a list whose first item is a message."""
    return isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], dict) and "role" in prompt[0]


def reward_texts(prompts: list, completions: list, tokenizer, template_kwargs: dict | None = None) -> list[str]:
    """The texts the reward model reads: prompt + completion, or the chat template over both (see the
    module docstring)."""
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    if prompts and is_conversational(prompts[0]):
        return [
            tokenizer.apply_chat_template(list(p) + list(c), tools=None, tokenize=False, **(template_kwargs or {}))
            for p, c in zip(prompts, completions)
        ]
    return [p + c for p, c in zip(prompts, completions)]


def local_dir(path: object, where: str) -> Path:
    """`path` as a local model directory, or ConfigError: grpolab never downloads a hub id."""
    if not isinstance(path, (str, Path)) or not str(path):
        raise ConfigError(f"{where}: expected the reward model's local directory, got {path!r}")
    p = Path(path).expanduser()
    if not p.is_dir():
        raise ConfigError(
            f"{where}={str(path)!r}: not a local directory. grpolab never downloads a model (a hub id is "
            f"refused): fetch it yourself (e.g. `hf download {path} --local-dir DIR`) and give DIR"
        )
    if not (p / "config.json").is_file():
        raise ConfigError(f"{where}={str(path)!r}: no config.json there; give a Hugging Face model directory")
    return p


def checkpoint_dtype(path: Path) -> str:
    """The dtype a model directory's config.json names (`dtype`, or transformers 4's `torch_dtype`);
    float32 when it names none."""
    cfg = json.loads((path / "config.json").read_text())
    cfg = cfg.get("text_config", cfg) if "dtype" not in cfg and "torch_dtype" not in cfg else cfg
    return str(cfg.get("dtype") or cfg.get("torch_dtype") or "float32")


def _forward_keywords(model) -> set[str]:
    try:
        return set(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return set()


class RewardModel:
    """A sequence-classification model and its tokenizer, called as a TRL-form reward function:
    `rm(completions, prompts=...)` -> one score per completion (the module docstring)."""

    def __init__(self, model: Any, tokenizer: Any, *, batch_size: int = 0, name: str | None = None):
        if batch_size < 0:
            raise ConfigError(
                f"reward_model.batch_size: must be >= 0 (0: a call's texts in one pass), got {batch_size}"
            )
        if tokenizer.pad_token_id is None:  # TRL: the EOS pads, and the model reads the last other token
            tokenizer.pad_token = tokenizer.eos_token
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        config.pad_token_id = tokenizer.pad_token_id
        model.eval()
        self.model, self.tokenizer, self.batch_size = model, tokenizer, batch_size
        self.name = name or str(getattr(model.config, "_name_or_path", "") or "reward_model").rstrip("/").split("/")[-1]
        self.autocast = None  # the run's autocast dtype (place)
        self.template_kwargs: dict = {}
        self.__name__ = self.name
        self._no_cache = "use_cache" in _forward_keywords(model)

    def place(self, device, autocast=None, template_kwargs: dict | None = None) -> None:
        """On the policy's device, its forward under the run's autocast dtype (None: as loaded), the run's
        chat_template_kwargs for conversational texts."""
        self.model.to(device)
        self.autocast = autocast
        self.template_kwargs = dict(template_kwargs or {})

    @property
    def device(self):
        return next(self.model.parameters()).device

    def score(self, texts: list[str]) -> list[float]:
        """logits[:, 0] of the texts, `batch_size` at a time (0: all at once), padding on the right."""
        import torch

        out: list[float] = []
        step = self.batch_size or max(1, len(texts))
        device = self.device
        extra = {"use_cache": False} if self._no_cache else {}
        amp = (
            torch.autocast(device.type, dtype=self.autocast) if self.autocast is not None else contextlib.nullcontext()
        )
        for i in range(0, len(texts), step):
            enc = self.tokenizer(
                text=texts[i : i + step],
                return_tensors="pt",
                padding=True,
                padding_side="right",
                add_special_tokens=False,
            )
            enc = {k: v.to(device) for k, v in enc.items()}
            with torch.inference_mode(), amp:
                logits = self.model(**enc, **extra).logits
            out += logits[:, 0].float().tolist()
        return out

    def __call__(self, completions: list, prompts: list | None = None, **kwargs) -> list[float]:
        if prompts is None:
            raise ValueError("a reward model scores the prompt with the completion: prompts= is required")
        if not completions:
            return []
        return self.score(reward_texts(list(prompts), list(completions), self.tokenizer, self.template_kwargs))


def load_tokenizer_of(path: Path, where: str):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{where}: cannot load a tokenizer from {str(path)!r} ({e})") from e


def load_reward_model(path: object, *, tokenizer: object = None, dtype: str = "auto", where: str = "reward_model"):
    """(model, tokenizer) from local directories: AutoModelForSequenceClassification with num_labels=1,
    in `dtype` (auto: the checkpoint's), its tokenizer from `tokenizer` (a directory) or its own directory."""
    import torch
    from transformers import AutoModelForSequenceClassification

    if dtype not in DTYPES:
        raise ConfigError(f"{where}.dtype: expected one of {', '.join(DTYPES)}, got {dtype!r}")
    p = local_dir(path, f"{where}.path")
    tok_dir = p if tokenizer is None else local_dir(tokenizer, f"{where}.tokenizer")
    try:
        model = AutoModelForSequenceClassification.from_pretrained(
            str(p), num_labels=1, local_files_only=True, dtype="auto" if dtype == "auto" else getattr(torch, dtype)
        )
    except (OSError, ValueError, RuntimeError) as e:
        raise ConfigError(
            f"{where}.path={str(path)!r}: cannot load a sequence-classification model with one output "
            f"(AutoModelForSequenceClassification, num_labels=1): {e}"
        ) from e
    return model, load_tokenizer_of(tok_dir, where)


def make_reward_model(
    path: str | None = None, tokenizer: str | None = None, dtype: str = "auto", batch_size: int = 0
) -> RewardModel:
    """The `reward_model` reward: the sequence-classification model in the local directory `path`
    (module docstring). tokenizer: a directory with its tokenizer (default: `path`); dtype: auto (the
    checkpoint's), float32 or bfloat16; batch_size: texts per forward pass (0: a call's all at once)."""
    if path is None:
        raise ConfigError(
            "reward_model needs path: the reward model's local directory ({name: reward_model, path: DIR})"
        )
    if isinstance(batch_size, bool) or not isinstance(batch_size, int):
        raise ConfigError(f"reward_model.batch_size: expected an integer, got {batch_size!r}")
    model, tok = load_reward_model(path, tokenizer=tokenizer, dtype=dtype)
    return RewardModel(model, tok, batch_size=batch_size, name=Path(str(path)).name)


def of_object(model: Any, tokenizer: Any = None, where: str = "reward_funcs") -> RewardModel:
    """A loaded model (TRL's reward_funcs=model), with its tokenizer (TRL's reward_processing_classes) or,
    when none is given, the tokenizer of the local directory it was loaded from."""
    if not hasattr(model, "config") or not callable(model):
        raise ConfigError(
            f"{where}: a {type(model).__name__} is not a transformers model; pass a sequence-classification "
            f"model (AutoModelForSequenceClassification, num_labels=1) or a function"
        )
    if tokenizer is None:
        origin = str(getattr(model.config, "_name_or_path", "") or "")
        if not origin or not Path(origin).is_dir():
            raise ConfigError(
                f"{where}: no tokenizer for this reward model: pass it in reward_processing_classes "
                f"(the model was not loaded from a local directory that holds one: {origin!r})"
            )
        tokenizer = load_tokenizer_of(Path(origin), where)
    return RewardModel(model, tokenizer)


def reward_model_of(fn: Any) -> RewardModel | None:
    """The RewardModel behind a reward callable as grpolab.rewards.build_rewards holds it, else None."""
    inner = getattr(fn, "user_fn", fn)
    return inner if isinstance(inner, RewardModel) else None


def place_reward_models(fns: list, device, autocast=None, template_kwargs: dict | None = None) -> int:
    """Every reward model among the run's reward functions (RewardFn list) on `device`, run under the
    `autocast` dtype with the run's chat_template_kwargs; returns how many there are."""
    n = 0
    for rf in fns:
        rm = reward_model_of(rf.fn)
        if rm is not None:
            rm.place(device, autocast, template_kwargs)
            n += 1
    return n


__all__ = [
    "DTYPES",
    "RewardModel",
    "checkpoint_dtype",
    "is_conversational",
    "load_reward_model",
    "local_dir",
    "make_reward_model",
    "of_object",
    "place_reward_models",
    "reward_model_of",
    "reward_texts",
]
