"""Local stand-ins for the Hugging Face Hub repositories TRL's GRPOTrainer tests load, built offline.

    python benchmarks/trl_standins.py DIR        # DIR/trl-internal-testing/<name> for every stand-in

TRL's tests name hub ids such as "trl-internal-testing/tiny-Qwen2ForCausalLM-2.5" and
load_dataset("trl-internal-testing/zen", "standard_prompt_only"). Run from DIR, each id is a relative path
that exists, so transformers and datasets read the local directory and never the hub:

- models: random tiny networks of the same class (hidden size 8, 2 layers, as TRL's tiny models), saved in
  bf16 as TRL's are, with grpolab's bundled SmolLM2 tokenizer (49,152 tokens) instead of each family's own,
  which is not available offline; the Qwen families get the chat template the installed TRL ships for them
  (TRL's tool-calling tests need a template it knows), the others keep SmolLM2's ChatML template;
- tiny-RemoteForCausalLM: a model whose class lives in its own directory (custom code: `auto_map`),
  loadable only with trust_remote_code=True, written here;
- datasets: "zen" with the configs and splits the tests read (standard_prompt_only and
  conversational_prompt_only, 17 train and 2 test rows of the Zen of Python's lines cut into prompts),
  as parquet files declared per config in the dataset card, which is how the hub declares configs.

Vision-language models and the image datasets have no stand-in (grpolab trains on text).
"""

from __future__ import annotations

import codecs
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = ROOT / "src" / "grpolab" / "data" / "smollm2-tokenizer"
ORG = "trl-internal-testing"
VERSION = 4  # bump when the stand-ins change: DIR is rebuilt

# model_type -> the chat template TRL ships for that family (trl/chat_templates/, read from the installed
# TRL at build time): TRL recognises these templates for tool calling and response parsing, as it recognises
# the real tiny models' own. Both are ChatML, whose <|im_start|> / <|im_end|> the SmolLM2 tokenizer has.
TEMPLATES = {"qwen2": "qwen2_5.jinja", "qwen3": "qwen3.jinja", "qwen3_moe": "qwen3.jinja"}

TINY = {"hidden_size": 8, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2}
TINY_MLP = {**TINY, "intermediate_size": 32}
MOE = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16}

