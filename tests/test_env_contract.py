"""The environment contract and its adapters: TRL's tools= and environment_factory= forms, gym-style
environments, and load_environment by file, module, built-in name or object."""

import asyncio
import importlib.util
import json
import threading
import time
from pathlib import Path

import pytest

from grpolab.env import (
    EnvConfigError,
    Environment,
    EnvironmentNotFound,
    EnvironmentShapeError,
    FactoryEnvironment,
    FunctionTools,
    GymAdapter,
    SchemaError,
    load_environment,
    tool_method_names,
)

# ---------------------------------------------------------------- an environment as a TRL user writes it


class ShoppingEnv:
    def __init__(self):
        self.cart = []
        self.budget = 0.0

    def reset(self, **kwargs) -> str | None:
        self.cart = []
        self.budget = float(kwargs["budget"])
        return f" Your budget is {self.budget:g} dollars."

    def add_item(self, item: str, price: float) -> str:
        """
        Add an item to the shopping cart.

        Args:
            item: The name of the item.
            price: The price of the item in dollars.

        Returns:
            A confirmation message.
        """
        self.cart.append((item, price))
        return f"Added {item} for {price} dollars."

    def total(self) -> float:
        """
        Get the total price of the cart.

        Returns:
            The total price in dollars.
        """
        return sum(price for _, price in self.cart)

    def get_reward(self) -> float:
        spent = self._spent()
        return 1.0 if 0 < spent <= self.budget else 0.0

    def _spent(self) -> float:
        return sum(price for _, price in self.cart)


def call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


FIELDS = {"prompt": [{"role": "user", "content": "Buy bread and milk."}], "budget": 10}


def test_trl_environment_class_works_unchanged():
    env = FactoryEnvironment(ShoppingEnv)
    assert isinstance(env, Environment)
    assert [t["function"]["name"] for t in env.tools] == ["add_item", "total"]
    assert env.tools[0]["function"]["parameters"]["required"] == ["item", "price"]
    assert env.reset(FIELDS) == " Your budget is 10 dollars."
    reply = env.step(
        "I will buy both. "
        + call("add_item", item="bread", price=3)
        + call("add_item", item="milk", price=2.5)
        + call("total")
    )
    assert [m["content"] for m in reply.messages] == [
        "Added bread for 3.0 dollars.",
        "Added milk for 2.5 dollars.",
        "5.5",
    ]
    assert [m["name"] for m in reply.messages] == ["add_item", "add_item", "total"]
    assert reply.calls == {"add_item": 2, "total": 1} and not reply.done
    final = env.step("The total is 5.5 dollars.")
    assert final.done and final.messages == []
    assert env.reward() == 1.0
    env.reset({**FIELDS, "budget": 1})
    assert env.instance.cart == [] and env.reward() == 0.0


def test_model_cannot_reach_private_or_reserved_methods():
    env = FactoryEnvironment(ShoppingEnv)
    env.reset(FIELDS)
    reply = env.step(call("_spent") + call("get_reward") + call("reset", budget=99))
    assert reply.events == {"unknown_tool": 3} and env.instance.budget == 10


def test_instances_are_pooled_created_once_and_reset_between_uses():
    made = []

    def factory():
        made.append(ShoppingEnv())
        return made[-1]

    make = load_environment(factory)
    assert make.kind == "factory" and len(made) == 2  # one probe to classify, one seeding the pool
    a, b = make(), make()
    assert len(made) == 3 and a.instance is not b.instance
    a.reset(FIELDS)
    a.step(call("add_item", item="x", price=1))
    a.close()
    c = make()
    assert c.instance is a.instance and len(made) == 3  # reused, not re-created
    c.reset(FIELDS)
    assert c.instance.cart == []


