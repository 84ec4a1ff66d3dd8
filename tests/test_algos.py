"""Algorithm presets, resolve_algo's errors, the recipes/<algo>.yaml files and docs/algorithms.md."""

import re
from pathlib import Path

import pytest
import yaml

from grpolab.algo.advantages import ADV_SCALES, ADVANTAGES
from grpolab.algo.kl import KL_ESTIMATORS
from grpolab.algo.losses import AGGREGATIONS, OBJECTIVES
from grpolab.algo.presets import ALGOS, AlgoConfig, resolve_algo
from grpolab.training.config import algo_choices
from grpolab.util.fields import ConfigError

ROOT = Path(__file__).resolve().parents[1]
NAMES = ["cispo", "dapo", "dr_grpo", "grpo", "gspo", "luspo", "ppo", "reinforce", "rloo", "sapo", "vespo"]


def test_the_family_is_registered():
    assert sorted(ALGOS) == NAMES
    for name in NAMES:
        cfg = resolve_algo(name, {})
        assert cfg.name == name and isinstance(cfg, AlgoConfig)


def test_presets_say_what_defines_them():
    a = {n: resolve_algo(n, {}) for n in NAMES}
    assert (a["grpo"].advantage, a["grpo"].aggregation, a["grpo"].beta) == ("group_zscore", "seq_mean", 0.04)
    assert (a["dr_grpo"].advantage, a["dr_grpo"].aggregation) == ("group_mean", "token_sum_norm")
    assert (a["dapo"].eps_high, a["dapo"].aggregation, a["dapo"].dynamic_sampling) == (0.28, "token_mean", True)
    assert a["dapo"].overlong_buffer > 0
    assert (a["gspo"].objective, a["gspo"].eps_low, a["gspo"].eps_high) == ("gspo", 3e-4, 4e-4)
    assert a["cispo"].objective == "cispo"
    assert (a["rloo"].advantage, a["rloo"].objective) == ("rloo", "pg")
    assert (a["reinforce"].advantage, a["reinforce"].objective) == ("none", "pg")
    assert (a["ppo"].advantage, a["ppo"].uses_critic) == ("gae", True)
    assert not any(a[n].uses_critic for n in NAMES if n != "ppo")


def test_overrides_apply_on_top_of_the_preset():
    cfg = resolve_algo("dapo", {"eps_high": 0.3, "mu": 2})
    assert (cfg.eps_high, cfg.mu, cfg.eps_low, cfg.dynamic_sampling) == (0.3, 2, 0.2, True)
    assert resolve_algo("grpo", {"name": "grpo"}).name == "grpo"
    # YAML 1.1 reads 3e-4 as a string; numbers as strings are accepted for numeric fields
    assert resolve_algo("gspo", {"eps_low": "3e-4"}).eps_low == 3e-4
    assert resolve_algo("grpo", {"beta": 0}).beta == 0.0 and isinstance(resolve_algo("grpo", {"beta": 0}).beta, float)
    assert resolve_algo("ppo", {"value_clip": None}).value_clip is None
    assert resolve_algo("grpo", {"dual_clip": 3}).dual_clip == 3.0


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(ConfigError) as e:
        resolve_algo("grpo2", {})
    assert "algo.name" in str(e.value) and all(n in str(e.value) for n in NAMES)
    with pytest.raises(ConfigError, match="algo.name"):
        resolve_algo("grpo", {"name": "dapo"})


