"""grpolab audit: the gold-answer check, the zero-variance estimate, the suggestions, and the command's
exit status on a model that can learn nothing."""

from grpolab.app.audit import check_gold, expected_zero_var, suggest_G, suggest_max_new_tokens
from grpolab.rewards import build_rewards
from grpolab.rewards.scoring import RewardFn
from grpolab.tasks import build_task


def test_gold_answers_of_the_shipped_tasks_pass_their_default_verifiers():
    for name in ("arithmetic", "countdown", "longsum"):
        task = build_task(name, 0)
        exs = task.eval_set()[:8]
        failures, used = check_gold(build_rewards(task.default_rewards), exs, 10.0, 2)
        assert failures == [] and used, name


def test_a_verifier_that_rejects_gold_is_reported_with_the_example():
    task = build_task("arithmetic", 0)
    exs = task.eval_set()[:3]
    never = [RewardFn(name="broken", weight=1.0, fn=lambda c, ex: 0.0)]
    failures, used = check_gold(never, exs, 10.0, 1)
    assert used == [] and [f["id"] for f in failures] == [e.id for e in exs]
    assert failures[0]["answer"] == exs[0].answer and failures[0]["best_score"] == 0.0


def test_expected_zero_variance_and_suggested_G():
    assert expected_zero_var([0.5], 4) == 2 * 0.5**4
    assert expected_zero_var([0.0, 1.0], 8) == 1.0
    g, why = suggest_G([0.1] * 10, 4)  # 0.9**G <= 0.5 first at G=8 (0.43)
    assert g == 8 and "G=8" in why
    assert "no sampled completion" in suggest_G([0.0, 0.0], 8)[1]
    assert suggest_G([1.0], 8)[1].startswith("every sampled completion was right")


def test_suggested_max_new_tokens():
    assert suggest_max_new_tokens([32.0] * 10, 0.5, 32)[0] == 64
    assert suggest_max_new_tokens([5.0, 9.0], 0.0, 128)[0] == 16
    assert suggest_max_new_tokens([20.0, 30.0], 0.0, 32)[0] == 32


def test_audit_command_exits_1_when_no_group_has_signal(tiny_model_dir, capsys):
    from grpolab.app.cli import main

    rc = main(["audit", f"model={tiny_model_dir}", "--prompts", "2", "G=4", "max_new_tokens=4", "threads=1"])
    out = capsys.readouterr().out
    assert rc == 1  # a random tiny model never gets a sum right: every group has equal rewards
    assert "zero-variance groups" in out and "error: every sampled group of G=4 has equal rewards" in out
    assert "gold answers score 1          2/2" in out
