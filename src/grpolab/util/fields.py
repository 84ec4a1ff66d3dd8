"""Typed settings fields: each field's documentation (read from the source), the coercion of a
string from the command line to its type, and ConfigError, the error a bad setting raises (exit 2).
"""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """A usage error: a bad key, type or value. The CLI turns it into exit code 2."""


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


def coerce_field(key: str, value: Any, typ: Any) -> Any:
    """Check one config value against its annotated type, gently coercing what YAML gets wrong.

    Accepted: None for Optional fields; ints (and integral floats) for int; numbers and numeric strings
    for float (YAML 1.1 reads `1e-4` as a string), which must be finite; exact types for bool, str,
    list and dict. Anything else raises ConfigError naming `key`.
    """
    import math
    import types as _types
    import typing

    origin = typing.get_origin(typ)
    if typ is Any:
        return value
    if origin is typing.Union or origin is _types.UnionType:
        args = [a for a in typing.get_args(typ) if a is not type(None)]
        if value is None and len(args) < len(typing.get_args(typ)):
            return None
        errors = []
        for a in args:
            try:
                return coerce_field(key, value, a)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{key}: expected {typ}, got {value!r}")
    base = origin or typ
    if value is None:
        raise ConfigError(f"{key}: must be a {getattr(base, '__name__', base)}, not null")
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
    names = {str: "string (str)", list: "list", dict: "mapping (dict)"}
    if base in names:
        if not isinstance(value, base):
            raise ConfigError(f"{key}: must be a {names[base]}, got {type(value).__name__} {value!r}")
        return value
    return value
