"""Resolve an environment named in a recipe or on the command line, or passed as an object.

    load_environment("retry_arithmetic")              a built-in (builtin.ENVIRONMENTS)
    load_environment("my_pkg.envs:Wordle")            module path : name (dots in the name reach inside)
    load_environment("envs/wordle.py:Wordle")         file path : name
    load_environment(Wordle) / load_environment([add, mul])   objects, as grpolab.train(...) gets them

The result is an `EnvironmentFactory`: call it with no argument for a new Environment (one per
trajectory). What the object is decides the adapter (`kind=` overrides the guess):

    kind "environment"  it already has the Environment interface (reset/step/reward and tools)
    kind "tools"        a list of functions, or one function with parameters: FunctionTools
    kind "factory"      a class with `reset` whose public methods are tools, or that has
                        `get_reward`: FactoryEnvironment (TRL's environment_factory)
    kind "gym"          a class with `reset` and `step` and no other public methods (gym's own
                        `render`, `close`, `seed` aside), or a gym/gymnasium Env subclass: GymAdapter
    kind "openenv"      a class with `reset` and `step(action: <a pydantic model>)`, or an openenv
                        Environment subclass: OpenEnvAdapter (grpolab.env.openenv)
    kind "skyrl"        a class with `init(prompt)` and `step` and no `reset`, or a skyrl_gym Env
                        subclass: SkyRLAdapter (grpolab.env.skyrl); the options are its env_config
    a zero-argument function is a factory: it is called once, and what it returns is classified.
    an instance (not a class) is deep-copied for each trajectory.

A TRL environment whose only tool is named `step` looks like a gym environment: pass kind="factory".
One instance is made at load time to check the shape and build the tool schemas (TRL does the same),
so a missing docstring or type hint is reported before training starts.

`tools=` (standalone functions, TRL's tools= beside environment_factory) go with a factory class.
`here=True` runs sync tools and gym-style steps in the calling thread (env.tool_thread=main).
`process=True` runs every tool call in a forked child process, killed at its limit (env.tool_process;
tool calls only: a gym/OpenEnv/SkyRL step is its environment's state and stays in this process).
`registered(obj)` names an object for the duration of a block, so that a spec string (a recipe's
env.name, what grpolab.train records) can point at a class defined in a notebook.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import importlib.util
import inspect
import threading
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from grpolab.env.adapters import FactoryEnvironment, FunctionTools, GymAdapter, InstancePool, tool_method_names
from grpolab.env.base import EnvConfigError, EnvironmentShapeError, is_environment
from grpolab.env.openenv import OpenEnvAdapter, is_openenv_class
from grpolab.env.runner import DEFAULT_MAX_RESULT_CHARS, DEFAULT_TIMEOUT_S
from grpolab.env.skyrl import SkyRLAdapter, env_config, is_skyrl_class
from grpolab.util.user_code import NotImportable, import_file

EnvKind = Literal["environment", "tools", "factory", "gym", "openenv", "skyrl"]
"""The adapter kinds (the module docstring says which object each takes); `env.kind` is one, or empty."""
KINDS: tuple[str, ...] = typing.get_args(EnvKind)
GYM_METHODS = {"step", "reset", "render", "close", "seed", "get_wrapper_attr", "set_wrapper_attr", "has_wrapper_attr"}
"""Public methods a gym-style class has that are not tools."""

_FORMS = 'name it as "package.module:Name", "path/to/file.py:Name", or a built-in name ({builtins})'


class EnvironmentNotFound(EnvConfigError):
    """The file, module or name of an environment spec does not exist."""


class EnvironmentFactory:
    """A zero-argument callable making one Environment per trajectory; `name` and `kind` say what."""

    def __init__(self, make: Callable[[], Any], name: str, kind: str) -> None:
        self._make = make
        self.name = name
        self.kind = kind

    def __call__(self):
        """A new Environment (for FactoryEnvironment, backed by a pooled instance)."""
        return self._make()

    def __repr__(self) -> str:
        return f"EnvironmentFactory({self.name!r}, kind={self.kind!r})"


def _builtin_names() -> list[str]:
    """Names of the built-in environments (imported lazily: builtin.py pulls in the sandbox)."""
    from grpolab.env.builtin import ENVIRONMENTS

    return sorted(ENVIRONMENTS)


def _module_from_file(path_text: str) -> Any:
    """Import a Python file as a module (once per resolved path)."""
    path = Path(path_text).expanduser()
    if not path.is_file():
        raise EnvironmentNotFound(
            f"environment file {path_text!r} does not exist (looked at {path.resolve()}); give a path to a .py "
            "file, relative to the current directory or absolute, followed by :Name"
        )
    try:
        return import_file(path, "grpolab_env")
    except NotImportable as e:
        raise EnvConfigError(f"environment file {path_text!r}: {e}") from e


def _module_from_path(dotted: str) -> Any:
    """Import a module by its dotted path, telling a missing module from a failing one."""
    try:
        return importlib.import_module(dotted)
    except ModuleNotFoundError as e:
        if e.name and (dotted == e.name or dotted.startswith(e.name + ".")):
            raise EnvironmentNotFound(
                f"environment module {dotted!r} not found (no module {e.name!r}); check the spelling, install the "
                "package, or run from the directory that contains it (or give a file path: path/to/file.py:Name)"
            ) from e
        raise EnvConfigError(
            f"importing environment module {dotted!r} failed: it needs {e.name!r}, which is not installed"
        ) from e
    except Exception as e:
        raise EnvConfigError(f"importing environment module {dotted!r} failed: {type(e).__name__}: {e}") from e


REGISTRY: dict[str, Any] = {}
"""Objects named for a while by `registered` (a spec string finds them first)."""
_registry_lock = threading.Lock()


@contextlib.contextmanager
def registered(obj: Any, base: str):
    """A spec name for `obj` (`base`, or `base_2`, ... when taken) during the block, then removed."""
    with _registry_lock:
        name, n = base, 2
        while name in REGISTRY:
            name, n = f"{base}_{n}", n + 1
        REGISTRY[name] = obj
    try:
        yield name
    finally:
        with _registry_lock:
            REGISTRY.pop(name, None)


def resolve(spec: str) -> tuple[Any, str]:
    """The object a spec names, and a display name for it."""
    if spec in REGISTRY:
        return REGISTRY[spec], getattr(REGISTRY[spec], "__name__", spec)
    if ":" not in spec:
        from grpolab.env.builtin import ENVIRONMENTS

        if spec in ENVIRONMENTS:
            return ENVIRONMENTS[spec], spec
        raise EnvironmentNotFound(
            f"unknown environment {spec!r}: " + _FORMS.format(builtins=", ".join(sorted(ENVIRONMENTS)))
        )
    target, _, attr = spec.rpartition(":")
    if not target or not attr:
        raise EnvironmentNotFound(
            f"environment spec {spec!r} is incomplete: " + _FORMS.format(builtins=", ".join(_builtin_names()))
        )
    is_file = target.endswith(".py") or "/" in target or "\\" in target
    module = _module_from_file(target) if is_file else _module_from_path(target)
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = sorted(n for n in dir(module) if not n.startswith("_"))[:20]
            raise EnvironmentNotFound(f"{target!r} has no {attr!r}; names it defines: {', '.join(names) or 'none'}")
        obj = getattr(obj, part)
    return obj, attr


def _is_gym_class(cls: type) -> bool:
    """A gym-style class: a gym/gymnasium Env subclass, or reset + step and no other public methods."""
    if any(base.__module__.split(".")[0] in ("gym", "gymnasium") for base in cls.__mro__[1:]):
        return True
    public = set(tool_method_names(cls)) | ({"reset"} if callable(getattr(cls, "reset", None)) else set())
    return {"reset", "step"} <= public and not (public - GYM_METHODS)


def _class_kind(cls: type) -> str | None:
    """Which adapter a class needs, or None if it fits none.

    reset, step and reward together are the Environment interface (a gym class has no `reward`
    method; its rewards come out of step); its `tools` list may be set in __init__.
    """
    if all(callable(getattr(cls, m, None)) for m in ("reset", "step", "reward")):
        return "environment"
    if is_skyrl_class(cls):
        return "skyrl"
    if not callable(getattr(cls, "reset", None)):
        return None
    if callable(getattr(cls, "get_reward", None)):
        return "factory"
    if is_openenv_class(cls):
        return "openenv"
    if _is_gym_class(cls):
        return "gym"
    return "factory" if tool_method_names(cls) else None


def _required_params(fn: Callable) -> int:
    """How many parameters `fn` needs (0 for a factory)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 0
    return sum(
        1
        for p in params
        if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    )


