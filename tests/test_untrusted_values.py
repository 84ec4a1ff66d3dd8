"""Values from outside that ended runs with a traceback: out-of-range integers (a seed, OMP_NUM_THREADS), an
environment reply whose content is not text; and what `grpolab audit` says of user code without a bound."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest

from grpolab.app.audit import unbounded_user_code
from grpolab.app.cli import main
from grpolab.env.rollout import content_text, text_message
from grpolab.util import threads

HUGE = "99999999999999999999"
DEMO = "src/grpolab/recipes/demo.yaml"


@pytest.mark.parametrize(
    "args",
    [
        [DEMO, f"seed={HUGE}"],  # KEY=VALUE
        ["--trl", f"seed={HUGE}"],  # TRL's names
        [DEMO, f"data_seed=-{HUGE}"],
    ],
)
def test_a_seed_outside_torchs_range_is_a_usage_error(args, tmp_path, capsys):
    """Before: exit 1 with RuntimeError (Overflow when unpacking long) from torch.manual_seed."""
    assert main(["train", *args, f"out={tmp_path / 'run'}"]) == 2
    assert "seed: must be" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_a_seed_outside_torchs_range_in_a_recipe_is_a_usage_error(tmp_path, capsys):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"seed: {HUGE}\n")
    assert main(["train", str(recipe), f"out={tmp_path / 'run'}"]) == 2
    assert "seed: must be an integer from" in capsys.readouterr().err


@pytest.mark.parametrize("given", [HUGE, "5000"])
def test_omp_num_threads_far_past_the_cores_is_clamped_and_said(given):
    """Before: 99999999999999999999 raised in torch.set_num_threads; 5000 spun 5000 threads on 2 cores."""
    n = threads.cores()
    count, why = threads.choose_threads(0, environ={"OMP_NUM_THREADS": given})
    assert count == n and f"OMP_NUM_THREADS={given}" in why and "the cores here" in why
    assert threads.choose_threads(0, environ={"OMP_NUM_THREADS": str(n)})[0] == n  # within reach: obeyed


class Service:
    def __str__(self):
        return "a service object"


@pytest.mark.parametrize(
    "content,text",
    [
        ({"status": 200, "items": [1, 2]}, '{"status": 200, "items": [1, 2]}'),  # a service's JSON, forwarded
        (b"caf\xc3\xa9 \xff", "café \ufffd"),
        (Service(), "a service object"),
        (3.5, "3.5"),
    ],
)
def test_environment_content_that_is_not_text_is_rendered_as_text_and_counted(content, text):
    """Before: TypeError in the template; the rollout caught only TemplateError, so the run ended."""
    events = Counter()
    message = text_message({"role": "user", "content": content}, events)
    assert message == {"role": "user", "content": text} and events == Counter(content_not_text=1)


def test_a_tuple_of_parts_becomes_a_list_and_text_stays_as_it_is():
    parts = ({"type": "text", "text": "a"}, {"type": "text", "text": "b"})
    assert content_text(parts) == ([*parts], True)
    assert content_text([*parts]) == ([*parts], False)
    assert content_text("plain") == ("plain", False) and content_text(None) == (None, False)


def test_audit_warns_when_user_code_runs_without_a_hard_bound():
    user = SimpleNamespace(name="mine", user=True)
    builtin = SimpleNamespace(name="math", user=False)

    def cfg(reward_process, env_enabled, tool_process):
        env = SimpleNamespace(enabled=env_enabled, tool_process=tool_process)
        return SimpleNamespace(reward_process=reward_process, env=env)

    warnings = unbounded_user_code(cfg(False, True, False), [user, builtin])
    assert len(warnings) == 2 and "mine" in warnings[0] and "math" not in warnings[0]
    assert "reward_process=true" in warnings[0] and "env.tool_process=true" in warnings[1]
    assert unbounded_user_code(cfg(True, True, True), [user, builtin]) == []
    assert unbounded_user_code(cfg(False, False, False), [builtin]) == []
