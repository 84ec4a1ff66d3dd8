"""The pieces that let environments written for other trainers run unchanged, one by one:
the OpenEnv and SkyRL-gym adapters on environments written in those projects' style (tests/envs/),
sync tools on the calling thread, reward functions that take `environments`, prompts the environment
writes, rows without prompts or answers, task=env, TRL's spellings in grpolab.train, and what TRL 1.16
itself does (read from its installed source). The end-to-end runs are tests/test_trl_envs.py."""

from __future__ import annotations

import importlib.util
import json
import random
import signal
import threading
from pathlib import Path

import pytest

from grpolab.batch import Example
from grpolab.env import ToolCall, ToolRunner, load_environment, run_turns
from grpolab.env.base import Reply, example_seed, seeded
from grpolab.env.loading import REGISTRY, registered
from grpolab.env.openenv import observation_text
from grpolab.env.rollout import prompt_messages
from grpolab.env.skyrl import ConfigView
from grpolab.rewards import score_completions
from grpolab.rewards.custom import is_batch
from grpolab.tasks import build_task
from grpolab.util.fields import ConfigError

ENVS = Path(__file__).resolve().parent / "envs"
OPENENV, SKYRL = ENVS / "openenv_style.py", ENVS / "skyrl_style.py"


def call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


# ---------------------------------------------------------------------------------------- OpenEnv


def test_an_openenv_text_action_is_the_models_turn():
    factory = load_environment(f"{OPENENV}:WordGuessEnvironment")
    assert factory.kind == "openenv"
    env = factory()
    assert env.tools == []  # one required str field: the turn is the action, no tool
    fields = {"prompt": "Play.", "id": "row-7"}
    assert env.reset(fields) == "Guess the four-letter word."
    inst = env.user_env
    assert inst.seeds == [example_seed(fields)] and inst.state.episode_id == "row-7"  # reset(seed=, episode_id=)
    wrong = next(w for w in ("done", "node") if w != inst.secret)
    first = env.step(f"I say {wrong}")
    right = sum(a == b for a, b in zip(wrong, inst.secret))
    assert first.messages == [{"role": "user", "content": f"{right} letters in place."}] and not first.done
    last = env.step(inst.secret)  # the observation is done: the trajectory ends
    assert last.done and env.reward() == pytest.approx(right / 4 + 1.0)  # the observations' rewards, summed
    assert env.step("again") == Reply(done=True)


def test_an_openenv_structured_action_is_a_tool_checked_by_its_model():
    env = load_environment(f"{OPENENV}:GridEnvironment")()
    (tool,) = env.tools
    params = tool["function"]["parameters"]
    assert tool["function"]["name"] == "MoveAction" and tool["function"]["description"] == "Move on the grid."
    assert set(params["properties"]) == {"direction", "steps"} and params["required"] == ["direction"]
    env.reset({"id": "g"})
    bad = env.step(call("MoveAction", direction="north"))  # pydantic refuses it: no step is taken
    assert bad.events["bad_arguments"] == 1 and env.user_env.state.step_count == 0 and not bad.done
    assert "Error: bad arguments for tool 'MoveAction'" in bad.messages[0]["content"]
    mixed = env.step(call("MoveAction", direction="up") + call("Jump") + "<tool_call>{oops")
    assert mixed.messages[0]["content"] == '{"x": 0, "y": 1}'  # the observation's own fields, as JSON
    assert mixed.events["unknown_tool"] == 1 and mixed.events["parse"] == 1 and mixed.calls["MoveAction"] == 1
    done = env.step(call("MoveAction", direction="up") + call("MoveAction", direction="up"))
    assert done.done and len(done.messages) == 1  # arrived after the first call: the second is not run
    assert env.reward() == 1.0 and env.user_env.state.step_count == 2
    assert env.step("no call") == Reply(done=True)


def test_observation_text_and_a_failing_step():
    mod = _load(OPENENV)
    assert observation_text(mod.GuessObservation(feedback="hi", reward=1.0)) == "hi"  # the only string field
    assert json.loads(observation_text(mod.GridObservation(x=1, y=2, done=True))) == {"x": 1, "y": 2}

    class Broken(mod.WordGuessEnvironment):
        def step(self, action: mod.GuessAction, timeout_s=None, **kwargs):
            raise RuntimeError("the server went away")

    env = load_environment(Broken)()
    env.reset({"id": 1})
    reply = env.step("anything")
    assert reply.done and reply.events["exception"] == 1 and "the server went away" in reply.messages[0]["content"]


# ---------------------------------------------------------------------------------------- SkyRL-gym