# hub name -> (model_type, task, extra config); task: causal | seqcls
MODELS: dict[str, tuple[str, str, dict]] = {
    "tiny-Qwen2ForCausalLM-2.5": ("qwen2", "causal", TINY_MLP),
    "tiny-Qwen2ForSequenceClassification-2.5": ("qwen2", "seqcls", TINY_MLP),
    "tiny-Qwen3ForCausalLM": ("qwen3", "causal", {**TINY_MLP, "head_dim": 2}),
    "tiny-Qwen3ForSequenceClassification": ("qwen3", "seqcls", {**TINY_MLP, "head_dim": 2}),
    "tiny-LlamaForCausalLM-3.2": ("llama", "causal", TINY_MLP),
    "tiny-LlamaForSequenceClassification-3.2": ("llama", "seqcls", TINY_MLP),
    "tiny-MistralForCausalLM-0.2": ("mistral", "causal", TINY_MLP),
    "tiny-Gemma2ForCausalLM": ("gemma2", "causal", {**TINY_MLP, "head_dim": 2}),
    "tiny-Cohere2ForCausalLM": ("cohere2", "causal", TINY_MLP),
    "tiny-Qwen3MoeForCausalLM": ("qwen3_moe", "causal", {**TINY_MLP, **MOE, "head_dim": 2}),
    "tiny-GptOssForCausalLM": (
        "gpt_oss",
        "causal",
        {**TINY_MLP, "head_dim": 2, "num_local_experts": 4, "num_experts_per_tok": 2, "layer_types": None},
    ),
    "tiny-Glm4MoeForCausalLM": (
        "glm4_moe",
        "causal",
        {**TINY_MLP, "head_dim": 2, "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16},
    ),
}

ZEN_LINES = 19  # the aphorisms of `import this`
TEST_ROWS = 2  # TRL's zen: train_test_split(test_size=0.1, shuffle=False) of 19 rows


def zen() -> list[str]:
    """The Zen of Python's 19 aphorisms, from the standard library (`this.s` is ROT13 text)."""
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        import this
    text = codecs.decode(this.s, "rot13")
    lines = [ln.strip() for ln in text.splitlines()[2:] if ln.strip()]
    assert len(lines) == ZEN_LINES, lines
    return lines


def prompt_of(line: str) -> str:
    """The first half of an aphorism's words (at least one): the prompt a completion continues."""
    words = line.split()
    return " ".join(words[: max(1, len(words) // 2)])


def zen_configs() -> dict[str, list[dict]]:
    """config name -> rows (train first, then test)."""
    prompts = [prompt_of(line) for line in zen()]
    return {
        "standard_prompt_only": [{"prompt": p} for p in prompts],
        "conversational_prompt_only": [{"prompt": [{"role": "user", "content": f"Complete: {p}"}]} for p in prompts],
    }


def write_zen(out: Path) -> None:
    import datasets

    card = ["---", "configs:"]
    for name, rows in zen_configs().items():
        split = len(rows) - TEST_ROWS
        card += [f"- config_name: {name}", "  data_files:"]
        for part, sel in (("train", rows[:split]), ("test", rows[split:])):
            path = out / name / f"{part}-00000-of-00001.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            datasets.Dataset.from_list(sel).to_parquet(str(path))
            card += [f"  - split: {part}", f"    path: {name}/{part}-*.parquet"]
    card += ["---", "", "Stand-in for trl-internal-testing/zen, built by benchmarks/trl_standins.py.", ""]
    (out / "README.md").write_text("\n".join(card))


def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(TOKENIZER))


def build_model(model_type: str, task: str, extra: dict, tok):
    """A random tiny network of `model_type` (weights: normal(0, 0.02) as transformers initialises them)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

    config = AutoConfig.for_model(
        model_type,
        vocab_size=len(tok),
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        **extra,
    )
    torch.manual_seed(0)
    if task == "seqcls":
        config.num_labels = 1
        model = AutoModelForSequenceClassification.from_config(config)
    else:
        model = AutoModelForCausalLM.from_config(config)
    return model.to(torch.bfloat16)


def family_template(model_type: str) -> str | None:
    """The chat template TRL ships for `model_type` (TEMPLATES), or None (SmolLM2's own is kept)."""
    if model_type not in TEMPLATES:
        return None
    try:
        import trl
    except ImportError:
        return None
    path = Path(trl.__file__).parent / "chat_templates" / TEMPLATES[model_type]
    return path.read_text() if path.is_file() else None


def write_model(name: str, model_type: str, task: str, extra: dict, out: Path, tok) -> None:
    import copy

    from transformers import GenerationConfig

    model = build_model(model_type, task, extra, tok)
    model.save_pretrained(str(out))
    template = family_template(model_type)
    if template is not None:
        tok = copy.deepcopy(tok)
        tok.chat_template = template
    tok.save_pretrained(str(out))
    if task == "causal":
        GenerationConfig(
            bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
        ).save_pretrained(str(out))


REMOTE_CONFIG = '''from transformers import LlamaConfig


class RemoteConfig(LlamaConfig):
    """A Llama configuration under a model type transformers does not know (custom code)."""

    model_type = "remote"
'''

REMOTE_MODEL = '''from transformers import LlamaForCausalLM

from .configuration_remote import RemoteConfig


class RemoteForCausalLM(LlamaForCausalLM):
    """Llama's network under a class only this directory defines (custom code)."""

    config_class = RemoteConfig
'''


def write_remote(out: Path, tok) -> None:
    """tiny-RemoteForCausalLM: loads only with trust_remote_code=True (its classes are in the directory)."""
    model = build_model("llama", "causal", TINY_MLP, tok)
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    cfg = json.loads((out / "config.json").read_text())
    cfg.update(
        model_type="remote",
        architectures=["RemoteForCausalLM"],
        auto_map={
            "AutoConfig": "configuration_remote.RemoteConfig",
            "AutoModelForCausalLM": "modeling_remote.RemoteForCausalLM",
        },
    )
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    (out / "configuration_remote.py").write_text(REMOTE_CONFIG)
    (out / "modeling_remote.py").write_text(REMOTE_MODEL)


def build(root: Path, log=print) -> dict[str, str]:
    """Every stand-in under root/trl-internal-testing (kept when already built at this VERSION):
    {name: "ok" | the error that kept it from being built}."""
    org = root / ORG
    stamp = org / "STANDINS.json"
    if stamp.exists() and json.loads(stamp.read_text()).get("version") == VERSION:
        return json.loads(stamp.read_text())["built"]
    import shutil

    shutil.rmtree(org, ignore_errors=True)
    org.mkdir(parents=True)
    tok = tokenizer()
    built: dict[str, str] = {}
    write_zen(org / "zen")
    built["zen"] = "ok"
    for name, (model_type, task, extra) in MODELS.items():
        try:
            write_model(name, model_type, task, extra, org / name, tok)
            built[name] = "ok"
        except Exception as e:  # a family this transformers cannot build small: no stand-in, named
            shutil.rmtree(org / name, ignore_errors=True)
            built[name] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        log(f"stand-in {name}: {built[name]}")
    write_remote(org / "tiny-RemoteForCausalLM", tok)
    built["tiny-RemoteForCausalLM"] = "ok"
    stamp.write_text(json.dumps({"version": VERSION, "built": built}, indent=2))
    return built


if __name__ == "__main__":
    print(json.dumps(build(Path(sys.argv[1])), indent=2))
