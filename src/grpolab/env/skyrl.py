"""SkyRL-gym-style environments through an adapter: made per trajectory from (env_config, extras),
started by init(prompt), stepped with the model's text, answering with a dict.

The shape (`BaseTextEnv` of NovaSky-AI/SkyRL's skyrl_gym):

    __init__(self, env_config, extras)      env_config: the environment's settings; extras: the
                                            example's fields (reward_spec, extra_info, ...)
    init(prompt) -> (prompt, metadata)      the chat messages the trajectory starts from
    step(action: str) -> {"observations": [messages], "reward": float, "done": bool, "metadata": {...}}
    close()

What the adapter does with it (`SkyRLAdapter(cls, env_config)`):

- one instance per trajectory, made at reset with env.options as env_config (OmegaConf's DictConfig
  when omegaconf is installed, else a dict whose keys also read as attributes) and the example's
  fields as extras.
- init receives the prompt as chat messages (a string prompt as one user message); the messages it
  returns are the prompt the model sees.
- step receives the model's turn text. Its `observations` (a list of messages, or one string: a user
  message) are what the environment adds; a role other than user or tool becomes user (the model
  writes the assistant turns). reward: the sum of the steps' rewards (None counts 0); `done` ends
  the trajectory, and so does a step with no observation (nothing new for the model to read).
- `postprocessed_action` (SkyRL lets an environment rewrite the model's action) is not applied: the
  model's tokens are trained as it sampled them.
- a step that raises, runs past timeout_s or returns no such dict ends the trajectory with an error
  message (`exception` / `timeout`).
"""

from __future__ import annotations

import inspect
from collections import Counter
from typing import Any

from grpolab.env.base import EnvironmentShapeError, Reply
from grpolab.env.runner import DEFAULT_MAX_RESULT_CHARS, DEFAULT_TIMEOUT_S, cut
from grpolab.env.timeouts import Raised, call_with_timeout, short_error, to_text
from grpolab.util.text import safe_data


class ConfigView(dict):
    """A dict whose keys also read as attributes (env_config.max_turns), as SkyRL's DictConfig does."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def env_config(options: dict) -> Any:
    """env.options as SkyRL's env_config: a DictConfig when omegaconf is installed, else a ConfigView."""
    try:
        from omegaconf import OmegaConf
    except ImportError:

        def view(x):
            return ConfigView({k: view(v) for k, v in x.items()}) if isinstance(x, dict) else x

        return view(dict(options))
    return OmegaConf.create(dict(options))


def is_skyrl_class(cls: type) -> bool:
    """A SkyRL-gym-style class: init and step and no reset (or a skyrl_gym base class)."""
    if any(base.__module__.split(".")[0] == "skyrl_gym" for base in cls.__mro__[1:]):
        return True
    return (
        callable(getattr(cls, "init", None))
        and callable(getattr(cls, "step", None))
        and not callable(getattr(cls, "reset", None))
    )


def _construct(cls: type, config: Any, extras: dict) -> Any:
    """cls(env_config=..., extras=...) by name where the constructor names them, else positionally."""
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        params = {}
    if "env_config" in params and "extras" in params:
        return cls(env_config=config, extras=extras)
    return cls(config, extras)


def _as_messages(prompt: Any) -> list[dict]:
    """A prompt as chat messages: a string is one user message."""
    return [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]


def _observations(value: Any) -> list[dict]:
    """A step's observations as messages (user or tool roles only; text content)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [{"role": "user", "content": value}] if value else []
    out = []
    for m in value:
        if not isinstance(m, dict):
            raise TypeError(f"an observation must be a message dict, got {type(m).__name__}")
        role = m.get("role") if m.get("role") in ("user", "tool") else "user"
        out.append(
            {
                "role": role,
                "content": to_text(m.get("content", "")),
                **({"name": m["name"]} if role == "tool" and isinstance(m.get("name"), str) else {}),
            }
        )
    return out


class SkyRLAdapter:
    """One SkyRL-gym-style environment per trajectory, made at reset (see the module docstring)."""

    def __init__(
        self,
        cls: type,
        config: Any = None,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_obs_chars: int = DEFAULT_MAX_RESULT_CHARS,
        here: bool = False,
    ) -> None:
        if not (callable(getattr(cls, "init", None)) and callable(getattr(cls, "step", None))):
            raise EnvironmentShapeError(
                f"SkyRLAdapter: {getattr(cls, '__name__', cls)} needs init(prompt) and step(action)."
            )
        self.cls, self.config = cls, config if config is not None else env_config({})
        self.tools: list[dict] = []  # a SkyRL environment parses the model's text itself: no tool schemas
        self.timeout_s, self.max_obs_chars, self.here = timeout_s, max_obs_chars, here
        self.env: Any = None
        self.total, self.finished = 0.0, False

    @property
    def user_env(self) -> Any:
        """This trajectory's instance: what a TRL-form reward function receives in `environments`."""
        return self.env

    def reset(self, fields: dict) -> list[dict]:
        """A new instance for the example (extras = its fields); init(prompt)'s messages are the prompt."""
        self.close()
        self.total, self.finished = 0.0, False
        self.env = _construct(self.cls, self.config, dict(fields))
        out = self.env.init(_as_messages(fields.get("prompt", "")))
        prompt = out[0] if isinstance(out, tuple) else out
        if isinstance(prompt, str) or not isinstance(prompt, list):
            raise EnvironmentShapeError(
                f"{self.cls.__name__}.init returned {type(prompt).__name__}; return (prompt messages, metadata)"
            )
        return _as_messages(safe_data(prompt)[0])  # lone surrogates from init: U+FFFD (grpolab.util.text)

    def step(self, turn_text: str) -> Reply:
        """env.step(turn_text) with its timeout; the observations as messages, the reward summed."""
        if self.finished or self.env is None:
            return Reply(done=True)
        out = call_with_timeout(lambda: self.env.step(turn_text), {}, self.timeout_s, convert=False, here=self.here)
        try:
            if out is None:
                raise TimeoutError(f"timed out after {self.timeout_s:g} s")
            if isinstance(out, Raised):
                raise out.error
            if not isinstance(out, dict) or "done" not in out:
                raise TypeError(f"step returned {type(out).__name__}, not a dict with observations, reward and done")
            messages = _observations(out.get("observations"))
        except Exception as e:  # noqa: BLE001 - the environment's failure ends this trajectory only
            self.finished = True
            kind = "timeout" if out is None else "exception"
            return Reply(
                [{"role": "user", "content": f"Error: the environment failed: {short_error(e)}"}],
                done=True,
                events=Counter({kind: 1}),
            )
        reward = out.get("reward")
        self.total += 0.0 if reward is None else float(reward)
        events: Counter = Counter()
        for m in messages:
            m["content"], removed = cut(m["content"], self.max_obs_chars)
            events["truncated"] += bool(removed)
        self.finished = bool(out["done"]) or not messages
        return Reply(messages, done=self.finished, events=+events)

    def reward(self) -> float | None:
        """The sum of the steps' rewards since reset."""
        return self.total

    def close(self) -> None:
        """Close this trajectory's instance (SkyRL environments have close())."""
        env, self.env = self.env, None
        close = getattr(env, "close", None)
        if callable(close):
            close()