def test_trl_semantics_of_tool_methods():
    class Base:
        def reset(self, **kwargs):
            return None

        def inherited(self, x: int) -> int:
            """Inherited tool.

            Args:
                x: A number.
            """
            return x

    class Env(Base):
        label = "not a tool"

        @staticmethod
        def static_tool(x: int) -> int:
            """A static tool.

            Args:
                x: A number.
            """
            return x

        @classmethod
        def maker(cls):
            return cls()

        @property
        def state(self):
            raise AssertionError("properties are never evaluated")

        def get_reward(self):
            return None

    assert tool_method_names(Env) == ["inherited", "static_tool"] == tool_method_names(Env())
    env = FactoryEnvironment(Env)
    assert env.step(call("static_tool", x=4)).messages[0]["content"] == "4"
    assert env.reward() is None


def test_trl_tool_rule_is_still_the_one_we_follow():
    """Guard: the installed TRL still selects tools with the rule tool_method_names implements. (TRL 1.16 has
    no standalone function that lists an environment's tools to compare with: the rule is inline in
    GRPOTrainer.__init__ and _generate_and_score_completions, reachable only by building a trainer, so
    its source is checked instead.)"""
    spec = importlib.util.find_spec("trl")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("trl is not installed")
    source = (Path(next(iter(spec.submodule_search_locations))) / "trainer" / "grpo_trainer.py").read_text()
    assert "inspect.getmembers(type(instance), predicate=inspect.isfunction)" in source
    assert 'if member_name not in ("reset", "get_reward") and not member_name.startswith("_")' in source
    assert "observation = environment.reset(**reset_kwargs)" in source
    assert '"content": content + observation' in source  # reset's string is appended to the user message
    assert 'tool_message = {"role": "tool", "name": name, "content": content}' in source


def test_reset_contract_details():
    class NoKwargs:
        def reset(self):
            return None

        def ping(self) -> str:
            """Answer pong."""
            return "pong"

    env = FactoryEnvironment(NoKwargs)
    assert env.reset(FIELDS) is None  # deliberate difference: TRL would raise TypeError here

    class BadReset(NoKwargs):
        def reset(self, **kwargs):
            return 42

    with pytest.raises(EnvironmentShapeError, match="return a string"):
        FactoryEnvironment(BadReset).reset(FIELDS)

    class NoReset:
        def ping(self) -> str:
            """Answer pong."""
            return "pong"

    with pytest.raises(EnvironmentShapeError, match="needs a `reset"):
        FactoryEnvironment(NoReset)


def test_async_get_reward_and_standalone_tools():
    def shout(text: str) -> str:
        """Upper-case a text.

        Args:
            text: The text.
        """
        return text.upper()

    class Env:
        def reset(self, **kwargs):
            self.n = 0

        def count(self) -> int:
            """Count a call."""
            self.n += 1
            return self.n

        async def get_reward(self):
            await asyncio.sleep(0)
            return self.n / 2

    env = FactoryEnvironment(Env, tools=[shout])
    assert [t["function"]["name"] for t in env.tools] == ["shout", "count"]  # standalone first, as in TRL
    env.reset({})
    reply = env.step(call("shout", text="hi") + call("count"))
    assert [m["content"] for m in reply.messages] == ["HI", "1"] and env.reward() == 0.5


