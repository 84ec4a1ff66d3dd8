"""Typed settings fields: each field's documentation (read from the source), the check of a value against
its annotated type (with the gentle coercion of a string from the command line), the closed set of values
a switch allows (read from its `Literal` type for the errors, `--help` and docs/configuration.md), and
ConfigError, the error a bad setting raises (exit 2).

A switch with a closed set of values is annotated with a `Literal` alias that the module owning the
behaviour defines once (`ThreadWait = Literal["auto", "short", ...]` in grpolab.util.threads); a value that
also follows a pattern (device `cuda:N`) adds an `Annotated[str, Pattern(...)]` member to the union.
Containers carry their element types (`list[str]`, `dict[str, Any]`, `list[dict[str, Any]]`), checked
element by element with the element's place in the error (`reflection_phrases[2]: ...`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


class ConfigError(ValueError):
    """A usage error: a bad key, type or value. The CLI turns it into exit code 2."""


@dataclass(frozen=True)
class Pattern:
    """The `Annotated[str, Pattern(...)]` marker of a string that must match `regex` as a whole; `shown` is
    how the choices list it (`cuda:N`), `meaning` what it stands for."""

    regex: str
    shown: str
    meaning: str = ""

    def matches(self, value: Any) -> bool:
        return isinstance(value, str) and re.fullmatch(self.regex, value) is not None

    def text(self) -> str:
        return f"{self.shown} ({self.meaning})" if self.meaning else self.shown


def field_docs(cls: type) -> dict[str, str]:
    """Map each dataclass field to the string literal written right under it in the source (the one
    place a setting is documented: `--help`, the docs tests and the config errors read it from there)."""
    import ast
    import inspect
    import textwrap

    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
                docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def field_types(cls: type) -> dict[str, Any]:
    """Each field's annotated type, resolved (the modules use `from __future__ import annotations`, so the
    annotations are strings until typing.get_type_hints evaluates them; include_extras keeps Annotated)."""
    import typing

    return typing.get_type_hints(cls, include_extras=True)


def _members(typ: Any) -> list[Any]:
    """The members of a union without None, or [typ]."""
    import types as _types
    import typing

    if typing.get_origin(typ) in (typing.Union, _types.UnionType):
        return [a for a in typing.get_args(typ) if a is not type(None)]
    return [typ]


def _pattern_of(typ: Any) -> Pattern | None:
    import typing

    if typing.get_origin(typ) is typing.Annotated:
        return next((m for m in typ.__metadata__ if isinstance(m, Pattern)), None)
    return None


def choices(typ: Any) -> list[str] | None:
    """The values a closed switch allows, as shown to the user: the arguments of its Literal type (of
    every Literal of a union), and a Pattern member's form (`cuda:N`); None for a type that is no switch
    (a number, a free string, a container). An empty string shows as ''."""
    import typing

    shown: list[str] = []
    for member in _members(typ):
        pattern = _pattern_of(member)
        if typing.get_origin(member) is typing.Literal:
            shown += [str(a) if a != "" else "''" for a in typing.get_args(member)]
        elif pattern is not None:
            shown.append(pattern.shown)
        else:
            return None
    return shown or None


def choices_text(typ: Any) -> str:
    """`one of a, b, c` for a switch's type (a Pattern member with its meaning)."""
    import typing

    parts: list[str] = []
    for member in _members(typ):
        pattern = _pattern_of(member)
        if pattern is not None:
            parts.append(pattern.text())
        else:
            parts += [str(a) if a != "" else "'' (empty)" for a in typing.get_args(member)]
    return "one of " + ", ".join(parts)


def _describe(typ: Any) -> str:
    """What a value of `typ` must be, in words (for the error of a union none of whose members took it)."""
    import typing

    if choices(typ) is not None:
        return choices_text(typ)
    base = typing.get_origin(typ) or typ
    args = typing.get_args(typ)
    if base is list and args:
        return f"a list of {_describe(args[0]).removeprefix('a ').removeprefix('an ')}s"
    return _NAMES.get(base, getattr(base, "__name__", str(base)))


_NAMES: dict[Any, str] = {
    bool: "true or false",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "a list",
    dict: "a mapping",
}


def coerce_field(key: str, value: Any, typ: Any) -> Any:
    """Check one config value against its annotated type, gently coercing what YAML gets wrong.

    Accepted: None for Optional fields; ints (and integral floats) for int; numbers and numeric strings
    for float (YAML 1.1 reads `1e-4` as a string), which must be finite; exact types for bool, str,
    list and dict; for a Literal one of its values (`KEY: must be one of a, b, c; got 'x'`); for
    Annotated[str, Pattern(...)] a string matching it; for list[T] and dict[str, T] every element checked
    as T, named by its place (`KEY[2]`, `KEY.name`), and dict keys that are strings. Anything else raises
    ConfigError naming `key`.
    """
    import math
    import types as _types
    import typing

    origin = typing.get_origin(typ)
    if typ is Any:
        return value
    if origin is typing.Annotated:
        pattern = _pattern_of(typ)
        out = coerce_field(key, value, typing.get_args(typ)[0])
        if pattern is not None and not pattern.matches(out):
            raise ConfigError(f"{key}: must be {pattern.text()}; got {value!r}")
        return out
    if origin is typing.Literal:
        allowed = typing.get_args(typ)
        if any(value == a and type(value) is type(a) for a in allowed):
            return value
        raise ConfigError(f"{key}: must be {choices_text(typ)}; got {value!r}")
    if origin is typing.Union or origin is _types.UnionType:
        args = _members(typ)
        if value is None and len(args) < len(typing.get_args(typ)):
            return None
        errors = []
        for a in args:
            try:
                return coerce_field(key, value, a)
            except ConfigError as e:
                errors.append((a, str(e)))
        if len(errors) == 1:
            raise ConfigError(errors[0][1])
        if choices(typ) is not None:
            raise ConfigError(f"{key}: must be {choices_text(typ)}; got {value!r}")
        same_kind = [e for a, e in errors if isinstance(value, (list, dict)) and typing.get_origin(a) is type(value)]
        if same_kind:  # a list for a list[str] member: its element error says more than the union's
            raise ConfigError(same_kind[0])
        raise ConfigError(f"{key}: must be {' or '.join(_describe(a) for a, _ in errors)}; got {value!r}")
    base = origin or typ
    if value is None:
        raise ConfigError(f"{key}: must be {_describe(typ)}, not null")
    if base is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: must be true or false (bool), got {value!r}")
    if base is int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        elif isinstance(value, str):
            try:
                value = int(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: must be an integer, got {value!r}")
        return value
    if base is float:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ConfigError(f"{key}: must be a number (float), got {value!r}")
        try:
            out = float(value)
        except ValueError:
            raise ConfigError(f"{key}: must be a number (float), got {value!r}") from None
        if not math.isfinite(out):
            raise ConfigError(f"{key}: must be finite, got {value!r}")
        return out
    if base is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: must be a string, got {value!r}")
        return value
    if base is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key}: must be a list, got {type(value).__name__} {value!r}")
        args = typing.get_args(typ)
        return [coerce_field(f"{key}[{i}]", v, args[0]) for i, v in enumerate(value)] if args else value
    if base is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: must be a mapping (dict), got {type(value).__name__} {value!r}")
        args = typing.get_args(typ)
        if not args:
            return value
        out_map = {}
        for k, v in value.items():
            if args[0] is str and not isinstance(k, str):
                raise ConfigError(f"{key}: keys must be strings (names), got {k!r}")
            out_map[k] = coerce_field(f"{key}.{k}", v, args[1])
        return out_map
    return value