@pytest.mark.parametrize(
    "overrides, key, allowed",
    [
        ({"epsilon": 0.2}, "algo.epsilon", "eps_high"),  # unknown key: lists the known ones
        ({"eps_high": "wide"}, "algo.eps_high", "number"),
        ({"eps_high": True}, "algo.eps_high", "number"),
        ({"mu": 1.5}, "algo.mu", "integer"),
        ({"mu": True}, "algo.mu", "integer"),
        ({"dynamic_sampling": "yes"}, "algo.dynamic_sampling", "true or false"),
        ({"advantage": 3}, "algo.advantage", "string"),
        ({"beta": None}, "algo.beta", "null"),
        ({"beta": float("nan")}, "algo.beta", "finite"),
        ({"eps_low": -0.1}, "algo.eps_low", ">= 0"),
        ({"eps_high": -0.1}, "algo.eps_high", ">= 0"),
        ({"mu": 0}, "algo.mu", ">= 1"),
        ({"beta": -1.0}, "algo.beta", ">= 0"),
        ({"adv_eps": 0.0}, "algo.adv_eps", "> 0"),
        ({"dual_clip": 0.5}, "algo.dual_clip", "> 1"),
        ({"gamma": 1.5}, "algo.gamma", "[0, 1]"),
        ({"lam": -0.1}, "algo.lam", "[0, 1]"),
        ({"overlong_buffer": -1}, "algo.overlong_buffer", ">= 0"),
        ({"max_resample_rounds": -1}, "algo.max_resample_rounds", ">= 0"),
        ({"value_clip": 0.0}, "algo.value_clip", "> 0"),
        ({"critic_lr": -1e-5}, "algo.critic_lr", "> 0"),
        ({"advantage": "zscore"}, "algo.advantage", "group_zscore"),
        ({"objective": "ppo"}, "algo.objective", "clipped"),
        ({"aggregation": "mean"}, "algo.aggregation", "token_mean"),
        ({"kl_estimator": "k4"}, "algo.kl_estimator", "k3"),
        ({"kl_placement": "both"}, "algo.kl_placement", "in_reward"),
        ({"adv_scale": "std"}, "algo.adv_scale", "batch_std"),
    ],
)
def test_bad_values_name_the_key_and_what_is_allowed(overrides, key, allowed):
    with pytest.raises(ConfigError) as e:
        resolve_algo("grpo", overrides, choices=algo_choices())
    assert str(e.value).startswith(key + ":") and allowed in str(e.value), str(e.value)


@pytest.mark.parametrize(
    "name, overrides, key",
    [
        ("grpo", {"advantage": "gae"}, "algo.advantage"),  # gae needs a critic
        ("grpo", {"uses_critic": True}, "algo.uses_critic"),  # a critic needs gae
        ("grpo", {"adv_scale": "group_std"}, "algo.adv_scale"),  # z-score twice
        ("ppo", {"adv_scale": "group_std"}, "algo.adv_scale"),  # no groups for per-token gae
        ("gspo", {"dual_clip": 3.0}, "algo.dual_clip"),
        ("dapo", {"adaptive_kl": True}, "algo.adaptive_kl"),  # beta = 0 cannot adapt
    ],
)
def test_contradictions(name, overrides, key):
    with pytest.raises(ConfigError, match="^" + re.escape(key)):
        resolve_algo(name, overrides)


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


@pytest.mark.parametrize("name", NAMES)
def test_recipe_names_its_preset_and_cites_its_paper(name):
    """An algorithm's recipe holds only its algo block, which names the preset (what it may add beyond the
    name is checked in tests/test_recipes.py), and its header cites the paper and numbers its departures."""
    path = ROOT / "recipes" / f"{name}.yaml"
    text = path.read_text()
    data = yaml.safe_load(text)
    assert list(data) == ["algo"], "a recipe holds only the algo block; the rest comes from the default config"
    assert data["algo"]["name"] == name
    header = text.split("\nalgo:")[0]
    assert re.search(r"arXiv:\d{4}\.\d{4,5}|19\d\d|20\d\d", header), "names its paper"
    assert "Departures from the paper" in header and re.search(r"#\s+1\. ", header), "numbered departures"


def test_choices_are_the_registries():
    choices = algo_choices()
    assert set(choices["advantage"]) == {*ADVANTAGES, "gae"} and set(choices["adv_scale"]) == set(ADV_SCALES)
    assert set(choices["objective"]) == set(OBJECTIVES) and set(choices["aggregation"]) == set(AGGREGATIONS)
    assert set(choices["kl_estimator"]) == set(KL_ESTIMATORS)


