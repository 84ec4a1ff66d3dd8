"""Reward models as reward functions (grpolab.rewards.reward_model), against TRL 1.16: the scores of
GRPOTrainer._calculate_rewards on a real TRL trainer, standard and conversational, from a directory and from
a loaded model with its tokenizer; the weights, the metrics, the refusal of hub ids, and runs that train
with one (TRL's GRPOTrainer spelling and a grpolab recipe)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from grpolab.batch import Example
from grpolab.util.fields import ConfigError

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = ROOT / "src" / "grpolab" / "data" / "smollm2-tokenizer"

# two groups of two completions: lengths differ within and across groups (padding on the right)
PROMPTS = ["The cat sat on", "The cat sat on", "A dog ran to", "A dog ran to"]
COMPLETIONS = [" the mat.", " the park and then all the way back home", "", " x"]
CHAT_PROMPTS = [[{"role": "user", "content": p}] for p in PROMPTS]
CHAT_PROMPTS[2] = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPTS[2]}]
CHAT_PROMPTS[3] = CHAT_PROMPTS[2]


def make_reward_model(out: Path, *, dtype=torch.float32, seed: int = 1, arch: str = "qwen2") -> Path:
    """A tiny random sequence-classification model (one output) with the SmolLM2 tokenizer, its weights
    spread (std 0.3) so that the scores differ from text to text."""
    from transformers import (
        AutoTokenizer,
        LlamaConfig,
        LlamaForSequenceClassification,
        Qwen2Config,
        Qwen2ForSequenceClassification,
    )

    tok = AutoTokenizer.from_pretrained(str(TOKENIZER))
    kw = dict(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        pad_token_id=tok.pad_token_id,
        num_labels=1,
    )
    torch.manual_seed(seed)
    model = (
        Qwen2ForSequenceClassification(Qwen2Config(**kw))
        if arch == "qwen2"
        else LlamaForSequenceClassification(LlamaConfig(**kw))
    )
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    model.to(dtype).save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return out


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory) -> Path:
    return make_reward_model(tmp_path_factory.mktemp("rm") / "tiny-Qwen2ForSequenceClassification")


@pytest.fixture(scope="module")
def trl_trainer_of(tiny_model_dir, tmp_path_factory):
    """A real TRL 1.16 GRPOTrainer on the tiny policy with the given reward_funcs (and processing classes)."""
    pytest.importorskip("trl", reason="TRL is in the test extra")
    sys.path.insert(0, str(Path(__file__).parent))
    import datasets
    from trl import GRPOTrainer
    from trl_parity import trl_config

    def build(reward_funcs, reward_processing_classes=None, **fields):
        return GRPOTrainer(
            model=str(tiny_model_dir),
            reward_funcs=reward_funcs,
            reward_processing_classes=reward_processing_classes,
            args=trl_config(tmp_path_factory.mktemp("trl"), **fields),
            train_dataset=datasets.Dataset.from_list([{"prompt": p} for p in PROMPTS]),
        )

    return build


def trl_rewards(trainer, prompts, completions) -> torch.Tensor:
    """GRPOTrainer._calculate_rewards of TRL 1.16, as its step calls it: (N, functions)."""
    return trainer._calculate_rewards([{"prompt": p} for p in prompts], prompts, completions, [[1]] * len(prompts))


def grpolab_scores(specs, prompts, completions, chat: bool):
    """grpolab's path: build_rewards (through grpolab.train's registration of objects), then
    score_completions over the groups (one call per group of completions that share an example)."""
    from grpolab.app.api import _registered
    from grpolab.rewards import build_rewards
    from grpolab.rewards.reward_model import place_reward_models
    from grpolab.rewards.scoring import score_completions

    examples, seen = [], {}
    for p in prompts:  # consecutive equal prompts are one example (one group)
        key = json.dumps(p)
        if not examples or json.dumps(examples[-1].prompt) != key:
            seen[key] = Example(prompt=p, answer="")
        examples.append(seen[key])
    with _registered(specs) as built:
        fns = build_rewards(built)
    place_reward_models(fns, torch.device("cpu"))
    return fns, score_completions(fns, completions, examples, thread="main")


def assert_close(ours, theirs, tol=1e-5):
    assert len(ours) == len(theirs)
    assert max(abs(a - b) for a, b in zip(ours, theirs)) <= tol, (ours, theirs)


# --- the texts ----------------------------------------------------------------------------------------------


def test_texts_are_the_prompt_and_completion_or_the_chat_template():
    from transformers import AutoTokenizer

    from grpolab.rewards.reward_model import reward_texts

    tok = AutoTokenizer.from_pretrained(str(TOKENIZER))
    assert reward_texts(["ab", "c"], ["1", ""], tok) == ["ab1", "c"]
    chat = reward_texts([[{"role": "user", "content": "hi"}]], [[{"role": "assistant", "content": "yo"}]], tok)
    assert chat == [
        tok.apply_chat_template(
            [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}], tokenize=False
        )
    ]
    assert chat[0].count("<|im_start|>") == 3 and chat[0].endswith("yo<|im_end|>\n")  # SmolLM2 adds a system turn


# --- parity with TRL 1.16 -------------------------------------------------------------------------------------


@pytest.mark.parametrize("chat", [False, True], ids=["standard", "conversational"])
def test_a_directory_scores_as_trl_scores_it(rm_dir, trl_trainer_of, chat):
    prompts = CHAT_PROMPTS if chat else PROMPTS
    completions = [[{"role": "assistant", "content": c}] for c in COMPLETIONS] if chat else COMPLETIONS
    trainer = trl_trainer_of(str(rm_dir))
    theirs = trl_rewards(trainer, prompts, completions)[:, 0].tolist()
    assert len(set(round(x, 6) for x in theirs)) == 4  # four different scores: the comparison means something
    from grpolab.app.trl_compat.rewards import reward_specs

    specs = reward_specs(str(rm_dir), None)
    assert specs == [{"name": "reward_model", "path": str(rm_dir), "label": rm_dir.name, "weight": 1.0}]
    assert trainer.reward_func_names == [rm_dir.name]  # TRL's name for it is grpolab's label
    fns, s = grpolab_scores(specs, prompts, COMPLETIONS, chat)
    assert_close(s.per_fn[rm_dir.name], theirs)


def test_a_loaded_model_with_its_tokenizer_scores_as_trl_scores_it(rm_dir, trl_trainer_of):
    """reward_funcs=model, reward_processing_classes=tokenizer; the tokenizer has no pad token, so both
    pad with its EOS and point the model's pad_token_id at it."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from grpolab.app.trl_compat.rewards import reward_specs

    def loaded():
        tok = AutoTokenizer.from_pretrained(str(rm_dir))
        tok.pad_token = None
        return AutoModelForSequenceClassification.from_pretrained(str(rm_dir), num_labels=1), tok

    model, tok = loaded()
    trainer = trl_trainer_of([model], [tok])
    theirs = trl_rewards(trainer, PROMPTS, COMPLETIONS)[:, 0].tolist()
    model, tok = loaded()
    specs = reward_specs([model], None, [tok])
    assert tok.pad_token == tok.eos_token and model.config.pad_token_id == tok.eos_token_id
    _, s = grpolab_scores(specs, PROMPTS, COMPLETIONS, False)
    assert_close(s.per_fn[specs[0]["label"]], theirs)