def test_a_skyrl_environment_is_made_per_trajectory_from_config_and_extras():
    factory = load_environment(f"{SKYRL}:OneWordEnv", options={"max_turns": 2, "hint": "Again."})
    assert factory.kind == "skyrl"
    env = factory()
    fields = {"prompt": "Say it.", "reward_spec": {"method": "rule", "ground_truth": "done"}, "id": "x"}
    prompt = env.reset(fields)  # the messages init() returned are the prompt
    assert prompt == [{"role": "system", "content": "Answer with one word."}, {"role": "user", "content": "Say it."}]
    first = env.step("nope")
    assert first.messages == [{"role": "user", "content": "Again."}] and not first.done
    last = env.step("done!")
    assert last.done and last.messages == [] and env.reward() == 1.0 and env.user_env.turns == 2
    before = env.user_env
    env.reset({**fields, "prompt": [{"role": "user", "content": "Again please."}]})  # a new instance per trajectory
    assert env.user_env is not before and env.user_env.turns == 0


def test_skyrl_config_reads_as_attributes_and_a_bad_step_ends_the_trajectory():
    cfg = ConfigView({"max_turns": 3, "nested": ConfigView({"a": 1})})
    assert cfg.max_turns == 3 and cfg.nested.a == 1 and cfg.get("missing", 5) == 5
    with pytest.raises(AttributeError):
        cfg.missing  # noqa: B018
    mod = _load(SKYRL)

    class TupleStep(mod.BaseTextEnv):
        def __init__(self, env_config, extras):
            super().__init__()

        def step(self, action):
            return [{"role": "user", "content": "x"}], 1.0, True, {}  # a gym tuple, not SkyRL's dict

    env = load_environment(TupleStep)()
    env.reset({"prompt": "p"})
    reply = env.step("a")
    assert reply.done and reply.events["exception"] == 1 and "not a dict" in reply.messages[0]["content"]


# ---------------------------------------------------------------------------------------- threads


def _alarmed() -> str:
    """A tool that limits itself with signal.alarm (TRL's examples/scripts/grpo_agent.py does)."""
    signal.signal(signal.SIGALRM, lambda *_: None)
    signal.alarm(5)
    signal.alarm(0)
    return threading.current_thread().name


def test_sync_tools_run_on_the_calling_thread_with_here():
    main = ToolRunner({"alarmed": _alarmed}, here=True).run([ToolCall("alarmed", {})])
    assert main.messages[0]["content"] == threading.current_thread().name and not main.events
    worker = ToolRunner({"alarmed": _alarmed}).run([ToolCall("alarmed", {})])
    assert worker.events["exception"] == 1 and "signal only works in main thread" in worker.messages[0]["content"]


def test_run_turns_sequential_steps_every_environment_on_the_calling_thread():
    class Where:
        def step(self, text):
            return Reply([{"role": "user", "content": threading.current_thread().name}])

    envs = [Where(), Where()]
    here = threading.current_thread().name
    assert [r.messages[0]["content"] for r in run_turns(envs, ["a", "b"], sequential=True)] == [here, here]
    assert all(r.messages[0]["content"] != here for r in run_turns(envs, ["a", "b"]))  # default: one thread each


# ---------------------------------------------------------------------------------------- rewards


def test_trl_reward_shapes_are_recognised():
    def reads_envs(environments, **kwargs):
        return [1.0 for _ in environments]

    def only_kwargs(**kwargs):
        return [0.0] * len(kwargs["completions"])

    def positional(x, **kwargs):
        return []

    assert is_batch(reads_envs, "r") and is_batch(only_kwargs, "r")
    assert is_batch(positional, "r")  # TRL calls it with keywords; `x` is refused before training:
    from grpolab.rewards.custom import adapt, check_available

    with pytest.raises(ConfigError, match="reward 'positional' requires 'x'"):
        check_available("positional", adapt(positional, {}, "r")[0], {"completions", "prompts"})