def test_algos_is_a_leaf_without_torch():
    """grpolab.algo.presets imports nothing of grpolab but grpolab.util.fields, and no torch (checked in a fresh
    interpreter, where nothing else has imported them yet)."""
    import subprocess
    import sys

    code = (
        "import sys; import grpolab.algo.presets; "
        "print(sorted(m for m in sys.modules if m.startswith('grpolab') or m == 'torch'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env={"PYTHONPATH": str(ROOT / "src")}
    ).stdout
    assert eval(out) == ["grpolab", "grpolab.algo", "grpolab.algo.presets", "grpolab.util", "grpolab.util.fields"]


def documented_calls(text: str) -> list[tuple[str, list[str]]]:
    """`name(arg, kw=...)` spans of the docs: the function name and the argument names written."""
    out = []
    for name, args in re.findall(r"`([A-Za-z_][A-Za-z0-9_.]*)\(([^`()]*)\)", text):
        names = [a.split("=")[0].strip().lstrip("*") for a in args.split(",")]
        out.append((name.split(".")[-1], [n for n in names if n and n not in ("...", "..")]))
    return out


def test_docs_map_every_registered_function():
    import importlib
    import inspect

    text = (ROOT / "docs" / "algorithms.md").read_text()
    functions = [
        *ADVANTAGES.values(),
        *ADV_SCALES.values(),
        *OBJECTIVES.values(),
        *AGGREGATIONS.values(),
        *KL_ESTIMATORS.values(),
    ]
    for fn in functions:
        assert f"`{fn.__name__}`" in text or f"`{fn.__name__}(" in text, fn.__name__
    for name in NAMES:
        assert f"`{name}`" in text, name
    # every call written in the docs names a real function with the arguments it really takes
    modules = [
        importlib.import_module(f"grpolab.{m}")
        for m in (
            "algo.advantages",
            "algo.losses",
            "algo.kl",
            "algo.gae",
            "model.critic",
            "algo.shaping",
            "training.step",
            "training.update",
            "model.passes",
            "batch",
            "algo.presets",
            "training.config",
            "training.trainer",
            "model.reference",
        )
    ]
    calls = documented_calls(text)
    assert len(calls) >= 8
    methods = {}  # `run.advantage.targets(...)`: a method of a component class
    for m in modules:
        for obj in vars(m).values():
            if inspect.isclass(obj) and obj.__module__.startswith("grpolab"):
                methods.update({k: v for k, v in vars(obj).items() if inspect.isfunction(v)})
    for name, args in calls:
        found = [getattr(m, name) for m in modules if hasattr(m, name)] or ([methods[name]] if name in methods else [])
        assert found, f"docs/algorithms.md names `{name}(...)`, which no grpolab module defines"
        params = inspect.signature(found[0]).parameters
        unknown = [a for a in args if a not in params]
        assert not unknown, f"docs/algorithms.md: `{name}` takes no argument {unknown}; it takes {list(params)}"


def test_kl_placement_is_read_as_a_property():
    grpo, ppo = resolve_algo("grpo"), resolve_algo("ppo")
    assert grpo.kl_in_loss and not grpo.kl_in_reward
    assert ppo.kl_in_reward and not ppo.kl_in_loss


def test_every_grpolab_function_named_in_the_presets_docs_exists():
    """AlgoConfig's field docs point at real functions (grpolab.x.y.name)."""
    import importlib

    import grpolab.algo.presets as presets_module

    text = Path(presets_module.__file__).read_text()
    for module, name in re.findall(r"(grpolab(?:\.[a-z_]+)+)\.([A-Za-z_][A-Za-z0-9_]*)\b", text):
        try:
            mod = importlib.import_module(module)
        except ImportError:  # grpolab.algo.advantages.ADVANTAGES: the module is the whole path minus the name
            continue
        assert hasattr(mod, name), f"{module}.{name}"