def _shape_error(name: str, obj: Any) -> EnvironmentShapeError:
    """The error for an object of no known shape, saying which shapes are accepted."""
    return EnvironmentShapeError(
        f"environment {name!r} is a {type(obj).__name__} of no known shape. Accepted: a class with "
        "reset(**fields) whose public methods are tools (TRL's environment_factory), optionally get_reward(); "
        "a gym-style class with reset() and step(action) -> (observation, reward, done); an OpenEnv-style class "
        "(step takes a pydantic action); a SkyRL-gym-style class ((env_config, extras), init(prompt), step -> dict); "
        "a list of tool functions (TRL's tools=); an object with reset/step/reward and tools "
        "(grpolab.env.Environment); or a zero-argument function returning one of these. Pass kind=... to choose "
        "when the guess is wrong."
    )


def _checked(make: Callable[[], Any], opts: dict, tools: list) -> Callable[[], Any]:
    def checked():
        env = make()
        if not is_environment(env):
            raise EnvironmentShapeError(
                f"{type(env).__name__} has reset/step/reward but no `tools` attribute; "
                "set self.tools = [] (or its tool schemas) in __init__"
            )
        return env

    return checked


def _gym(make: Callable[[], Any], opts: dict, tools: list) -> Callable[[], Any]:
    return lambda: GymAdapter(
        make(), timeout_s=opts["timeout_s"], max_obs_chars=opts["max_result_chars"], here=opts["here"]
    )


