"""Config: defaults <- YAML recipe <- dotted overrides, and a ConfigError naming the key for anything wrong."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from grpolab.algo.presets import AlgoConfig
from grpolab.training.config import Config, build_config, config_from_run, field_docs, help_text, save_config, to_dict
from grpolab.training.recipe import load_recipe, parse_overrides
from grpolab.util.fields import ConfigError


def _error(overrides=None, recipe=None) -> str:
    with pytest.raises(ConfigError) as ei:
        build_config(recipe, overrides)
    return str(ei.value)


# --- defaults ---------------------------------------------------------------------------------------


def test_defaults():
    cfg = build_config()
    assert isinstance(cfg, Config)
    # the stable top-level keys scripts rely on
    for key in ("out", "steps", "seed", "model", "task", "algo"):
        assert hasattr(cfg, key)
    assert cfg.model == "smollm2-135m"
    assert cfg.task == "arithmetic"
    assert isinstance(cfg.algo, AlgoConfig) and cfg.algo.name == "grpo"
    assert cfg.batch_size % cfg.G == 0
    # defaults of mutable fields are not shared between instances
    a, b = build_config(), build_config()
    a.task_args["x"] = 1
    a.adam_betas.append(0.5)
    assert b.task_args == {} and b.adam_betas == [0.9, 0.99]


def test_parse_overrides_nests_and_parses_yaml_scalars():
    got = parse_overrides(
        [
            "steps=5",
            "algo.beta=0.04",
            "task_args.digits=2",
            "tensorboard=false",
            "out=runs/x",
            "adam_betas=[0.8, 0.9]",
            "model=",
        ]
    )
    assert got == {
        "steps": 5,
        "algo": {"beta": 0.04},
        "task_args": {"digits": 2},
        "tensorboard": False,
        "out": "runs/x",
        "adam_betas": [0.8, 0.9],
        "model": "",
    }


def test_value_may_contain_equals_sign():
    assert parse_overrides(["task_args.path=a=b.jsonl"]) == {"task_args": {"path": "a=b.jsonl"}}


def test_dotted_overrides():
    cfg = build_config(None, ["algo.beta=0.04", "task_args.digits=2", "steps=7", "lr=1e-4", "temperature=1"])
    assert cfg.algo.beta == 0.04
    assert cfg.task_args == {"digits": 2}
    assert cfg.steps == 7
    assert cfg.lr == 1e-4
    assert cfg.temperature == 1.0 and isinstance(cfg.temperature, float)  # int accepted for a float


def test_algo_preset_by_name_and_overrides_in_either_order():
    assert build_config(None, ["algo=dapo"]).algo.name == "dapo"
    for order in (["algo=dapo", "algo.beta=0.1"], ["algo.beta=0.1", "algo=dapo"]):
        cfg = build_config(None, order)
        assert (cfg.algo.name, cfg.algo.beta) == ("dapo", 0.1), order


# --- recipes ----------------------------------------------------------------------------------------


def test_yaml_recipe_merge(tmp_path):
    recipe_path = tmp_path / "r.yaml"
    recipe_path.write_text(
        yaml.safe_dump(
            {
                "steps": 12,
                "G": 4,
                "batch_size": 16,
                "task": "countdown",
                "task_args": {"digits": 1, "ops": "+-"},
                "algo": {"name": "grpo", "beta": 0.0, "eps_high": 0.28},
            }
        )
    )
    recipe = load_recipe(recipe_path)
    cfg = build_config(recipe, ["task_args.digits=2", "algo.beta=0.04", "G=8"])
    assert cfg.steps == 12  # from the recipe
    assert cfg.task == "countdown"
    assert cfg.task_args == {"digits": 2, "ops": "+-"}  # override merged into the recipe's mapping
    assert cfg.algo.eps_high == 0.28 and cfg.algo.beta == 0.04
    assert cfg.G == 8 and cfg.batch_size == 16  # override wins, recipe's batch still divisible
    assert cfg.seed == Config().seed  # untouched default
    # the recipe dict itself is not mutated by build_config
    assert recipe["task_args"] == {"digits": 1, "ops": "+-"}


def test_recipe_algo_as_string(tmp_path):
    p = tmp_path / "r.yaml"
    p.write_text("algo: dapo\n")
    assert build_config(load_recipe(p), ["algo.eps_low=0.1"]).algo.name == "dapo"


def test_recipe_errors(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_recipe(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps: [1,\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_recipe(bad)
    lst = tmp_path / "list.yaml"
    lst.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_recipe(lst)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_recipe(empty) == {}
    # an unknown key inside a recipe is caught like an override
    assert "stepz" in _error(recipe={"stepz": 3})


def test_config_yaml_round_trip(tmp_path):
    cfg = build_config(None, ["algo=dapo", "task_args.digits=2", "steps=3"])
    save_config(cfg, tmp_path / "config.yaml")
    again = build_config(config_from_run(tmp_path), [])
    assert to_dict(again) == to_dict(cfg)
    with pytest.raises(ConfigError, match="config.yaml"):
        config_from_run(tmp_path / "nope")


# --- errors -----------------------------------------------------------------------------------------


def test_unknown_key_names_it_with_hint():
    msg = _error(["stpes=3"])
    assert msg.startswith("stpes:")
    assert "unknown key" in msg
    assert "Did you mean steps" in msg


def test_unknown_nested_key_is_named():
    msg = _error(["algo.bta=0.1"])
    assert "algo.bta" in msg and "beta" in msg  # the known keys are listed


def test_override_without_equals():
    assert "KEY=VALUE" in _error(["steps"])


@pytest.mark.parametrize(
    "override, key, expected",
    [
        ("steps=abc", "steps", "int"),
        ("steps=3.5", "steps", "int"),
        ("steps=true", "steps", "int"),  # a bool is not an int here
        ("lr=fast", "lr", "float"),
        ("tensorboard=maybe", "tensorboard", "bool"),
        ("task_args=3", "task_args", "dict"),
        ("rewards=3", "rewards", "list"),
    ],
)
def test_wrong_type(override, key, expected):
    msg = _error([override])
    assert msg.startswith(f"{key}:"), msg
    assert expected in msg


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["G=0"], "G"),
        (["G=-2"], "G"),
        (["batch_size=10", "G=4"], "batch_size"),
        (["batch_size=0"], "batch_size"),
        (["steps=0"], "steps"),
        (["temperature=0"], "temperature"),
        (["temperature=-1"], "temperature"),
        (["top_p=1.5"], "top_p"),
        (["top_p=0"], "top_p"),
        (["micro_batch=0"], "micro_batch"),
        (["max_new_tokens=0"], "max_new_tokens"),
        (["lr=0"], "lr"),
        (["warmup_steps=-1"], "warmup_steps"),
        (["max_grad_norm=-1"], "max_grad_norm"),
        (["device=tpu"], "device"),
        (["precision=fp8"], "precision"),
        (["eval_size=-1"], "eval_size"),
        (["keep_checkpoints=-1"], "keep_checkpoints"),
        (["reward_timeout_s=0"], "reward_timeout_s"),
        (["reward_workers=0"], "reward_workers"),
        (["adam_betas=[0.9]"], "adam_betas"),
        (["adam_betas=[0.9, 1.5]"], "adam_betas"),
        (["out="], "out"),
        (["rewards=[3]"], "rewards[0]"),
        (["task=nope"], "task"),
        (["algo=nope"], "algo"),
    ],
)
def test_impossible_values(overrides, key):
    msg = _error(overrides)
    assert msg.startswith(f"{key}"), msg


def test_batch_not_divisible_message_says_what_is_allowed():
    msg = _error(["batch_size=10", "G=4"])
    assert "G=4" in msg and "multiple" in msg and "8" in msg


def test_unknown_task_lists_known_ones():
    msg = _error(["task=nope"])
    assert "'nope'" in msg and "arithmetic" in msg and "countdown" in msg


def test_unknown_algo_lists_known_ones():
    msg = _error(["algo=nope"])
    assert "'nope'" in msg and "grpo" in msg


def test_allowed_edge_values():
    cfg = build_config(
        None,
        [
            "G=1",
            "batch_size=1",
            "top_p=1",
            "temperature=0.01",
            "max_grad_norm=0",
            "warmup_steps=0",
            "eval_size=0",
            "device=cpu",
            "precision=fp32",
        ],
    )
    assert cfg.G == 1 and cfg.top_p == 1.0


# --- documentation ----------------------------------------------------------------------------------


def test_every_config_field_is_documented():
    docs = field_docs(Config)
    names = [f.name for f in dataclasses.fields(Config)]
    missing = [n for n in names if not docs.get(n)]
    assert not missing, f"fields without a docstring: {missing}"
    assert all(len(docs[n]) >= 10 for n in names)


def test_every_algo_field_is_documented():
    docs = field_docs(AlgoConfig)
    missing = [f.name for f in dataclasses.fields(AlgoConfig) if not docs.get(f.name)]
    assert not missing, f"algo fields without a docstring: {missing}"


def test_field_docs_reads_the_string_under_each_field():
    @dataclasses.dataclass
    class Demo:
        a: int = 1
        """The a
        field."""
        b: str = "x"
        c: float = 0.5
        """C."""

    assert field_docs(Demo) == {"a": "The a field.", "c": "C."}


def test_help_text_lists_every_field_with_its_doc():
    text = help_text()
    flat = " ".join(text.split())
    docs = field_docs(Config)
    for f in dataclasses.fields(Config):
        if f.name == "algo":
            assert "algo=NAME" in text
            continue
        assert f"\n  {f.name}=" in text, f.name
        assert docs[f.name] in flat, f.name
    for f in dataclasses.fields(AlgoConfig):
        assert f"algo.{f.name}=" in text, f.name
