"""The trainer object a TRL 1.16 script holds, side by side: one script, written the way TRL's docs and notebooks
write it (a model object and its tokenizer, a callback reading logs["reward"], num_iterations=2 with
steps_per_generation=2, evaluation every 4 optimizer steps, evaluate(), state.log_history, save_state,
log_metrics / save_metrics, then a new trainer resuming to more steps), run under real TRL and under grpolab
with only the import changed. What each reads back is compared: global_step, max_steps, the rows of
log_history (their steps, their keys in order, the learning rates, num_tokens, epochs), what the callback
saw, evaluate()'s keys, and that trainer.model is the object passed in, trained in place."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

pytest.importorskip("trl")

from grpolab.training.trl_names import MISSING  # noqa: E402

RUNTIME = {"eval_runtime", "eval_samples_per_second", "eval_steps_per_second"}


def reward_len(completions, **kwargs):
    return [len(c) / 10 for c in completions]


def script(lib: str, model_dir, out, max_steps: int = 8, resume: bool | str = False, keep: int | None = None) -> dict:
    """The user's script; `lib` is the only thing that changes ("trl" or "grpolab"). resume: True, or a
    checkpoint's path; keep: save_total_limit."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    mod = importlib.import_module(lib)
    GRPOConfig, GRPOTrainer = mod.GRPOConfig, mod.GRPOTrainer

    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rewards_seen = []

    class RewardWatch(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if "reward" in logs:
                rewards_seen.append((state.global_step, logs["reward"]))

    ds = Dataset.from_dict({"prompt": [f"Count to {i}" for i in range(8)]})
    args = GRPOConfig(
        output_dir=str(out),
        max_steps=max_steps,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=6,
        num_iterations=2,
        steps_per_generation=2,
        logging_steps=1,
        save_steps=4,
        save_total_limit=keep,
        eval_strategy="steps",
        eval_steps=4,
        per_device_eval_batch_size=4,
        report_to="none",
        bf16=False,
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=model,
        processing_class=tok,
        reward_funcs=reward_len,
        args=args,
        train_dataset=ds,
        eval_dataset=ds.select(range(2)),
        callbacks=[RewardWatch()],
    )
    result = trainer.train(resume_from_checkpoint=resume or None)
    trainer.log_metrics("train", result.metrics)
    trainer.save_metrics("train", result.metrics)
    trainer.save_state()
    metrics = trainer.evaluate()
    ids = tok("Count to 3", return_tensors="pt").input_ids
    generated = trainer.model.generate(ids, max_new_tokens=2, do_sample=False)
    return {
        "global_step": result.global_step,
        "train_metrics": sorted(result.metrics),
        "max_steps": trainer.state.max_steps,
        "rows": [dict(r) for r in trainer.state.log_history],
        "rewards_seen": rewards_seen,
        "eval": list(metrics),
        "same_object": trainer.model is model,
        "trained": any(not torch.equal(before[k], v) for k, v in model.state_dict().items()),
        "generated": tuple(generated.shape),
        "state_file": (out / "trainer_state.json").is_file(),
        "is_main": trainer.is_world_process_zero() and trainer.accelerator.is_main_process,
    }


@pytest.fixture(scope="module")
def both(tiny_model_dir, tmp_path_factory):
    base = tmp_path_factory.mktemp("side-by-side")
    return {lib: script(lib, tiny_model_dir, base / lib) for lib in ("trl", "grpolab")}


def _keys(row: dict, drop=frozenset()) -> list[str]:
    return [k for k in row if k not in MISSING and k not in drop]


def test_global_step_and_max_steps_count_optimizer_updates(both):
    trl, ours = both["trl"], both["grpolab"]
    assert trl["global_step"] == ours["global_step"] == 8  # 2 generations x num_iterations 2 x 2 parts
    assert trl["max_steps"] == ours["max_steps"] == 8
    assert trl["train_metrics"] == ours["train_metrics"]


def test_log_history_has_trls_rows_names_and_order(both):
    trl, ours = both["trl"]["rows"], both["grpolab"]["rows"]
    assert [r["step"] for r in ours] == [r["step"] for r in trl]  # 4 update rows, eval, 4, eval, closing row
    for a, b in zip(trl, ours):
        if "eval_reward" in a:  # grpolab's own eval_... keys follow TRL's; runtimes and eval_loss only in
            # evaluate()'s row (the training run's evaluations make no loss pass)
            assert [k for k in _keys(b) if k in a] == _keys(a, (RUNTIME | {"eval_loss"}) - set(b))
        else:
            assert _keys(b) == _keys(a)
    lr = [r["learning_rate"] for r in trl if "learning_rate" in r]
    assert lr == pytest.approx([1e-6 * (8 - i) / 8 for i in range(8)])  # the lr each update used
    assert [r["learning_rate"] for r in ours if "learning_rate" in r] == pytest.approx(lr)
    for key in ("num_tokens", "epoch"):
        assert [r[key] for r in ours if key in r] == pytest.approx([r[key] for r in trl if key in r])


def test_a_callback_reads_logs_reward_as_under_trl(both):
    trl, ours = both["trl"]["rewards_seen"], both["grpolab"]["rewards_seen"]
    assert [s for s, _ in ours] == [s for s, _ in trl] == [1, 5]  # once per generation, on its first update


def test_evaluate_returns_trls_eval_metrics(both):
    trl, ours = both["trl"]["eval"], both["grpolab"]["eval"]
    assert [k for k in ours if k in trl] == _keys(dict.fromkeys(trl))


def test_the_model_object_is_trained_in_place(both):
    for lib in ("trl", "grpolab"):
        got = both[lib]
        assert got["same_object"] and got["trained"], lib  # trainer.model is the object passed, its weights moved
        assert got["generated"][1] > 0 and got["state_file"] and got["is_main"], lib


def _checkpoints(out) -> list[str]:
    return sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint-"))


def test_resume_from_checkpoint_trains_on_to_the_new_max_steps(tiny_model_dir, tmp_path):
    """A finished 4-step run; transformers' get_last_checkpoint(output_dir) finds the same checkpoint-N under
    both libraries (N in optimizer steps: num_iterations=2 x steps_per_generation=2 updates per generation),
    from_pretrained loads it, its trainer_state.json is transformers' (global_step, max_steps, the log so far).
    Then a new trainer (a fresh model object) with max_steps=8 and resume_from_checkpoint=that path: both train
    the 4 further optimizer steps, log_history keeps the first run's rows up to its checkpoint before the new
    ones, and save_total_limit=1 leaves checkpoint-8 alone."""
    import json

    from transformers import AutoModelForCausalLM
    from transformers.trainer_utils import get_last_checkpoint

    got = {}
    for lib in ("trl", "grpolab"):
        out = tmp_path / lib
        first = script(lib, tiny_model_dir, out, max_steps=4, keep=1)
        last = get_last_checkpoint(str(out))
        model = AutoModelForCausalLM.from_pretrained(last)
        state = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
        again = script(lib, tiny_model_dir, out, max_steps=8, resume=last, keep=1)
        assert (first["global_step"], again["global_step"], again["max_steps"]) == (4, 8, 8), lib
        assert again["trained"] and again["same_object"], lib
        got[lib] = {
            "last": Path(last).name,
            "loaded": type(model).__name__,
            "state": (state["global_step"], state["max_steps"], [r["step"] for r in state["log_history"]]),
            "steps": [r["step"] for r in again["rows"]],
            "after": (Path(get_last_checkpoint(str(out))).name, _checkpoints(out)),
        }
    assert got["grpolab"] == got["trl"]
    assert got["trl"]["last"] == "checkpoint-4" and got["trl"]["after"] == ("checkpoint-8", ["checkpoint-8"])
    assert got["trl"]["state"] == (4, 4, [1, 2, 3, 4, 4])  # 4 update rows and the evaluation at 4
    # the first run's rows up to its checkpoint (its closing row and evaluate() came after it), then 4 more,
    # the evaluation at 8, the closing row, evaluate()
    assert got["trl"]["steps"] == [1, 2, 3, 4, 4, 5, 6, 7, 8, 8, 8, 8]


def _reference(lib: str, model_dir, out, beta: float, peft: bool, train: bool = False) -> dict:
    """trainer.ref_model as a script reads it, after construction (and after one optimizer update)."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    mod = importlib.import_module(lib)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    peft_config = None
    if peft:
        from peft import LoraConfig

        peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    args = mod.GRPOConfig(
        output_dir=str(out),
        max_steps=1,
        beta=beta,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=4,
        report_to="none",
        bf16=False,
        use_cpu=True,
        disable_tqdm=True,
        save_strategy="no",
    )
    trainer = mod.GRPOTrainer(
        model=model,
        processing_class=AutoTokenizer.from_pretrained(str(model_dir)),
        reward_funcs=reward_len,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": [f"Count to {i}" for i in range(4)]}),
        peft_config=peft_config,
    )
    ref = trainer.ref_model
    seen = {"ref": ref is None and None, "calls": 0}
    if ref is not None:
        state = ref.state_dict()
        seen["ref"] = (type(ref).__name__, ref is not trainer.model, ref.training)
        seen["initial"] = sorted(initial) == sorted(state) and all(torch.equal(initial[k], state[k]) for k in state)
    if train:
        held = ref
        for m in ref.modules():  # the reference pass of the KL term runs this object
            m.register_forward_hook(lambda *_: seen.__setitem__("calls", seen["calls"] + 1))
        trainer.train()
        state = trainer.ref_model.state_dict()
        seen["after"] = (
            trainer.ref_model is held,
            all(torch.equal(initial[k], state[k]) for k in state),
            any(not torch.equal(initial[k], v) for k, v in model.state_dict().items()),
        )
    return seen


@pytest.mark.parametrize("beta, peft", [(0.0, False), (0.04, False), (0.04, True)], ids=["beta0", "beta", "peft"])
def test_ref_model_is_trls(tiny_model_dir, tmp_path, beta, peft):
    """trainer.ref_model: None without a KL term (beta=0.0) and with PEFT (the adapter off is the reference);
    otherwise a separate model of the policy's class holding the initial weights, under both libraries."""
    got = {lib: _reference(lib, tiny_model_dir, tmp_path / lib, beta, peft) for lib in ("trl", "grpolab")}
    assert got["grpolab"] == got["trl"]
    assert (got["trl"]["ref"] is None) == (beta == 0.0 or peft)


def test_ref_model_is_the_reference_the_run_uses(tiny_model_dir, tmp_path):
    """After train() grpolab's trainer.ref_model is still the object it held: the KL term's reference passes
    ran it, its weights are the initial ones while the policy's moved."""
    seen = _reference("grpolab", tiny_model_dir, tmp_path / "run", 0.04, False, train=True)
    assert seen["calls"] > 0 and seen["after"] == (True, True, True)
