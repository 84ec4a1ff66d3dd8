"""Strict JSON for hostile input (what a model wrote): a value means one thing or is refused.

Refused, each with a reason a model can read: text longer than `max_chars`, nesting deeper than
`max_depth` (checked by one linear scan before decoding, so a deep payload never reaches the decoder's
recursion limit), NaN/Infinity, a non-finite or overlong number, an integer with more than
`max_int_digits` digits, and a key written twice in one object. Used by the `tool_call` verifier and
by the tool-call parser (grpolab.util.tool_calls).
"""

from __future__ import annotations

import json


class StrictJSONError(ValueError):
    """Input that a strict JSON reader refuses; its message says why."""


def depth_exceeds(s: str, max_depth: int) -> bool:
    """Bracket nesting deeper than max_depth, counted outside strings (linear scan)."""
    depth, in_str, esc = 0, False, False
    for c in s:
        if in_str:
            if esc:
                esc = False
            elif c == "\\":
                esc = True
            elif c == '"':
                in_str = False
        elif c == '"':
            in_str = True
        elif c in "[{":
            depth += 1
            if depth > max_depth:
                return True
        elif c in "]}":
            depth -= 1
    return False


def strict_json_loads(s: str, *, max_chars: int = 4096, max_depth: int = 8, max_int_digits: int = 15):
    """json.loads that refuses NaN/Infinity, non-finite floats, duplicate keys, huge ints, deep nesting."""
    if len(s) > max_chars:
        raise StrictJSONError(f"longer than {max_chars} characters")
    if depth_exceeds(s, max_depth):
        raise StrictJSONError(f"nested deeper than {max_depth} levels")

    def pairs(items):
        keys = [k for k, _ in items]
        if len(keys) != len(set(keys)):
            dup = next(k for k in keys if keys.count(k) > 1)
            raise StrictJSONError(f"duplicate key {dup!r} in the JSON object")
        return dict(items)

    def const(name):
        raise StrictJSONError(f"{name} is not valid JSON")

    def integer(text):
        if len(text.lstrip("-")) > max_int_digits:
            raise StrictJSONError(f"integer longer than {max_int_digits} digits")
        return int(text)

    def number(text):
        if len(text) > 64:
            raise StrictJSONError("number too long")
        x = float(text)
        if x in (float("inf"), float("-inf")) or x != x:
            raise StrictJSONError("non-finite number")
        return x

    try:
        return json.loads(s, object_pairs_hook=pairs, parse_constant=const, parse_int=integer, parse_float=number)
    except StrictJSONError:
        raise
    except json.JSONDecodeError as e:
        raise StrictJSONError(f"malformed JSON: {e.msg} at line {e.lineno} column {e.colno}") from e
    except (ValueError, RecursionError) as e:
        raise StrictJSONError(f"malformed JSON: {str(e)[:200]}") from e