def test_weights_and_metrics_are_trls(rm_dir, trl_trainer_of, tmp_path):
    """Two reward models (a Llama and a Qwen2) weighted 0.5 and 2: the weighted sum, and each one's mean and
    Bessel-corrected std, as TRL computes rewards, rewards/<name>/mean and rewards/<name>/std."""
    from grpolab.app.trl_compat.rewards import reward_specs

    other = make_reward_model(tmp_path / "tiny-LlamaForSequenceClassification", seed=7, arch="llama")
    weights = [0.5, 2.0]
    trainer = trl_trainer_of([str(rm_dir), str(other)], reward_weights=weights)
    per_func = trl_rewards(trainer, PROMPTS, COMPLETIONS)
    total = (per_func * torch.tensor(weights)).nansum(dim=1).tolist()
    _, s = grpolab_scores(reward_specs([str(rm_dir), str(other)], weights), PROMPTS, COMPLETIONS, False)
    assert_close(s.total, total)
    for i, name in enumerate(trainer.reward_func_names):
        col = per_func[:, i]
        assert s.metrics[f"reward/{name}/mean"] == pytest.approx(col.mean().item(), abs=1e-5)
        assert s.metrics[f"reward/{name}/std"] == pytest.approx(col.std().item(), abs=1e-5)  # Bessel, as nanstd