def _openenv(make: Callable[[], Any], opts: dict, tools: list) -> Callable[[], Any]:
    pool = InstancePool(make)  # made once, reset for each trajectory (TRL's pool)
    return lambda: OpenEnvAdapter(
        pool.acquire(),
        timeout_s=opts["timeout_s"],
        max_obs_chars=opts["max_result_chars"],
        here=opts["here"],
        pool=pool,
    )


def _factory(make: Callable[[], Any], opts: dict, tools: list) -> Callable[[], Any]:
    pool = InstancePool(make)
    return lambda: FactoryEnvironment(make, pool=pool, tools=tools, **opts)


ADAPTERS: dict[str, Callable[[Callable[[], Any], dict, list], Callable[[], Any]]] = {
    "environment": _checked,
    "gym": _gym,
    "openenv": _openenv,
    "factory": _factory,
}
"""kind -> (make the user's object, run options, standalone tools) -> a per-trajectory factory ("tools" and
"skyrl" are built in environment_factory: neither has an object to make before reset)."""


def environment_factory(
    obj: Any,
    *,
    name: str | None = None,
    kind: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_result_chars: int = DEFAULT_MAX_RESULT_CHARS,
    options: dict | None = None,
    tools: Sequence[Callable] = (),
    here: bool = False,
    process: bool = False,
) -> EnvironmentFactory:
    """An EnvironmentFactory for an already imported object (see the module docstring).

    options: keyword arguments for the class's constructor (a recipe's environment options); for a
    SkyRL-style class, its env_config. tools: standalone tool functions beside a factory class's methods.
    """
    name = name or getattr(obj, "__name__", type(obj).__name__)
    if kind is not None and kind not in KINDS:
        raise EnvConfigError(f"environment kind must be one of {', '.join(KINDS)}, got {kind!r}")
    run_opts = {"timeout_s": timeout_s, "max_result_chars": max_result_chars, "here": here, "process": process}
    if isinstance(obj, (list, tuple)) or kind == "tools":
        fns = list(tools) + (list(obj) if isinstance(obj, (list, tuple)) else [obj])
        if not fns:
            raise EnvironmentShapeError(f"environment {name!r} is an empty list; list at least one tool function")
        FunctionTools(fns, **run_opts)  # checks the schemas now
        return EnvironmentFactory(lambda: FunctionTools(fns, **run_opts), name, "tools")
    if inspect.isclass(obj):
        make = functools.partial(obj, **options) if options else obj
        found = kind or _class_kind(obj)
        if found == "skyrl":  # made per trajectory at reset, from (env_config, the example's fields)
            config = env_config(options or {})
            SkyRLAdapter(obj, config)  # checks the shape now
            return _with_tools(
                EnvironmentFactory(
                    lambda: SkyRLAdapter(obj, config, timeout_s=timeout_s, max_obs_chars=max_result_chars, here=here),
                    name,
                    "skyrl",
                ),
                tools,
            )
    elif callable(obj) and not any(callable(getattr(obj, m, None)) for m in ("reset", "step")):
        if _required_params(obj) > 0:  # a single tool function
            return environment_factory([obj], name=name, kind="tools", **run_opts)
        make = functools.partial(obj, **options) if options else obj
        probe = make()
        found = kind or (_class_kind(type(probe)) if not inspect.isclass(probe) else None)
        obj = probe
    else:  # an instance: one deep copy per trajectory
        found = kind or _class_kind(type(obj))
        if found is not None:
            try:
                copy.deepcopy(obj)
            except Exception as e:
                raise EnvConfigError(
                    f"environment {name!r} is an instance that cannot be copied per trajectory "
                    f"({type(e).__name__}: {e}); pass its class or a zero-argument function"
                ) from e
        make = functools.partial(copy.deepcopy, obj)
    if found is None or found not in ADAPTERS:
        raise _shape_error(name, obj)
    factory = _with_tools(
        EnvironmentFactory(ADAPTERS[found](make, run_opts, list(tools)), name, found),
        tools if found != "factory" else (),
    )
    probe_env = factory()  # builds schemas and checks the shape now, not at the first rollout
    close = getattr(probe_env, "close", None)
    if found in ("factory", "openenv") and callable(close):
        close()  # its instance seeds the pool
    return factory


