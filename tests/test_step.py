"""The training step's stages (grpolab.training.step) on plain data: the per-step generator, the Batch, and
what samples.jsonl records."""

from types import SimpleNamespace

import pytest
import torch

from grpolab.batch import Batch, Rollout
from grpolab.training import step as step_mod
from grpolab.training import update as update_mod
from grpolab.training.run import rollout_sampling, step_rng


def test_step_rng_is_per_step_reproducible_and_on_the_device():
    a_py, a = step_rng(3, 7, torch.device("cpu"))
    b_py, b = step_rng(3, 7, torch.device("cpu"))
    _, c = step_rng(3, 8, torch.device("cpu"))
    first = torch.rand(4, generator=a)
    assert torch.equal(first, torch.rand(4, generator=b)) and a_py.random() == b_py.random()
    assert not torch.equal(first, torch.rand(4, generator=c))
    assert a.device == torch.device("cpu")
    # the stream continues across calls within the step (DAPO refill rounds draw new numbers)
    assert not torch.equal(first, torch.rand(4, generator=a))


def test_rollout_uses_the_callers_generator_on_any_device(monkeypatch, tiny_tokenizer):
    """rollout_examples passes the step's generator through the engine untouched, whatever the device. It
    used to make a fresh CUDA generator seeded with the same seed on every call, so on a GPU every refill
    round of dynamic sampling drew the same random numbers. Checked with a fake CUDA device and a stub
    `generate` behind the native engine, so no GPU is needed (making a CUDA generator here would raise)."""
    import grpolab.engine.native.engine as native_mod
    from grpolab.engine.native.engine import NativeEngine

    seen = []
    monkeypatch.setattr(native_mod, "generate", lambda *a, **k: seen.append(k["generator"]) or SimpleNamespace())
    engine = NativeEngine(None, tiny_tokenizer, device=torch.device("cuda"), dtype=None, decoder="auto", eos_ids={0})
    cfg = SimpleNamespace(
        max_new_tokens=4, temperature=1.0, top_p=1.0, top_k=0, min_p=0.0, repetition_penalty=1.0, generation_kwargs={}
    )
    run = SimpleNamespace(
        policy=None,
        tokenizer=tiny_tokenizer,
        task=SimpleNamespace(system_prompt=None),
        engine=engine,
        sampling=rollout_sampling(cfg),
    )
    gen = torch.Generator()
    examples = [SimpleNamespace(prompt="1+1?")]
    step_mod.rollout_examples(run, examples, G=2, generator=gen)
    step_mod.rollout_examples(run, examples, G=2, generator=gen)
    assert seen == [gen, gen] and all(g is gen for g in seen)


def toy_batch() -> Batch:
    """Two groups of G = 2: completions of lengths 2, 1 | 3, 3."""
    mask = torch.tensor([[1.0, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 1]])
    rollout = Rollout(
        prompt_ids=torch.ones(4, 2, dtype=torch.long),
        prompt_mask=torch.ones(4, 2, dtype=torch.long),
        completion_ids=torch.arange(12).view(4, 3),
        completion_mask=mask,
        sample_logp=-mask,
        truncated=torch.tensor([False, False, True, True]),
        texts=["a", "b", "c", "d"],
        G=2,
    )
    return Batch(
        [SimpleNamespace(id=f"p{i}", prompt=f"q{i}", answer=str(i)) for i in range(2)],
        rollout,
        torch.tensor([1.0, 0.0, 0.5, 0.5]),
        {"math": [1.0, 0.0, 0.5, 0.5]},
    )


def test_batch_keeps_whole_groups():
    batch = toy_batch()
    assert batch.n_tokens == 9 and not batch.empty
    kept = batch.keep_groups(torch.tensor([False, True]))
    assert [e.id for e in kept.examples] == ["p1"] and kept.rollout.texts == ["c", "d"]
    assert kept.raw_reward.tolist() == [0.5, 0.5] and kept.reward_by_fn == {"math": [0.5, 0.5]}
    assert kept.n_tokens == 6
    none = batch.keep_groups(torch.tensor([False, False]))
    assert none.empty and none.examples == [] and none.reward_by_fn == {"math": []}


def test_computed_groups_is_the_one_rule_for_which_rows_update_runs():
    """A group with any nonzero advantage is computed; every group is when a KL term in the loss (with a
    reference) or the advantage component needs it. Sequence (N,) and per-token (N, C) advantages alike."""
    from grpolab.algo.presets import resolve_algo

    batch = toy_batch()
    grpo, rloo = resolve_algo("grpo"), resolve_algo("rloo")  # KL in the loss / in the reward
    batch.adv = torch.tensor([0.5, -0.5, 0.0, 0.0])  # (N,)
    assert update_mod.computed_groups(batch, grpo, False).tolist() == [True, False]  # no reference: no KL term
    assert update_mod.computed_groups(batch, grpo, True).tolist() == [True, True]  # a critic needs every group
    batch.ref_logp = torch.zeros(4, 3)
    assert update_mod.computed_groups(batch, grpo, False).tolist() == [True, True]  # the KL term in the loss
    assert update_mod.computed_groups(batch, rloo, False).tolist() == [True, False]  # the KL is in the reward
    batch.adv = torch.zeros(4, 3)
    batch.adv[3, 2] = 1.0  # (N, C): one token of group 1
    assert update_mod.computed_groups(batch, rloo, False).tolist() == [False, True]


