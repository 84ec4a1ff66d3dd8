"""Tool schemas (OpenAI function format) and a small validator for the arguments a model writes.

`function_schema(fn)` builds the schema the chat template shows the model, from the function's type
hints and Google-style docstring, with `transformers.utils.get_json_schema`: the same function TRL
and the chat templates of transformers use, so a tool renders the same here as it does there. Its
errors are re-raised as `SchemaError`, naming the function and how to fix it.

`check_arguments(schema, arguments)` validates a call's arguments against that schema before the
tool runs: required keys present, no unknown keys, the JSON types string / integer / number /
boolean / array / object / null (a list of types, and get_json_schema's `nullable`, allowed), and
`enum`; arrays and objects are checked item by item when the schema describes their items
(`items`, `prefixItems`, `properties`, `additionalProperties`). Nothing is coerced except an
integer given for a "number", which `prepare_arguments` passes on as a float. A boolean is not an
integer, and 3.0 is not an integer: the model is told so rather than silently corrected.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from grpolab.env.base import EnvConfigError

MAX_CHECK_DEPTH = 16
"""Nesting depth the validator follows; deeper values are refused."""

_TYPE_NAMES = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "a boolean",
    "array": "an array",
    "object": "an object",
    "null": "null",
}


class SchemaError(EnvConfigError):
    """A tool's schema cannot be built from its signature and docstring (a fix for its author).

    An EnvConfigError (a ValueError), so that a loader catching configuration errors catches it.
    """


_FIX = (
    "Give every parameter a type hint, and write a Google-style docstring: a one-line "
    "description, then an `Args:` section with one `name: description` line per parameter "
    "(see https://huggingface.co/docs/transformers/en/chat_extras#passing-tools)."
)


def function_schema(fn: Callable) -> dict:
    """The OpenAI function schema of `fn` ({"type": "function", "function": {...}}).

    Raises SchemaError naming the function, what is missing, and the fix.
    """
    from transformers.utils import get_json_schema

    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", repr(fn))
    try:
        return get_json_schema(fn)
    except Exception as e:  # DocstringParsingException, TypeHintParsingException, ValueError, ...
        raise SchemaError(f"tool {name}: cannot build its schema ({e}). {_FIX}") from e


def parameters_of(schema: dict) -> dict:
    """The parameters object of a schema given whole, as its "function" part, or as parameters."""
    if "function" in schema and isinstance(schema["function"], dict):
        schema = schema["function"]
    if "parameters" in schema and isinstance(schema["parameters"], dict):
        return schema["parameters"]
    return schema


def _json_type(value: Any) -> str:
    """The JSON type name of a decoded value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _allowed_types(spec: dict) -> list[str] | None:
    """The types a schema node accepts, or None when it does not restrict the type."""
    t = spec.get("type")
    if t is None:
        return None
    types = [t] if isinstance(t, str) else list(t)
    if spec.get("nullable") and "null" not in types:
        types.append("null")
    return types


def _check_type(value: Any, types: list[str], where: str) -> tuple[Any, str | None]:
    """Check one value against the allowed JSON types; an int for "number" becomes a float."""
    actual = _json_type(value)
    if actual in types:
        return value, None
    if actual == "integer" and "number" in types:
        return float(value), None
    wanted = " or ".join(_TYPE_NAMES.get(t, t) for t in types)
    shown = repr(value) if actual in ("integer", "number", "boolean", "null") else f"{_TYPE_NAMES.get(actual, actual)}"
    return value, f"{where} must be {wanted}, got {shown}"


def _check_value(value: Any, spec: dict, where: str, depth: int) -> tuple[Any, str | None]:
    """Validate (and minimally coerce) one value against one schema node."""
    if depth > MAX_CHECK_DEPTH:
        return value, f"{where} is nested too deeply"
    if not isinstance(spec, dict):
        return value, None
    types = _allowed_types(spec)
    if types is not None:
        value, err = _check_type(value, types, where)
        if err:
            return value, err
    if (
        "enum" in spec
        and isinstance(spec["enum"], list)
        and not any(value == e and _json_type(value) == _json_type(e) for e in spec["enum"])
    ):
        options = ", ".join(repr(e) for e in spec["enum"][:20])
        return value, f"{where} must be one of {options}; got {value!r}"[:300]
    if isinstance(value, (list, tuple)):
        return _check_array(list(value), spec, where, depth)
    if isinstance(value, dict) and ("properties" in spec or isinstance(spec.get("additionalProperties"), dict)):
        return _check_object(value, spec, where, depth, strict=False)
    return value, None


def _check_array(value: list, spec: dict, where: str, depth: int) -> tuple[list, str | None]:
    """Check the items of an array (`prefixItems` positions first, then `items`)."""
    prefix = spec.get("prefixItems") if isinstance(spec.get("prefixItems"), list) else []
    items = spec.get("items") if isinstance(spec.get("items"), dict) else None
    if prefix and len(value) != len(prefix) and items is None:
        return value, f"{where} must have exactly {len(prefix)} items, got {len(value)}"
    out = []
    for i, item in enumerate(value):
        sub = prefix[i] if i < len(prefix) else items
        if sub is None:
            out.append(item)
            continue
        item, err = _check_value(item, sub, f"{where}[{i}]", depth + 1)
        if err:
            return value, err
        out.append(item)
    return out, None


def _check_object(value: dict, spec: dict, where: str, depth: int, strict: bool) -> tuple[dict, str | None]:
    """Check required keys, unknown keys and each property of an object.

    `strict` (the top level: a function's arguments) refuses keys the schema does not name unless
    additionalProperties allows them; nested objects refuse them only when additionalProperties
    is False.
    """
    props = spec.get("properties") if isinstance(spec.get("properties"), dict) else {}
    extra = spec.get("additionalProperties", not strict)
    label = "argument" if strict else f"key of {where}"
    missing = [k for k in spec.get("required", []) if k not in value]
    if missing:
        return value, f"missing required {label} " + ", ".join(repr(k) for k in missing)
    out = {}
    for key, item in value.items():
        if key in props:
            item, err = _check_value(item, props[key], repr(key) if strict else f"{where}[{key!r}]", depth + 1)
        elif isinstance(extra, dict):
            item, err = _check_value(item, extra, repr(key) if strict else f"{where}[{key!r}]", depth + 1)
        elif extra:
            err = None
        else:
            known = ", ".join(repr(k) for k in props) or "none"
            err = f"unknown {label} {str(key)[:50]!r} (accepted: {known})"
        if err:
            return value, err
        out[key] = item
    return out, None


def prepare_arguments(schema: dict, arguments: dict) -> tuple[dict, str | None]:
    """Validate `arguments` against a tool schema; (arguments to pass, error message or None).

    The arguments returned equal the input except that integers given for "number" are floats.
    """
    params = parameters_of(schema)
    if not isinstance(arguments, dict):
        return arguments, f"arguments must be a JSON object, got {_json_type(arguments)}"
    return _check_object(arguments, params, "arguments", 0, strict=True)


def check_arguments(schema: dict, arguments: dict) -> str | None:
    """An error message if `arguments` do not fit the tool's schema, else None."""
    return prepare_arguments(schema, arguments)[1]
