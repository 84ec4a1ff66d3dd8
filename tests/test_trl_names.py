"""The one table of grpolab's metric names and TRL's (read both ways, shown in docs/metrics.md), TRL's log rows
worked out by hand, the schedule moving on over an update with nothing to learn, and a mean score that is
not a share printed as a number (a reward below 0 once printed "held-out accuracy -532.8%")."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from grpolab.training.trl_names import EVAL, GENERATION, MISSING, UPDATE, TrlLog, grpolab_name, step_times, trl_name

DOCS = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"


@pytest.mark.parametrize(
    ("ours", "trl"),
    [
        ("reward/mean", "reward"),
        ("reward/std", "reward_std"),
        ("reward/acc/mean", "rewards/acc/mean"),
        ("reward/acc/std", "rewards/acc/std"),
        ("groups/zero_std_frac", "frac_reward_zero_std"),
        ("completion/truncated_frac", "completions/clipped_ratio"),
        ("completion/ended_length_max", "completions/max_terminated_length"),
        ("clip/frac", "clip_ratio/region_mean"),
        ("lr", "learning_rate"),
        ("time/step_s", "step_time"),
        ("eval/reward", "eval_reward"),
        ("eval/reward/acc/std", "eval_rewards/acc/std"),
        ("eval/length", "eval_completions/mean_length"),
        ("eval/accuracy", "eval_accuracy"),  # grpolab's own: eval_ + its name
    ],
)
def test_the_table_reads_both_ways(ours, trl):
    assert trl_name(ours) == trl and grpolab_name(trl) == ours


def test_names_with_no_counterpart_map_to_nothing():
    assert trl_name("aha/reflection_frac") == "" and grpolab_name("clip_ratio/low_min") == ""
    assert all(grpolab_name(m) in ("", "eval/" + m[5:]) for m in MISSING)


def test_metrics_page_shows_every_name_of_the_table():
    page = DOCS.read_text()
    section = page[page.index("## TRL's names") :]
    for trl, ours in GENERATION + UPDATE + EVAL:
        head = trl.replace("{}", "<fn>").split("/")[0]
        assert head in section, trl
        for name in re.findall(r"[a-z_]+/[a-z_{}]+(?:/[a-z_]+)?", ours):
            assert name.replace("{}", "<fn>").split("/")[0] in section, name
    for name in MISSING:
        assert f"`{name}`" in section or name.startswith("eval_clip_ratio"), name


def test_trl_rows_of_a_generation_with_two_updates():
    # one generation (reward 0.5, lengths 4..6), two updates: loss 0.2 then 0.4, lr 1e-6 then 5e-7
    log = TrlLog(["acc"], kl=False)
    row = {
        "reward/mean": 0.5,
        "reward/std": 0.1,
        "reward/acc/mean": 0.5,
        "reward/acc/std": 0.1,
        "tokens/prompt": 40.0,
        "tokens/generated": 20.0,
        "completion/length_mean": 5.0,
        "entropy": 2.0,
        "kl": 0.3,
        "clip/frac": 0.25,
        "time/step_s": 3.0,
        "time/update_s": 1.0,
    }
    log.add_generation(row)
    t1, t2 = step_times(row, 2)
    assert (t1, t2) == (2.5, 0.5)  # 3 - 1 + 1/2: the first update carries the generation
    log.add_update(row, {"loss": 0.2, "grad_norm": 1.0, "learning_rate": 1e-6}, t1)
    first = log.row(0.5)
    assert list(first)[:4] == ["loss", "grad_norm", "learning_rate", "num_tokens"]
    assert first["num_tokens"] == 60.0 and first["reward"] == 0.5 and first["rewards/acc/std"] == 0.1
    assert "kl" not in first  # beta = 0: TRL logs no kl
    assert first["clip_ratio/region_mean"] == 0.25 and first["step_time"] == 2.5 and first["epoch"] == 0.5
    log.add_update(row, {"loss": 0.4, "grad_norm": 2.0, "learning_rate": 5e-7}, t2)
    second = log.row(1.0)
    assert "reward" not in second and second["loss"] == 0.4 and second["learning_rate"] == 5e-7
    assert log.all_losses == [0.2, 0.4]


def test_a_logging_interval_averages_as_transformers_and_trl_do():
    log = TrlLog([], kl=True)
    for loss, kl in ((0.2, 0.1), (0.4, float("nan")), (None, 0.3)):  # a NaN and a skipped update left out
        log.add_update({"kl": kl}, {"loss": loss, "grad_norm": 1.0, "learning_rate": 1e-6}, 1.0)
    row = log.row(1.0)
    assert row["loss"] == pytest.approx(0.3) and row["kl"] == pytest.approx(0.2)


def test_an_update_with_nothing_to_learn_moves_the_schedule_on():
    import torch

    from grpolab.model.optim import build_scheduler
    from grpolab.training.update import Update, skipped_update

    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([p], lr=1e-3)
    sched = build_scheduler(opt, "linear", total=4, warmup=0)
    algo = SimpleNamespace(sync_ref_model=False, entropy_coef=0.0, adaptive_entropy=False)
    run = SimpleNamespace(scheduler=sched, cfg=SimpleNamespace(algo=algo))
    u = Update.__new__(Update)
    u.updates, u.n_synced = [], 0
    skipped_update(run, u)
    assert u.updates == [{"learning_rate": 1e-3, "grad_norm": 0.0, "loss": 0.0}]  # the lr it would have used
    assert sched.get_last_lr()[0] == pytest.approx(1e-3 * 3 / 4)  # linear over 4 updates: one done
    assert float(p) == 0.0  # the weights stay


def test_a_mean_score_outside_0_1_prints_as_a_number(capsys):
    from rich.console import Console

    from grpolab.training.evaluation import is_share
    from grpolab.training.progress import print_summary

    ev = {"accuracy": -5.328, "accuracy_ci": [-6.0, -4.5], "n": 4, "main_reward": "len", "samples_per_prompt": 1}
    assert (
        not is_share(ev) and is_share({"accuracy": 0.5}) and not is_share({"accuracy": 0.5, "accuracy_is_share": False})
    )
    summary = {
        "steps": 2,
        "time_s": 1.0,
        "reward_first": -5.0,
        "reward_last": -4.0,
        "length_first": 3.0,
        "length_last": 3.0,
        "eval_before": ev,
        "eval_after": {**ev, "accuracy": -4.0},
        "out": "/nonexistent",
        "files": {},
    }
    print_summary(summary, console=Console(width=200))
    text = capsys.readouterr().out
    assert "held-out mean score" in text and "-5.328 [-6, -4.5]" in text and "-532.8%" not in text