def test_function_tools_is_trl_tools_form():
    def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first.
            b: The second.
        """
        return a + b

    env = FunctionTools([add])
    assert isinstance(env, Environment) and env.reset(FIELDS) is None and env.reward() is None
    assert env.step(call("add", a=1, b=2)).messages == [{"role": "tool", "name": "add", "content": "3"}]
    assert env.step("3").done
    with pytest.raises(EnvironmentShapeError, match="two tools are named 'add'"):
        FunctionTools([add, add])


# ---------------------------------------------------------------- gym-style environments


class Countdown3:
    """gym-style, 3-tuple: say numbers down from `start`; reward 1 per right number."""

    def __init__(self):
        self.n = 0

    def reset(self, start: int = 3):
        self.n = start
        return f"Count down from {start}."

    def step(self, action):
        right = action.strip() == str(self.n - 1)
        self.n -= 1 if right else 0
        return (f"now {self.n}", 1.0 if right else 0.0, self.n == 0)


class Countdown5(Countdown3):
    """gymnasium-style: reset -> (obs, info); step -> (obs, reward, terminated, truncated, info)."""

    def reset(self, *, seed=None, options=None):
        self.n, self.steps = 2, 0
        return {"n": 2}, {}

    def step(self, action):
        self.steps += 1
        _, reward, done = super().step(action)
        return {"n": self.n}, reward, done, self.steps >= 3, {}


def test_gym_adapter_three_tuple():
    env = GymAdapter(Countdown3())
    assert isinstance(env, Environment) and env.tools == []
    assert env.reset({"start": 2, "prompt": "ignored: reset does not take it"}) == "Count down from 2."
    r1 = env.step("1")
    assert r1.messages == [{"role": "user", "content": "now 1"}] and not r1.done
    r2 = env.step("7")
    assert r2.messages[0]["content"] == "now 1" and not r2.done
    r3 = env.step("0")
    assert r3.done and env.reward() == 2.0
    assert env.step("more").done  # nothing runs after the end


def test_gym_adapter_five_and_four_tuples():
    env = GymAdapter(Countdown5())
    assert env.reset(FIELDS) == '{"n": 2}'
    assert env.step("1").messages[0]["content"] == '{"n": 1}'
    assert env.step("9").done is False
    r = env.step("9")
    assert r.done and env.reward() == 1.0  # truncated after 3 steps

    class Four(Countdown3):
        def step(self, action):
            return (*super().step(action), {"info": 1})

    env = GymAdapter(Four())
    env.reset({"start": 1})
    assert env.step("0").done and env.reward() == 1.0


def test_gym_adapter_failures_end_the_trajectory_with_an_event():
    class Raises(Countdown3):
        def step(self, action):
            raise KeyError("no such move")

    class Shapeless(Countdown3):
        def step(self, action):
            return "just text"

    release = threading.Event()

    class Hangs(Countdown3):
        def step(self, action):
            release.wait(30)

    class Floods(Countdown3):
        def step(self, action):
            return "y" * 5000, None, False

    r = GymAdapter(Raises()).step("1")
    assert r.done and r.events == {"exception": 1} and "KeyError" in r.messages[0]["content"]
    r = GymAdapter(Shapeless()).step("1")
    assert r.done and r.events == {"exception": 1} and "(observation, reward, done)" in r.messages[0]["content"]
    t = time.monotonic()
    r = GymAdapter(Hangs(), timeout_s=0.3).step("1")
    release.set()
    assert time.monotonic() - t < 2 and r.done and r.events == {"timeout": 1}
    env = GymAdapter(Floods(), max_obs_chars=100)
    r = env.step("1")
    assert r.events == {"truncated": 1} and r.messages[0]["content"].endswith("...[truncated 4900 chars]")
    assert env.reward() == 0.0
    with pytest.raises(EnvironmentShapeError):
        GymAdapter(object())


# ---------------------------------------------------------------- load_environment

ENV_FILE = '''
import json


class Shop:
    def reset(self, **kwargs):
        self.items = []
        return None

    def buy(self, item: str) -> str:
        """Buy an item.

        Args:
            item: What to buy.
        """
        self.items.append(item)
        return "ok"

    def get_reward(self):
        return float(len(self.items))


def double(x: int) -> int:
    """Double a number.

    Args:
        x: The number.
    """
    return 2 * x


TOOLS = [double]


class Walk:
    def reset(self):
        self.pos = 0
        return "at 0"

    def step(self, action):
        self.pos += 1
        return f"at {self.pos}", 0.5, self.pos >= 2

    def close(self):
        pass


def make_walk():
    return Walk()


class Undocumented:
    def reset(self, **kwargs):
        return None

    def act(self, x):
        return x
'''


@pytest.fixture()
def env_file(tmp_path: Path) -> Path:
    path = tmp_path / "my_envs.py"
    path.write_text(ENV_FILE)
    (tmp_path / "broken_env.py").write_text("import json\nraise RuntimeError('cannot start')\n")
    return path


def test_load_from_a_file_path(env_file):
    make = load_environment(f"{env_file}:Shop")
    assert make.kind == "factory" and make.name == "Shop"
    env = make()
    env.reset(FIELDS)
    assert env.step(call("buy", item="tea")).messages[0]["content"] == "ok" and env.reward() == 1.0

    tools = load_environment(f"{env_file}:TOOLS")()
    assert isinstance(tools, FunctionTools) and tools.step(call("double", x=4)).messages[0]["content"] == "8"
    single = load_environment(f"{env_file}:double")()
    assert isinstance(single, FunctionTools)

    walk = load_environment(f"{env_file}:Walk")
    assert walk.kind == "gym"
    env = walk()
    assert env.reset({}) == "at 0" and not env.step("go").done and env.step("go").done and env.reward() == 1.0
    assert load_environment(f"{env_file}:make_walk").kind == "gym"  # a zero-argument factory function


def test_load_from_a_module_path_a_builtin_name_and_objects():
    assert load_environment("grpolab.env.builtin:GuessNumber").kind == "environment"
    assert load_environment("retry_arithmetic").kind == "environment"
    assert load_environment("calculator_python").kind == "factory"
    assert load_environment(ShoppingEnv).kind == "factory"
    assert load_environment(Countdown3).kind == "gym"
    assert load_environment(Countdown3(), kind="gym")().env is not None  # an instance: copied per trajectory
    a, b = load_environment(Countdown3())(), load_environment(Countdown3())()
    assert a.env is not b.env
    make = load_environment("retry_arithmetic", options={"step_penalty": 0.5})
    assert make().step_penalty == 0.5


def test_kind_overrides_the_guess_for_a_trl_tool_named_step():
    class Game:
        def reset(self, **kwargs):
            self.moves = 0

        def step(self, direction: str) -> str:
            """Move one square.

            Args:
                direction: north, south, east or west.
            """
            self.moves += 1
            return "moved"

    assert load_environment(Game).kind == "gym"  # documented ambiguity
    env = load_environment(Game, kind="factory")()
    env.reset({})
    assert env.step(call("step", direction="north")).messages[0]["content"] == "moved"


def test_load_errors_name_the_problem_and_the_fix(env_file, tmp_path):
    cases = [
        (f"{tmp_path}/missing.py:Shop", EnvironmentNotFound, "does not exist"),
        ("no_such_package_xyz.envs:Shop", EnvironmentNotFound, "module 'no_such_package_xyz.envs' not found"),
        (f"{env_file}:Nope", EnvironmentNotFound, "has no 'Nope'; names it defines: Shop, TOOLS"),
        ("no_such_builtin", EnvironmentNotFound, "unknown environment 'no_such_builtin'"),
        (f"{env_file}:", EnvironmentNotFound, "incomplete"),
        (f"{tmp_path}/broken_env.py:X", EnvConfigError, "RuntimeError: cannot start"),
        (f"{env_file}:json", EnvironmentShapeError, "no known shape"),
        (f"{env_file}:Undocumented", SchemaError, "act"),
    ]
    for spec, error, text in cases:
        with pytest.raises(error) as e:
            load_environment(spec)
        assert text in str(e.value), (spec, str(e.value))
        assert isinstance(e.value, ValueError)
    with pytest.raises(EnvironmentShapeError, match="no known shape"):
        load_environment(42)
    with pytest.raises(EnvironmentShapeError, match="empty list"):
        load_environment([])
    with pytest.raises(EnvConfigError, match="kind must be one of"):
        load_environment(ShoppingEnv, kind="magic")


def test_missing_dependency_is_told_apart_from_a_missing_module(tmp_path, monkeypatch):
    (tmp_path / "needs_dep_env.py").write_text("import not_installed_dep_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(EnvConfigError, match="it needs 'not_installed_dep_xyz', which is not installed"):
        load_environment("needs_dep_env:X")
