"""transformers' learning-rate schedules with their lr_scheduler_kwargs: grpolab's pure functions give the same
lr at every optimizer update as transformers' get_scheduler; TRL's lr_scheduler_type / lr_scheduler_kwargs and
model_init_kwargs map onto grpolab's settings, and what cannot be honoured is refused by name."""

from __future__ import annotations

import math

import pytest
import torch

from grpolab import GRPOConfig
from grpolab.algo.schedules import SCHEDULES, cosine_with_min_lr, options_of, schedule_options
from grpolab.app.trl_compat import trl_recipe
from grpolab.model.optim import build_scheduler
from grpolab.training.config import build_config
from grpolab.util.fields import ConfigError

LR = 3e-4
W, N = 3, 20

CASES = [
    ("linear", {}),
    ("cosine", {}),
    ("cosine", {"num_cycles": 1.5}),
    ("constant", {}),
    ("constant_with_warmup", {}),
    ("cosine_with_restarts", {}),
    ("cosine_with_restarts", {"num_cycles": 3}),
    ("polynomial", {}),
    ("polynomial", {"lr_end": 1e-5, "power": 2.0}),
    ("inverse_sqrt", {}),
    ("inverse_sqrt", {"timescale": 7}),
    ("cosine_with_min_lr", {"min_lr_rate": 0.1}),
    ("cosine_with_min_lr", {"min_lr": 3e-5, "num_cycles": 0.75}),
    ("cosine_warmup_with_min_lr", {"min_lr_rate": 0.1}),
    ("cosine_warmup_with_min_lr", {"min_lr": 1e-5, "warmup_lr_rate": 0.2}),
    ("warmup_stable_decay", {"num_decay_steps": 6}),
    ("warmup_stable_decay", {"num_decay_steps": 5, "num_stable_steps": 4, "warmup_type": "cosine"}),
    ("warmup_stable_decay", {"num_decay_steps": 8, "decay_type": "1-sqrt", "min_lr_ratio": 0.05}),
    ("warmup_stable_decay", {"num_decay_steps": 8, "decay_type": "linear", "warmup_type": "1-sqrt"}),
]


def _lrs(make) -> list[float]:
    """The lr each of N + 2 optimizer updates runs with (the scheduler steps after each update)."""
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=LR)
    sched = make(opt)
    out = []
    for _ in range(N + 2):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