def test_reward_functions_receive_the_environments_and_prompts_of_their_group():
    class Adapter:
        def __init__(self, inst):
            self.user_env = inst

    seen = []

    def reward_func(environments, prompts, answer, **kwargs):
        seen.append((environments, prompts, answer))
        return [float(e["n"]) for e in environments]

    from grpolab.rewards.custom import adapt
    from grpolab.rewards.scoring import RewardFn

    fn, batch = adapt(reward_func, {}, "rewards[0]")
    fns = [RewardFn("reward_func", 1.0, fn, batch)]
    a, b = Example("p", "1"), Example("q", "2")
    envs = [Adapter({"n": k}) for k in range(4)]
    prompts = [[{"role": "user", "content": f"P{k}"}] for k in range(4)]
    convs = [[{"role": "assistant", "content": "x"}]] * 4
    scores = score_completions(
        fns, ["x"] * 4, [a, a, b, b], conversations=convs, context={"environments": envs, "prompts": prompts}
    )
    assert scores.total == [0.0, 1.0, 2.0, 3.0]  # the user's objects, unwrapped, one per completion
    assert sorted(s[2] for s in seen) == [["1", "1"], ["2", "2"]]  # one call per group, with its columns
    assert [p for s in sorted(seen, key=lambda s: s[2]) for p in s[1]] == prompts
    with pytest.raises(ValueError, match="3 prompts but 4 completions"):
        score_completions(fns, ["x"] * 4, [a, a, b, b], context={"prompts": prompts[:3]})


# ---------------------------------------------------------------------------------------- prompts


def test_prompt_messages_take_trl_rows_and_what_reset_returns():
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Add."}]
    assert prompt_messages(Example(msgs, ""), " 2 and 3", None) == [
        msgs[0],
        {"role": "user", "content": "Add.\n\n 2 and 3"},
    ]
    assert prompt_messages(Example("", ""), "Reach 2.", "S") == [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Reach 2."},
    ]
    empty = [{"role": "user", "content": ""}]
    assert prompt_messages(Example(empty, ""), "Task.", None) == [{"role": "user", "content": "Task."}]
    written = [{"role": "system", "content": "x"}, {"role": "user", "content": "y"}]
    assert prompt_messages(Example("ignored", ""), written, "S") == written  # the whole prompt, from reset
    with pytest.raises(ConfigError, match="example 'e1': empty prompt, and the environment's reset"):
        prompt_messages(Example(empty, "", id="e1"), None, None)


def test_seeded_draws_are_the_same_per_example_and_leave_the_stream_alone():
    random.seed(1)
    expected = [random.random() for _ in range(2)]
    random.seed(1)
    first = random.random()
    with seeded(example_seed({"id": "row-3"})):
        a = random.randint(0, 10**9)
    with seeded(example_seed({"id": "row-3", "answer": "other"})):
        b = random.randint(0, 10**9)
    assert a == b and [first, random.random()] == expected
    assert example_seed({"seed": 12}) == 12 and example_seed({"id": "a"}) != example_seed({"id": "b"})