def test_the_run_hands_its_passes_a_spec_and_names_its_ranks_and_main_reward():
    """The pass spec and the rollout's sampling are built from the config (generation_kwargs over the
    config's own options); the run holds them as they were built."""
    from grpolab.engine.base import Sampling
    from grpolab.model.passes import PassSpec
    from grpolab.parallel.distributed import SINGLE, Dist
    from grpolab.training.config import build_config
    from grpolab.training.run import Run, main_reward, pass_spec_of, samples_plainly

    cfg = build_config(None, ["temperature=0.7", "micro_batch=4", "top_k=5", "generation_kwargs.top_p=0.9"])
    sampling = rollout_sampling(cfg)
    assert sampling == Sampling(cfg.max_new_tokens, 0.7, 0.9, False, top_k=5)
    assert not samples_plainly(sampling) and samples_plainly(Sampling(8, 0.7))
    fns = [
        SimpleNamespace(name="format", weight=0.5),
        SimpleNamespace(name="math", weight=1.0),
        SimpleNamespace(name="other", weight=1.0),
    ]
    run = Run(
        cfg=cfg,
        out=None,
        device=torch.device("cpu"),
        amp_dtype=torch.bfloat16,
        tokenizer=None,
        policy=None,
        optimizer=None,
        scheduler=None,
        task=None,
        reward_fns=fns,
        eos_ids=set(),
        advantage=None,
        kl=None,
        sampling=sampling,
        pass_spec=pass_spec_of(cfg, torch.device("cpu"), torch.bfloat16),
        plain_sampling=samples_plainly(sampling),
    )
    assert run.pass_spec == PassSpec(torch.device("cpu"), torch.bfloat16, 0.7, 4)
    assert run.sampling is sampling and not run.plain_sampling
    assert run.ranks is SINGLE and run.main_reward == main_reward(fns) == "math"  # the first of the largest
    run.dist = Dist(rank=1, world=2)
    assert run.ranks.world == 2
    assert PassSpec(torch.device("cpu")).autocast().__class__.__name__ == "nullcontext"


def test_samples_record_the_raw_and_the_shaped_reward():
    from grpolab.training.trainer import sample_records

    batch = toy_batch()
    batch.reward = batch.raw_reward - torch.tensor([0.0, 0.0, 1.0, 1.0])  # e.g. an overlong penalty
    recs = sample_records(batch, step=5, k=3)
    assert [(r["id"], r["reward"], r["reward_shaped"]) for r in recs] == [
        ("p0", 1.0, 1.0),
        ("p0", 0.0, 0.0),
        ("p1", 0.5, -0.5),
    ]
    assert recs[2]["truncated"] is True and recs[2]["length"] == 3 and recs[2]["rewards"] == {"math": 0.5}
    assert all(r["step"] == 5 for r in recs)


@pytest.mark.parametrize("placement", ["in_loss", "in_reward"])
def test_the_kl_is_measured_once(placement, tiny_model_dir, tmp_path):
    """One `kl` per step, from the stage that uses it: the loss (in_loss) or the shaping (in_reward)."""
    from e2e_helpers import varied_score

    from grpolab import rewards as rewards_mod
    from grpolab.app.cli import main
    from grpolab.util.fileio import read_jsonl

    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(rewards_mod.REWARDS, "test_varied", lambda: varied_score)
        calls = []
        real = step_mod.shape_rewards
        mp.setattr(step_mod, "shape_rewards", lambda *a, **k: calls.append(real(*a, **k)) or calls[-1])
        out = tmp_path / placement
        assert (
            main(
                [
                    "train",
                    f"model={tiny_model_dir}",
                    f"out={out}",
                    "algo=grpo",
                    "algo.beta=0.1",
                    f"algo.kl_placement={placement}",
                    "steps=2",
                    "batch_size=8",
                    "G=4",
                    "max_new_tokens=6",
                    "eval_size=0",
                    "progress=false",
                    "tensorboard=false",
                    "lr=1e-3",
                    "rewards=[{name: test_varied}]",
                ]
            )
            == 0
        )
    lines = read_jsonl(out / "metrics.jsonl")
    shaped_kl = [c.metrics.get("kl") for c in calls]
    if placement == "in_reward":
        assert [m["kl"] for m in lines] == shaped_kl and lines[1]["kl"] != 0.0
        assert all(m["loss/kl"] == 0.0 for m in lines)
    else:
        assert shaped_kl == [None, None] and lines[1]["kl"] > 0
        assert lines[1]["loss/kl"] == pytest.approx(0.1 * lines[1]["kl"])
