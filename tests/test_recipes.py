"""The shipped recipes: each names its algorithm preset, writes under algo: only what departs from it (each
departure with a comment saying why), and builds to a valid Config whose algo is the preset plus those keys."""

from __future__ import annotations

import re

import pytest
import yaml

from grpolab.algo.presets import ALGOS, resolve_algo
from grpolab.training.config import build_config
from grpolab.training.recipe import RECIPES_DIR, load_recipe

RECIPES = sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))


def algo_block(recipe: dict) -> tuple[str, dict]:
    """(preset name, the other algo keys) of a recipe; `algo: dapo` is the preset name alone."""
    raw = recipe.get("algo") or {}
    raw = {"name": raw} if isinstance(raw, str) else dict(raw)
    return raw.pop("name", "grpo"), raw


def restated_keys(recipe: dict) -> list[str]:
    """The algo keys of `recipe` whose value, once read, equals its preset's: they depart from nothing."""
    name, keys = algo_block(recipe)
    preset, resolved = resolve_algo(name), resolve_algo(name, keys)
    return sorted(k for k in keys if getattr(resolved, k) == getattr(preset, k))


def test_every_shipped_recipe_is_checked():
    assert len(RECIPES) >= 17 and set(ALGOS) <= set(RECIPES) and "demo" in RECIPES


def test_restated_keys_finds_a_restatement_and_nothing_else():
    assert restated_keys({"algo": {"name": "dapo", "eps_high": 0.28, "beta": 0.1}}) == ["eps_high"]
    assert restated_keys({"algo": {"name": "dapo", "advantage": "group_zscore", "mu": 1}}) == ["advantage", "mu"]
    # a value read from YAML as a string ("3e-4") or an int (0) is compared after coercion
    assert restated_keys({"algo": {"name": "gspo", "eps_low": "3e-4", "eps_high": 0.2}}) == ["eps_low"]
    assert restated_keys({"algo": {"name": "grpo", "beta": 0}}) == []  # grpo's preset beta is 0.04
    assert restated_keys({"algo": {"name": "dr_grpo", "beta": 0}}) == ["beta"]
    assert restated_keys({"algo": "dapo"}) == [] and restated_keys({"steps": 3}) == []


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_writes_only_departures_from_its_preset(name):
    recipe = load_recipe(name)
    assert restated_keys(recipe) == [], f"recipes/{name}.yaml restates its preset; delete these algo keys"


@pytest.mark.parametrize("name", RECIPES)
def test_each_departure_says_why(name):
    """Every algo key other than name carries a comment on its line."""
    text = (RECIPES_DIR / f"{name}.yaml").read_text()
    block = re.search(r"^algo:\n((?:  .*\n?)*)", text, re.M)
    _, keys = algo_block(yaml.safe_load(text))
    lines = {ln.split(":")[0].strip(): ln for ln in (block.group(1).splitlines() if block else [])}
    for key in keys:
        assert "#" in lines[key], f"recipes/{name}.yaml: algo.{key} departs from the preset without a comment"


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_builds_to_its_preset_plus_its_departures(name):
    recipe = load_recipe(name)
    preset, keys = algo_block(recipe)
    cfg = build_config(recipe)
    assert cfg.algo == resolve_algo(preset, keys)
    if name in ALGOS:  # an algorithm's own recipe names that algorithm's preset
        assert preset == name