def test_rows_without_prompt_or_answer_need_an_environment(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(
        "".join(
            json.dumps(r) + "\n"
            for r in [{"level": 1}, {"prompt": "", "level": 2}, {"prompt": [{"role": "user", "content": ""}]}] * 2
        )
    )
    with pytest.raises(ConfigError, match="no prompt column"):
        build_task("dataset", 0, {"path": str(path)})
    task = build_task("dataset", 0, {"path": str(path), "eval_size": 1}, environment=True)
    prompts = [e.prompt for e in task._train + task.eval_set()]
    empty = [{"role": "user", "content": ""}]  # kept as messages: reset's text goes into that user turn
    assert prompts.count("") == 4 and prompts.count(empty) == 2
    assert all(e.answer == "" for e in task._train) and task.default_rewards == []
    with pytest.raises(ConfigError, match="task_args.environment: reserved"):
        build_task("dataset", 0, {"path": str(path), "environment": True})


def test_task_env_is_trls_run_without_a_dataset():
    with pytest.raises(ConfigError, match="task=env: the environment writes the prompts, so it needs one"):
        build_task("env", 0)
    task = build_task("env", 7, {"eval_size": 3}, environment=True)
    a, b = task.sample(4, random.Random(0)), task.sample(4, random.Random(0))
    assert [e.id for e in a] == [e.id for e in b] and len({e.id for e in a}) == 4 and a[0].prompt == ""
    assert [e.id for e in task.eval_set()] == ["env-eval-7-0", "env-eval-7-1", "env-eval-7-2"]
    assert task.default_rewards == []


# ---------------------------------------------------------------------------------------- config and API


def test_env_settings_are_checked(tmp_path):
    from grpolab.training.config import build_config

    with pytest.raises(ConfigError, match="env.factories: give env.name .* or env.factories"):
        build_config(None, ["env.name=retry_arithmetic", "env.factories.a=guess_number"])
    with pytest.raises(ConfigError, match="env.tool_thread: must be one of worker, main"):
        build_config(None, ["env.name=retry_arithmetic", "env.tool_thread=gpu"])


def test_trl_spellings_of_the_python_api_are_checked_and_leave_nothing_registered(tmp_path):
    import grpolab

    def r(completions, **kwargs):
        return [0.0] * len(completions)

    with pytest.raises(ConfigError, match="give one of rewards= and reward_funcs="):
        grpolab.train(rewards=[r], reward_funcs=[r], out=str(tmp_path / "a"))
    with pytest.raises(ConfigError, match="give one of steps= and max_steps="):
        grpolab.train(steps=2, max_steps=2, out=str(tmp_path / "b"))
    with pytest.raises(ConfigError, match="environment_factory: expected a class"):
        grpolab.train(environment_factory=42, out=str(tmp_path / "c"))
    with pytest.raises(ConfigError, match="the config already sets env.name"):
        grpolab.train(
            environment_factory=_load(OPENENV).GridEnvironment, env={"name": "guess_number"}, out=str(tmp_path / "d")
        )
    assert not REGISTRY
    from grpolab.app.api import build

    cfg, _ = build(trl_env={"name": "x"}, env_task=True)
    assert cfg.task == "env" and cfg.env.name == "x"  # environment_factory and no dataset: TRL's train_dataset=None


def test_a_registered_object_is_found_by_its_name_only_inside_the_block():
    cls = _load(OPENENV).GridEnvironment
    with registered(cls, "GridEnvironment") as name, registered(cls, "GridEnvironment") as other:
        assert (name, other) == ("GridEnvironment", "GridEnvironment_2")
        assert load_environment(name).kind == "openenv"
    assert not REGISTRY


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(f"authored_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_what_trl_1_16_does_is_what_grpolab_follows():
    """Guard, read from the installed TRL's GRPOTrainer source (no function of TRL 1.16 exposes these
    rules alone; they are inline in __init__, _calculate_rewards and _generate_and_score_completions)."""
    spec = importlib.util.find_spec("trl")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("trl is not installed (pip install -e '.[test]')")
    source = (Path(next(iter(spec.submodule_search_locations))) / "trainer" / "grpo_trainer.py").read_text()
    # reward functions get the trajectories' instances, and the prompts after reset appended its text
    assert 'reward_kwargs["environments"] = self.environments' in source
    assert "rewards_per_func = self._calculate_rewards(inputs, prompts, completions, completion_ids_list)" in source
    # a row without a prompt: an empty user message that reset's text fills; no dataset: placeholder rows
    assert 'prompts = [x.get("prompt", [{"role": "user", "content": ""}]) for x in inputs]' in source
    assert 'Dataset.from_dict({"prompt": [[{"role": "user", "content": ""}]] * num_placeholder_rows})' in source
    # a dict of factories is routed by the `environment` field, which reset does not receive
    assert 'x.get("environment") if self._multi_environment else None' in source
    assert (
        'reset_kwargs = {k: v for k, v in x.items() if k != "environment"} if self._multi_environment else x' in source
    )
    # sync tools are called inline, on the trainer's (main) thread; async ones on an event-loop thread
    assert 'tool_call_results.append((name, sync_tool_dict[name](**function["arguments"])))' in source
    assert "asyncio.run_coroutine_threadsafe(" in source
    # get_reward: one more reward function per class that has it, weight 1, None for the other classes
    assert "return [e.get_reward() if type(e) is _env_type else None for e in environments]" in source
    assert "self.reward_weights = torch.cat([self.reward_weights, torch.ones(1)])" in source


def test_standalone_tools_go_beside_an_environment_class_as_trls_tools():
    from grpolab.app.api import _environments
    from grpolab.env import EnvironmentShapeError

    counter = _load(ENVS / "trl_counter.py").CounterEnv

    def shout(text: str) -> str:
        """Upper-case a text.

        Args:
            text: The text.
        """
        return text.upper()

    env = load_environment(counter, tools=[shout])()
    assert [t["function"]["name"] for t in env.tools] == ["shout", "increment", "peek"]  # standalone first, as TRL
    with pytest.raises(EnvironmentShapeError, match="standalone tools .* go with an environment class"):
        load_environment(f"{OPENENV}:GridEnvironment", tools=[shout])
    with _environments(counter, [shout]) as env_keys:  # grpolab.train(environment_factory=..., tools=[...])
        assert set(env_keys) == {"name", "tools"} and len(env_keys["tools"]) == 1
        again = load_environment(env_keys["name"], tools=env_keys["tools"])()
        assert [t["function"]["name"] for t in again.tools] == ["shout", "increment", "peek"]
    with _environments(None, [shout]) as env_keys:  # tools= alone: the functions are the environment
        assert list(env_keys) == ["name"] and load_environment(env_keys["name"]).kind == "tools"
    assert not REGISTRY