def test_std_metric_worked_arithmetic():
    from grpolab.rewards.scoring import sample_std

    assert sample_std([1.0, 3.0]) == pytest.approx(math.sqrt(2.0))  # mean 2, (1 + 1) / (2 - 1)
    assert sample_std([2.0, 4.0, 9.0]) == pytest.approx(math.sqrt(13.0))  # mean 5, (9 + 1 + 16) / 2
    assert sample_std([5.0]) == 0.0 and sample_std([]) == 0.0


def test_the_checkpoint_dtype_is_kept_and_the_run_autocast_applies(tmp_path):
    from grpolab.rewards.reward_model import checkpoint_dtype
    from grpolab.rewards.reward_model import make_reward_model as make

    d = make_reward_model(tmp_path / "bf16", dtype=torch.bfloat16)
    assert checkpoint_dtype(d) == "bfloat16"
    rm = make(str(d))
    assert rm.model.dtype == torch.bfloat16  # dtype=auto: the checkpoint's, as transformers 5 (and TRL) load it
    assert make(str(d), dtype="float32").model.dtype == torch.float32
    fp32 = make(str(d), dtype="float32")
    plain = fp32(COMPLETIONS, prompts=PROMPTS)
    fp32.place(torch.device("cpu"), torch.bfloat16)  # the run's autocast: bf16 matmuls, close to fp32
    amp = fp32(COMPLETIONS, prompts=PROMPTS)
    assert plain != amp and max(abs(a - b) for a, b in zip(plain, amp)) < 0.1
    one_at_a_time = make(str(d), dtype="float32", batch_size=1)(COMPLETIONS, prompts=PROMPTS)
    assert_close(one_at_a_time, plain)  # padding on the right changes no score


# --- refusals ---------------------------------------------------------------------------------------------------


def test_a_hub_id_is_refused_saying_grpolab_never_downloads(tmp_path):
    from grpolab import GRPOConfig, GRPOTrainer
    from grpolab.rewards import build_rewards

    with pytest.raises(
        ConfigError, match=r"reward_funcs\[0\]='OpenAssistant/rm': not a local directory.*never downloads"
    ):
        GRPOTrainer(
            model="smollm2-135m",
            reward_funcs="OpenAssistant/rm",
            args=GRPOConfig(output_dir=str(tmp_path / "x")),
            train_dataset=[{"prompt": "hi"}],
        )
    with pytest.raises(ConfigError, match=r"reward_model.path='org/rm': not a local directory.*never downloads"):
        build_rewards([{"name": "reward_model", "path": "org/rm"}])
    with pytest.raises(ConfigError, match="reward_model needs path"):
        build_rewards([{"name": "reward_model"}])
    with pytest.raises(ConfigError, match="dtype: expected one of auto, float32, bfloat16"):
        build_rewards([{"name": "reward_model", "path": str(tmp_path), "dtype": "fp8"}])
    with pytest.raises(ConfigError, match=r"reward_processing_classes: 2 for 1 reward functions"):
        GRPOTrainer(
            model="smollm2-135m",
            reward_funcs=lambda completions, **kw: [0.0] * len(completions),
            reward_processing_classes=[None, None],
            args=GRPOConfig(output_dir=str(tmp_path / "y")),
            train_dataset=[{"prompt": "hi"}],
        )