def _with_tools(factory: EnvironmentFactory, tools: Sequence[Callable]) -> EnvironmentFactory:
    """Refuse standalone tools for an adapter that cannot offer them (only factory classes and tool lists do)."""
    if tools:
        raise EnvironmentShapeError(
            f"environment {factory.name!r} is {factory.kind}-style: standalone tools "
            "(env.tools, TRL's tools= beside environment_factory) go with an environment class "
            "whose public methods are tools, or alone"
        )
    return factory


def load_tools(specs: Sequence[Any]) -> list[Callable]:
    """Standalone tool functions from specs ("module:fn", "file.py:fn", a registered name) or functions."""
    out = []
    for spec in specs:
        fn = resolve(spec.strip())[0] if isinstance(spec, str) else spec
        if not callable(fn) or inspect.isclass(fn):
            raise EnvironmentShapeError(f"tool {spec!r} is a {type(fn).__name__}, not a function")
        out.append(fn)
    return out


def load_environment(
    spec: Any,
    *,
    kind: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_result_chars: int = DEFAULT_MAX_RESULT_CHARS,
    options: dict | None = None,
    tools: Sequence[Any] = (),
    here: bool = False,
    process: bool = False,
) -> EnvironmentFactory:
    """Resolve a spec ("module:Name", "file.py:Name", a built-in name, a registered name, or an object)
    to a factory. tools: standalone tool functions (or their specs) beside a factory class's methods.

    Raises EnvironmentNotFound (a missing file, module or name) or EnvironmentShapeError (an
    object of no known shape); both are ValueErrors whose message names the fix.
    """
    if isinstance(spec, str):
        obj, name = resolve(spec.strip())
    else:
        obj, name = spec, None
    return environment_factory(
        obj,
        name=name,
        kind=kind or None,
        timeout_s=timeout_s,
        max_result_chars=max_result_chars,
        options=options,
        tools=load_tools(tools),
        here=here,
        process=process,
    )
