"""Deterministic built-in tools for tool-calling tasks, with their JSON schemas.

Every tool is a pure function of its (schema-validated) arguments, does bounded work, and never
evaluates code: the calculator uses the safe parser of grpolab.rewards.arith over exact fractions.

    calculator    {"expression": "2 * (3 + 4.5) / 5"}                 -> 3 (int) or a float
    convert_units {"value": 3.5, "from_unit": "km", "to_unit": "mi"}  -> float, 6 decimals
    date_add      {"date": "2024-02-27", "days": 3}                   -> "2024-03-01"
    date_diff     {"start": "2024-01-01", "end": "2024-03-01"}        -> 60
    weekday       {"date": "2024-03-01"}                              -> "Friday"
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from grpolab.rewards.arith import Syntax, evaluate


class ToolError(ValueError):
    """A tool was called with arguments it cannot handle (a wrong call, not a crash)."""


# ----------------------------------------------------------------------------- calculator

MAX_EXPR_CHARS = 256
MAX_EXPONENT = 64
MAX_MAGNITUDE = Fraction(10) ** 30


def _tokens(expr: str) -> list[str]:
    out, i = [], 0
    while i < len(expr):
        c = expr[i]
        if c.isspace():
            i += 1
        elif expr.startswith("**", i):
            out.append("**")
            i += 2
        elif c in "+-*/()^":
            out.append("**" if c == "^" else c)
            i += 1
        elif c.isdigit() or c == ".":
            j = i
            while j < len(expr) and (expr[j].isdigit() or expr[j] in "._"):
                j += 1
            tok = expr[i:j].replace("_", "")
            if tok.count(".") > 1 or tok == "." or len(tok) > 30:
                raise ToolError(f"bad number {expr[i:j]!r}")
            out.append(tok)
            i = j
        else:
            raise ToolError(f"character {c!r} not allowed in an expression")
    return out


def _check(v: Fraction) -> None:
    if abs(v) > MAX_MAGNITUDE or v.denominator > 10**30:
        raise ToolError("number out of range")


# Decimals, + - * / ** (^), unary signs and parentheses; every intermediate value bounded by _check.
SYNTAX = Syntax(
    tokenize=_tokens,
    error=ToolError,
    max_chars=MAX_EXPR_CHARS,
    max_depth=40,
    depth_message="expression nested too deeply",
    unary=True,
    max_exponent=MAX_EXPONENT,
    check=_check,
)


def calculator(expression: str) -> int | float:
    """Exact arithmetic (+ - * / ** ^, parentheses, decimals); an int when the result is whole."""
    v = evaluate(expression, SYNTAX)
    return int(v) if v.denominator == 1 else float(v)


# ----------------------------------------------------------------------------- units

_UNITS: dict[str, tuple[str, Fraction]] = {  # unit -> (dimension, factor to the base unit)
    "mm": ("length", Fraction(1, 1000)),
    "cm": ("length", Fraction(1, 100)),
    "m": ("length", Fraction(1)),
    "km": ("length", Fraction(1000)),
    "in": ("length", Fraction(254, 10000)),
    "ft": ("length", Fraction(3048, 10000)),
    "yd": ("length", Fraction(9144, 10000)),
    "mi": ("length", Fraction(1609344, 1000)),
    "mg": ("mass", Fraction(1, 1000000)),
    "g": ("mass", Fraction(1, 1000)),
    "kg": ("mass", Fraction(1)),
    "lb": ("mass", Fraction(45359237, 100000000)),
    "oz": ("mass", Fraction(45359237, 1600000000)),
    "s": ("time", Fraction(1)),
    "min": ("time", Fraction(60)),
    "h": ("time", Fraction(3600)),
    "day": ("time", Fraction(86400)),
    "week": ("time", Fraction(604800)),
    "ml": ("volume", Fraction(1, 1000)),
    "l": ("volume", Fraction(1)),
    "gal": ("volume", Fraction(3785411784, 1000000000)),
    "C": ("temperature", Fraction(1)),
    "F": ("temperature", Fraction(1)),
    "K": ("temperature", Fraction(1)),
}
UNIT_NAMES = sorted(_UNITS)


def _to_kelvin(v: Fraction, unit: str) -> Fraction:
    if unit == "C":
        return v + Fraction(27315, 100)
    if unit == "F":
        return (v - 32) * Fraction(5, 9) + Fraction(27315, 100)
    return v


def _from_kelvin(v: Fraction, unit: str) -> Fraction:
    if unit == "C":
        return v - Fraction(27315, 100)
    if unit == "F":
        return (v - Fraction(27315, 100)) * Fraction(9, 5) + 32
    return v


def convert_units(value: float, from_unit: str, to_unit: str) -> float:
    """Convert between units of the same dimension; result rounded to 6 decimals."""
    if from_unit not in _UNITS or to_unit not in _UNITS:
        raise ToolError("unknown unit")
    (dim_a, fa), (dim_b, fb) = _UNITS[from_unit], _UNITS[to_unit]
    if dim_a != dim_b:
        raise ToolError(f"cannot convert {dim_a} to {dim_b}")
    v = Fraction(value)
    out = _from_kelvin(_to_kelvin(v, from_unit), to_unit) if dim_a == "temperature" else v * fa / fb
    return round(float(out), 6)


# ----------------------------------------------------------------------------- dates


def _date(s: str) -> _dt.date:
    try:
        return _dt.date.fromisoformat(s)
    except (TypeError, ValueError) as e:
        raise ToolError(f"bad date {s!r}") from e


def date_add(date: str, days: int) -> str:
    """The ISO date `days` days after `date` (negative: before)."""
    try:
        return (_date(date) + _dt.timedelta(days=int(days))).isoformat()
    except OverflowError as e:
        raise ToolError("date out of range") from e


def date_diff(start: str, end: str) -> int:
    """Days from `start` to `end` (negative if end is earlier)."""
    return (_date(end) - _date(start)).days


def weekday(date: str) -> str:
    """English weekday name of an ISO date."""
    return _date(date).strftime("%A")


# ----------------------------------------------------------------------------- registry

_DATE = {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}

TOOL_SPECS: dict[str, dict] = {
    "calculator": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression with + - * / ** and parentheses.",
        "parameters": {
            "type": "object",
            "additionalProperties": False,
            "required": ["expression"],
            "properties": {"expression": {"type": "string", "minLength": 1, "maxLength": MAX_EXPR_CHARS}},
        },
    },
    "convert_units": {
        "name": "convert_units",
        "description": "Convert a quantity between units of length, mass, time, volume or temperature.",
        "parameters": {
            "type": "object",
            "additionalProperties": False,
            "required": ["value", "from_unit", "to_unit"],
            "properties": {
                "value": {"type": "number", "minimum": -1e12, "maximum": 1e12},
                "from_unit": {"enum": UNIT_NAMES},
                "to_unit": {"enum": UNIT_NAMES},
            },
        },
    },
    "date_add": {
        "name": "date_add",
        "description": "Add a number of days (may be negative) to an ISO date YYYY-MM-DD.",
        "parameters": {
            "type": "object",
            "additionalProperties": False,
            "required": ["date", "days"],
            "properties": {"date": _DATE, "days": {"type": "integer", "minimum": -100000, "maximum": 100000}},
        },
    },
    "date_diff": {
        "name": "date_diff",
        "description": "Number of days from start to end (ISO dates YYYY-MM-DD).",
        "parameters": {
            "type": "object",
            "additionalProperties": False,
            "required": ["start", "end"],
            "properties": {"start": _DATE, "end": _DATE},
        },
    },
    "weekday": {
        "name": "weekday",
        "description": "The day of the week (e.g. Monday) of an ISO date YYYY-MM-DD.",
        "parameters": {
            "type": "object",
            "additionalProperties": False,
            "required": ["date"],
            "properties": {"date": _DATE},
        },
    },
}

TOOL_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "calculator": calculator,
    "convert_units": convert_units,
    "date_add": date_add,
    "date_diff": date_diff,
    "weekday": weekday,
}


def run_tool(name: str, arguments: dict) -> Any:
    """Execute a built-in tool on already-validated arguments (ToolError on a bad call)."""
    if name not in TOOL_FUNCTIONS:
        raise ToolError(f"unknown tool {name!r}")
    try:
        return TOOL_FUNCTIONS[name](**arguments)
    except ToolError:
        raise
    except (TypeError, ValueError, ArithmeticError) as e:
        raise ToolError(f"{name}: {e}") from e