def test_the_cli_refuses_a_hub_id_with_exit_2(tiny_model_dir, tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        yaml.safe_dump({"model": str(tiny_model_dir), "rewards": [{"name": "reward_model", "path": "org/rm"}]})
    )
    out = tmp_path / "run"
    p = subprocess.run(
        [sys.executable, "-m", "grpolab", "train", str(recipe), f"out={out}", "steps=1"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert p.returncode == 2, p.stdout + p.stderr
    assert "rewards[0]: reward_model.path='org/rm': not a local directory" in p.stdout + p.stderr
    assert "never downloads" in p.stdout + p.stderr and not (out / "metrics.jsonl").exists()


# --- training with a reward model -------------------------------------------------------------------------------


def rescore(rm_dir: Path, prompt, completion) -> float:
    """TRL's score of one completion, computed here from transformers alone (one text, no padding)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(rm_dir))
    model = AutoModelForSequenceClassification.from_pretrained(str(rm_dir), num_labels=1)
    text = (
        tok.apply_chat_template(prompt + [{"role": "assistant", "content": completion}], tokenize=False)
        if isinstance(prompt, list)
        else prompt + completion
    )
    with torch.inference_mode():
        return model(**tok(text, return_tensors="pt", add_special_tokens=False)).logits[0, 0].item()


def test_grpotrainer_trains_two_steps_with_a_reward_model(tiny_model_dir, rm_dir, tmp_path):
    from grpolab import GRPOConfig, GRPOTrainer

    out = tmp_path / "run"
    args = GRPOConfig(
        output_dir=str(out),
        max_steps=2,
        max_completion_length=8,
        num_generations=4,
        per_device_train_batch_size=8,
        bf16=False,
        reward_weights=[2.0],
    )
    rows = [{"prompt": [{"role": "user", "content": f"Say {w}."}]} for w in ("yes", "no", "maybe", "why")]
    result = GRPOTrainer(model=str(tiny_model_dir), reward_funcs=str(rm_dir), args=args, train_dataset=rows).train()
    assert result.global_step == 2
    name = rm_dir.name
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    assert cfg["rewards"] == [{"name": "reward_model", "path": str(rm_dir), "label": name, "weight": 2.0}]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 2 and all(f"reward/{name}/mean" in m and f"reward/{name}/std" in m for m in metrics)
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert samples
    for s in samples:  # every recorded score is TRL's score of that prompt and completion; the total weighs it
        assert s["rewards"][name] == pytest.approx(rescore(rm_dir, s["prompt"], s["completion"]), abs=1e-5)
        assert s["reward"] == pytest.approx(2.0 * s["rewards"][name], abs=1e-6)


def test_a_recipe_trains_with_a_reward_model_object_free(tiny_model_dir, rm_dir, tmp_path):
    """grpolab's own spelling: rewards: [{name: reward_model, path: DIR}] beside a verifier, on the command line."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "model": str(tiny_model_dir),
                "task": "arithmetic",
                "rewards": [
                    {"name": "reward_model", "path": str(rm_dir), "weight": 0.5},
                    {"name": "format", "weight": 0.1},
                ],
            }
        )
    )
    out = tmp_path / "run"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpolab",
            "train",
            str(recipe),
            f"out={out}",
            "steps=1",
            "batch_size=4",
            "G=2",
            "max_new_tokens=6",
            "eval_size=0",
        ],
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT / "src")},
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    m = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert {"reward/reward_model/mean", "reward/reward_model/std", "reward/format/mean"} <= set(m)
    s = json.loads((out / "samples.jsonl").read_text().splitlines()[0])
    assert s["reward"] == pytest.approx(0.5 * s["rewards"]["reward_model"] + 0.1 * s["rewards"]["format"], abs=1e-6)
    assert s["rewards"]["reward_model"] == pytest.approx(rescore(rm_dir, s["prompt"], s["completion"]), abs=1e-5)


# --- the plan -----------------------------------------------------------------------------------------------------


