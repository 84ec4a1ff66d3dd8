"""The config's types are its checks: every string switch with a closed set of values is a `Literal` (a new
untyped switch fails here), a value outside it is a ConfigError naming the key and the values allowed (exit
2 through the real CLI), containers check their elements by place, and `--help` and
docs/configuration.md list a switch's values read from its type."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal

import pytest

from grpolab.training.config import Config, build_config, help_text, thread_wait_of
from grpolab.util.fields import ConfigError, Pattern, choices, coerce_field, field_types

SRC = Path(__file__).resolve().parents[1] / "src"

OPEN_STRINGS = {
    "out": "a directory path",
    "model": "a model name, directory or .gguf file",
    "task": "a name of grpolab.tasks.TASKS, a registry filled by code",
    "save_best": "an eval metric, eval/pass@K for any K (a pattern checked by training.config_checks.eval_checks)",
    "run_name": "free text",
    "project": "free text",
    "report_to": "names of grpolab.training.trackers.TRACKERS, a registry filled by code",
    "algo.name": "a preset of grpolab.algo.presets.ALGOS",
    "algo.advantage": "a registry (config.algo_choices)",
    "algo.adv_scale": "a registry (config.algo_choices)",
    "algo.objective": "a registry (config.algo_choices)",
    "algo.aggregation": "a registry (config.algo_choices)",
    "algo.kl_estimator": "a registry (config.algo_choices)",
    "algo.reward_aggregation": "a registry (config.algo_choices)",
    "env.name": "a built-in environment or a module:Name / file.py:Name spec",
    "lora.target_modules": "all-linear or layer names",
    "compile_backend": "torch._dynamo's backends, a registry filled by torch and plugins (model.compiling checks it)",
    "rollout.structured_outputs_regex": "a regular expression, compiled by vLLM's structured outputs",
}
"""The string settings whose values are open-ended, each with why; every other string setting is a switch."""


def _settings(cls: type = Config, prefix: str = "") -> dict[str, Any]:
    """Dotted key -> annotated type of every setting of Config and its nested settings classes."""
    out: dict[str, Any] = {}
    for name, typ in field_types(cls).items():
        if dataclasses.is_dataclass(typ):
            out.update(_settings(typ, f"{prefix}{name}."))
        else:
            out[f"{prefix}{name}"] = typ
    return out


def _members(typ: Any) -> tuple:
    if typing.get_origin(typ) in (typing.Union, types.UnionType):
        return typing.get_args(typ)
    return (typ,)


SETTINGS = _settings()
SWITCHES = {key: typ for key, typ in SETTINGS.items() if choices(typ) is not None}


def test_the_settings_are_read_with_their_nested_sections():
    assert {"precision", "algo.kl_placement", "rollout.correction", "env.tool_thread", "lora.r"} <= set(SETTINGS)
    assert "algo" not in SETTINGS and "env" not in SETTINGS  # sections are walked into, not listed


def test_every_closed_string_switch_is_a_literal():
    """A plain `str` is left only where the values are open-ended (OPEN_STRINGS says why for each)."""
    plain = {key for key, typ in SETTINGS.items() if str in _members(typ)}
    assert plain == set(OPEN_STRINGS), (
        f"plain str settings not listed as open-ended: {sorted(plain - set(OPEN_STRINGS))}; "
        f"listed but no longer plain str: {sorted(set(OPEN_STRINGS) - plain)}"
    )
    assert {"precision", "decoder", "device", "cpu_malloc", "resume", "thread_wait", "reward_thread"} <= set(SWITCHES)
    assert {"lr_scheduler", "rollout.engine", "rollout.correction", "env.tool_thread", "env.kind"} <= set(SWITCHES)
    assert "algo.kl_placement" in SWITCHES


def test_no_container_setting_is_untyped():
    """list and dict settings name their element types (list[str], dict[str, Any], ...)."""
    bare = [key for key, typ in SETTINGS.items() for m in _members(typ) if m in (list, dict)]
    assert not bare, bare
    assert field_types(Config)["reflection_phrases"] == list[str]
    assert field_types(Config)["rewards"] == list[dict[str, Any]]


def test_each_switch_default_is_one_of_its_values():
    defaults = dataclasses.asdict(Config())
    for key, typ in SWITCHES.items():
        value = defaults
        for part in key.split("."):
            value = value[part]
        assert coerce_field(key, value, typ) == value, key


def test_the_literals_agree_with_the_registries_they_name():
    from grpolab.algo.presets import KL_PLACEMENTS, KlPlacement
    from grpolab.algo.sampler import CORRECTIONS as CORRECTION_FUNCTIONS
    from grpolab.algo.schedules import SCHEDULES, LrScheduler
    from grpolab.engine.settings import CORRECTIONS, Correction
    from grpolab.env.loading import KINDS, EnvKind
    from grpolab.rewards.contract import THREADS, RewardThread
    from grpolab.util.threads import WAIT_SETTINGS, ThreadWait

    assert set(typing.get_args(LrScheduler)) == set(SCHEDULES)
    assert set(typing.get_args(Correction)) == set(CORRECTION_FUNCTIONS) and CORRECTIONS == typing.get_args(Correction)
    assert WAIT_SETTINGS == typing.get_args(ThreadWait) == ("auto", "short", "brief", "passive", "active", "openmp")
    assert THREADS == typing.get_args(RewardThread) and KINDS == typing.get_args(EnvKind)
    assert KL_PLACEMENTS == typing.get_args(KlPlacement) == ("in_loss", "in_reward")
    assert choices(field_types(Config)["precision"]) == ["auto", "bf16", "fp16", "fp32"]


@pytest.mark.parametrize("key", sorted(SWITCHES))
def test_a_value_outside_a_switch_names_the_key_and_every_choice(key):
    with pytest.raises(ConfigError) as ei:
        build_config(None, [f"{key}=bogus_value"])
    msg = str(ei.value)
    assert msg.startswith(f"{key}: must be one of "), msg
    assert msg.endswith("; got 'bogus_value'"), msg
    for choice in choices(SWITCHES[key]):
        assert (choice if choice != "''" else "'' (empty)") in msg, (choice, msg)


def test_the_precision_message_in_full():
    with pytest.raises(ConfigError, match=r"^precision: must be one of auto, bf16, fp16, fp32; got 'fp8'$"):
        build_config(None, ["precision=fp8"])


def test_a_yaml_boolean_is_not_taken_for_a_choice():
    """`resume=yes` reads as true in YAML: refused, not matched against the strings."""
    with pytest.raises(ConfigError, match=r"^resume: must be one of never, auto; got True$"):
        build_config(None, ["resume=yes"])


def test_every_value_of_a_switch_is_accepted():
    cfg = build_config(None, ["precision=fp32", "decoder=hf", "cpu_malloc=system", "reward_thread=workers"])
    assert (cfg.precision, cfg.decoder, cfg.cpu_malloc, cfg.reward_thread) == ("fp32", "hf", "system", "workers")
    for key, typ in SWITCHES.items():
        for value in typing.get_args(typ) if typing.get_origin(typ) is Literal else ():
            assert coerce_field(key, value, typ) == value


@pytest.mark.parametrize("value", ["cuda:0", "cuda:12", "cpu", "cuda", "auto"])
def test_device_takes_its_names_and_cuda_with_an_index(value):
    assert build_config(None, [f"device={value}"]).device == value


@pytest.mark.parametrize("value", ["gpu", "cuda:-1", "cuda:x", "cuda:1:2", "CUDA"])
def test_device_refuses_anything_else_naming_the_pattern(value):
    with pytest.raises(ConfigError) as ei:
        build_config(None, [f"device={value}"])
    assert str(ei.value) == (f"device: must be one of auto, cpu, cuda, cuda:N (the CUDA GPU of index N); got {value!r}")


@pytest.mark.parametrize(
    "override, message",
    [
        ("reflection_phrases=[wait, verify, 3]", "reflection_phrases[2]: must be a string, got 3"),
        ("adam_betas=[0.9, fast]", "adam_betas[1]: must be a number (float), got 'fast'"),
        ("rewards=[{name: format}, math]", "rewards[1]: must be a mapping (dict), got str 'math'"),
        ("report_to=[tensorboard, 3]", "report_to[1]: must be a string, got 3"),
        ("report_to=5", "report_to: must be a list of strings or a string; got 5"),
        ("generation_kwargs={1: 2}", "generation_kwargs: keys must be strings (names), got 1"),
        ("env.tools=[a.py:f, 7]", "env.tools[1]: must be a string, got 7"),
        ("env.factories={math: 3}", "env.factories.math: must be a string, got 3"),
        ("lora.target_modules=[q_proj, 1]", "lora.target_modules[1]: must be a string, got 1"),
        ("task_args=[1]", "task_args: must be a mapping (dict), got list [1]"),
    ],
)
def test_container_elements_are_checked_by_place(override, message):
    with pytest.raises(ConfigError) as ei:
        build_config(None, [override])
    assert str(ei.value) == message


def test_containers_that_fit_their_types_come_through_with_numbers_coerced():
    cfg = build_config(None, ["adam_betas=[0.8, '0.95']", "reflection_phrases=[wait]", "report_to=none"])
    assert cfg.adam_betas == [0.8, 0.95] and all(isinstance(b, float) for b in cfg.adam_betas)
    assert cfg.reflection_phrases == ["wait"] and cfg.report_to == []


def test_coerce_field_on_its_own():
    assert coerce_field("k", "b", Literal["a", "b"]) == "b"
    with pytest.raises(ConfigError, match=r"^k: must be one of a, b; got 1$"):
        coerce_field("k", 1, Literal["a", "b"])
    with pytest.raises(ConfigError, match=r"^k\[0\]\.x: must be an integer, got 'y'$"):
        coerce_field("k", [{"x": "y"}], list[dict[str, int]])
    digits = typing.Annotated[str, Pattern(r"\d+", "DIGITS")]
    assert coerce_field("k", "042", digits) == "042"
    with pytest.raises(ConfigError, match=r"^k: must be DIGITS; got '4a'$"):
        coerce_field("k", "4a", digits)


def test_thread_wait_is_checked_by_its_type_before_torch():
    with pytest.raises(
        ConfigError, match=r"^thread_wait: must be one of auto, short, brief, passive, active, openmp; got 'spin'$"
    ):
        thread_wait_of(None, ["thread_wait=spin"])
    assert thread_wait_of({"thread_wait": "passive"}, None) == "passive"


def test_help_lists_each_switch_values():
    text = help_text()
    assert "\n  precision='auto'  one of: auto, bf16, fp16, fp32\n" in text
    assert "\n  device='auto'  one of: auto, cpu, cuda, cuda:N\n" in text
    assert "\n  rollout.correction='token_truncate'  one of: token_truncate, token_mask," in text
    assert "\n  algo.kl_placement='in_loss'  one of: in_loss, in_reward\n" in text
    assert "\n  steps=30\n" in text  # a number shows no choices


def test_the_configuration_page_lists_each_switch_values():
    from grpolab.app.docs_config import render

    page = render()
    row = next(line for line in page.splitlines() if line.startswith("| `precision` |"))
    assert row.endswith("One of: `auto`, `bf16`, `fp16`, `fp32`. |"), row
    row = next(line for line in page.splitlines() if line.startswith("| `env.tool_thread` |"))
    assert row.endswith("One of: `worker`, `main`. |"), row


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(SRC) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-m", "grpolab.app.cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def test_cli_refuses_a_wrong_switch_with_exit_2_before_loading_a_model(tmp_path):
    res = _cli(["train", "precision=fp8", f"out={tmp_path / 'run'}"], tmp_path)
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    assert "precision: must be one of auto, bf16, fp16, fp32; got 'fp8'" in res.stderr
    assert "Traceback" not in res.stderr
    assert list(tmp_path.iterdir()) == []  # nothing written: no run directory, no model cache


def test_cli_help_prints_the_choices(tmp_path):
    res = _cli(["train", "--help"], tmp_path)
    assert res.returncode == 0, res.stderr
    assert "  precision='auto'  one of: auto, bf16, fp16, fp32\n" in res.stdout
    assert "  thread_wait='auto'  one of: auto, short, brief, passive, active, openmp\n" in res.stdout


def test_reading_the_config_imports_no_torch():
    """The config (its types included) is read before torch starts: OpenMP takes thread_wait at torch's import."""
    code = "import sys, grpolab.training.config; assert 'torch' not in sys.modules, 'torch imported'; print('ok')"
    env = dict(os.environ, PYTHONPATH=str(SRC))
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert res.stdout.strip() == "ok", res.stderr[-2000:]