@pytest.mark.parametrize(("name", "kwargs"), CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_lr_sequence_is_transformers(name, kwargs):
    from transformers import get_scheduler

    ours = _lrs(lambda o: build_scheduler(o, name, warmup=W, total=N, options=kwargs))
    theirs = _lrs(
        lambda o: get_scheduler(
            name, o, num_warmup_steps=W, num_training_steps=N, scheduler_specific_kwargs=dict(kwargs)
        )
    )
    assert ours == pytest.approx(theirs, rel=1e-12, abs=1e-18)


def test_every_transformers_schedule_but_two_is_here():
    from transformers.trainer_utils import SchedulerType

    theirs = {s.value for s in SchedulerType}
    assert theirs - set(SCHEDULES) == {"reduce_lr_on_plateau", "greedy"}  # functions of a metric, not of i
    assert {n for n, _ in CASES} == set(SCHEDULES) - {"warmup_constant"}


def test_cosine_with_min_lr_worked():
    # W = 2, N = 6, m = 0.1: update 4 is halfway through the decay: p = (4 - 2) / 4 = 0.5,
    # f = 0.5 (1 + cos(pi/2)) = 0.5 -> 0.5 x 0.9 + 0.1 = 0.55; the last update (p = 1) gets m = 0.1
    assert cosine_with_min_lr(1, 2, 6, min_lr_rate=0.1) == 0.5  # warm-up: 1 / 2
    assert cosine_with_min_lr(4, 2, 6, min_lr_rate=0.1) == pytest.approx(0.55)
    assert cosine_with_min_lr(6, 2, 6, min_lr_rate=0.1) == pytest.approx(0.1)
    assert math.isclose(schedule_options("cosine_with_min_lr", {"min_lr": 1e-5}, 1e-4)["min_lr_rate"], 0.1)


@pytest.mark.parametrize(
    ("name", "kwargs", "match"),
    [
        ("cosine", {"min_lr_rate": 0.1}, "lr_scheduler_kwargs.min_lr_rate: not an option of the cosine schedule"),
        ("cosine_with_min_lr", {}, "needs min_lr or min_lr_rate"),
        ("cosine_with_min_lr", {"min_lr": 1e-6, "min_lr_rate": 0.1}, "min_lr or min_lr_rate, not both"),
        ("polynomial", {"lr_end": 1.0}, "must be below the lr"),
        ("warmup_stable_decay", {}, "num_decay_steps"),
        ("warmup_stable_decay", {"num_decay_steps": 2, "decay_type": "step"}, "decay_type='step'"),
        ("linear", {"power": 2}, "not an option of the linear schedule"),
    ],
)
def test_bad_options_are_refused_by_name(name, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        schedule_options(name, kwargs, 1e-4)
    with pytest.raises(ConfigError, match=match):  # before any model loads
        build_config({"lr_scheduler": name, "lr_scheduler_kwargs": kwargs, "lr": 1e-4})


def test_options_of_lists_transformers_names():
    assert options_of("cosine_with_min_lr") == ["num_cycles", "min_lr_rate", "min_lr"]
    assert options_of("polynomial") == ["lr_end", "power"]
    assert options_of("linear") == []


def test_trl_lr_scheduler_kwargs_map():
    args = GRPOConfig(output_dir="o", lr_scheduler_type="cosine_with_min_lr", lr_scheduler_kwargs={"min_lr_rate": 0.1})
    recipe = trl_recipe(args)[0]
    assert recipe["lr_scheduler"] == "cosine_with_min_lr" and recipe["lr_scheduler_kwargs"] == {"min_lr_rate": 0.1}
    cfg = build_config(recipe)
    assert cfg.lr_scheduler_kwargs == {"min_lr_rate": 0.1}
    text = GRPOConfig(output_dir="o", lr_scheduler_type="cosine", lr_scheduler_kwargs='{"num_cycles": 1.0}')
    assert trl_recipe(text)[0]["lr_scheduler_kwargs"] == {"num_cycles": 1.0}  # the command line's JSON text
    with pytest.raises(ConfigError, match="lr_scheduler_type='reduce_lr_on_plateau'.*evaluation metric"):
        trl_recipe(GRPOConfig(output_dir="o", lr_scheduler_type="reduce_lr_on_plateau"))
    with pytest.raises(ConfigError, match="needs min_lr or min_lr_rate"):
        trl_recipe(GRPOConfig(output_dir="o", lr_scheduler_type="cosine_with_min_lr"))


def test_model_init_kwargs_map():
    # what trl/scripts/grpo.py and open-r1 always pass: accepted, each with a note
    recipe, notes, _ = trl_recipe(
        GRPOConfig(
            output_dir="o", model_init_kwargs={"revision": "main", "attn_implementation": "sdpa", "dtype": "float32"}
        )
    )
    assert recipe["precision"] == "auto"  # float32 weights are grpolab's; bf16=None decides the compute
    assert any("revision='main'" in n for n in notes) and any("attn_implementation='sdpa'" in n for n in notes)
    bf16 = trl_recipe(GRPOConfig(output_dir="o", bf16=False, model_init_kwargs={"dtype": "bfloat16"}))
    assert bf16[0]["precision"] == "bf16" and any("weights stay fp32" in n for n in bf16[1])
    assert trl_recipe(GRPOConfig(output_dir="o", model_init_kwargs={"dtype": torch.bfloat16}))[0]["precision"] == "bf16"
    assert trl_recipe(GRPOConfig(output_dir="o", model_init_kwargs='{"dtype": "bfloat16"}'))[0]["precision"] == "bf16"
    fp16 = trl_recipe(GRPOConfig(output_dir="o", bf16=False, model_init_kwargs={"dtype": "float16"}))
    assert fp16[0]["precision"] == "fp16" and any("fp16 compute (precision=fp16)" in n for n in fp16[1])
    for kwargs, match in (
        ({"trust_remote_code": True}, "never runs code from a model directory"),
        ({"dtype": "int8"}, "give float32, bfloat16, float16 or auto"),
        ({"quantization_config": {"load_in_4bit": True}}, "model_init_kwargs.quantization_config"),
    ):
        with pytest.raises(ConfigError, match=match):
            trl_recipe(GRPOConfig(output_dir="o", model_init_kwargs=kwargs))
    with pytest.raises(ConfigError, match="trust_remote_code=True: refused"):
        trl_recipe(GRPOConfig(output_dir="o", trust_remote_code=True))