def _plan(capsys, *args) -> dict:
    from grpolab.app.cli import main

    base = ["model=smollm2-135m", "G=4", "batch_size=8", "max_new_tokens=16", "algo.beta=0", "precision=fp32"]
    assert main(["plan", *base, *args, "--prompt-tokens", "10", "--memory", "24GB", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_plan_holds_the_reward_models_weights_and_its_forward(rm_dir, tmp_path, capsys):
    """A second network: its weights resident in every phase, and one no-grad forward of a group (G = 4
    sequences of 10 + 16 positions) in a phase of its own; its FLOPs over the step's 8 sequences."""
    from transformers import AutoModelForSequenceClassification

    from grpolab.training.plan.devices import parse_memory
    from grpolab.training.plan.estimate import MATMUL_EFFICIENCY

    params = sum(p.numel() for p in AutoModelForSequenceClassification.from_pretrained(str(rm_dir)).parameters())
    without = _plan(capsys)
    spec = f"rewards=[{{name: reward_model, path: '{rm_dir}'}}, {{name: format, weight: 0.1}}]"
    out = _plan(capsys, spec)
    resident = out["phases"]["resident"]["parts"]
    assert resident["reward model weights"] == 4 * params  # fp32 as saved
    assert out["phases"]["resident"]["total"] == without["phases"]["resident"]["total"] + 4 * params
    parts = out["phases"]["reward model"]["parts"]
    T, S = 4 * 26, 26  # n = G = 4 sequences per call, S = 10 + 16 positions; H 32, I 64, 4 heads
    assert parts["hidden states"] == 2 * T * 32 * 4
    assert parts["layer intermediates"] == 3 * T * 64 * 4 + 2 * T * 32 * 4 + 4 * S * S  # MLP, norms, mask
    assert parts["weight casts"] == 0  # fp32 weights, fp32 run: nothing cast
    linear = 32 * 32 + 2 * 32 * 16 + 32 * 32 + 3 * 32 * 64  # q, k, v, o (head_dim 8, 2 kv heads), the MLP
    flops = 2 * 2 * linear * 8 * S + 4 * 2 * 32 * 8 * S * S / 2  # 2 layers, 8 sequences of the step
    card = parse_memory("24GB")
    assert out["seconds"]["reward model"] == pytest.approx(flops / (card.fp32_flops * MATMUL_EFFICIENCY))
    bf16 = _plan(capsys, spec.replace("path:", "dtype: bfloat16, path:"))
    assert bf16["phases"]["resident"]["parts"]["reward model weights"] == 2 * params


def test_the_plan_refuses_a_reward_models_hub_id(capsys):
    from grpolab.app.cli import main

    spec = "rewards=[{name: reward_model, path: org/rm}]"
    assert main(["plan", "model=smollm2-135m", spec, "--prompt-tokens", "10", "--memory", "24GB"]) == 2
    assert "never downloads" in capsys.readouterr().err


@pytest.mark.parametrize(
    "arch,hidden,inter,heads,kv,n,S",
    [("qwen2", 256, 1024, 8, 2, 8, 200), ("llama", 128, 512, 4, 4, 16, 100), ("llama", 512, 1024, 8, 8, 4, 300)],
)
def test_the_forwards_bytes_are_what_the_cpu_allocator_holds(arch, hidden, inter, heads, kv, n, S):
    """The peak bytes torch's CPU allocator holds during one scoring forward (the profiler's memory events,
    as benchmarks/memory_plan.py reads them), against grpolab.training.plan.reward_nets.forward_bytes: a
    padded batch (its first text half as long), fp32."""
    from torch.profiler import ProfilerActivity, profile
    from transformers import (
        AutoTokenizer,
        LlamaConfig,
        LlamaForSequenceClassification,
        Qwen2Config,
        Qwen2ForSequenceClassification,
    )

    from grpolab.training.plan.reward_nets import RewardNet, forward_bytes
    from grpolab.training.plan.shapes import Shape

    tok = AutoTokenizer.from_pretrained(str(TOKENIZER))
    kw = dict(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        pad_token_id=tok.pad_token_id,
        num_labels=1,
    )
    torch.manual_seed(0)
    cls, conf = (
        (Qwen2ForSequenceClassification, Qwen2Config)
        if arch == "qwen2"
        else (LlamaForSequenceClassification, LlamaConfig)
    )
    model = cls(conf(**kw)).eval()
    ids = torch.randint(100, 40000, (n, S))
    mask = torch.ones_like(ids)
    mask[0, S // 2 :] = 0
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof, torch.inference_mode():
        model(input_ids=ids, attention_mask=mask, use_cache=False)
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    live = peak = 0
    for _, b in events:
        live += b
        peak = max(peak, live)
    predicted = sum(forward_bytes(RewardNet("rm", Shape.from_config(model.config.to_dict()), 4), n, S, 4).values())
    assert predicted == pytest.approx(peak, rel=0.05), (predicted, peak)


def test_the_run_puts_its_reward_model_on_its_device_under_its_autocast(tiny_model_dir, rm_dir, tmp_path):
    """grpolab.training.trainer.setup places every reward model: the policy's device, the scoring passes'
    autocast dtype, the run's chat_template_kwargs."""
    from grpolab.rewards.reward_model import reward_model_of
    from grpolab.training.config import build_config
    from grpolab.training.trainer import setup

    cfg = build_config(
        {
            "model": str(tiny_model_dir),
            "out": str(tmp_path / "run"),
            "rewards": [{"name": "reward_model", "path": str(rm_dir)}],
            "chat_template_kwargs": {"enable_thinking": False},
        }
    )
    run = setup(cfg, training=False, log=lambda *_: None)
    (rm,) = [reward_model_of(f.fn) for f in run.reward_fns]
    assert rm.device == run.device and rm.autocast == run.amp_dtype
    assert rm.template_kwargs == {"enable_thinking": False}
