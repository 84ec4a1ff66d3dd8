"""Text that can be tokenised, logged and written: no lone UTF-16 surrogates.

A Python `str` may hold the code points U+D800..U+DFFF, which are not characters: UTF-16 uses them in
pairs to write one character above U+FFFF. JSON's `\\ud800` escape puts a lone one into a string (the
model can write it inside a tool call; `json.loads` accepts it), and so can any Python code (a tool's
result, an exception's message). Such a string cannot be encoded as UTF-8: a fast tokenizer refuses it
(`TypeError`), and writing it to a UTF-8 file raises `UnicodeEncodeError`.

`safe_text(s)` is the one repair, applied where text enters the token stream, the metrics or a file
(grpolab.util.tool_calls for what the model's JSON decodes to, grpolab.env.runner for everything an environment
returns, grpolab.env.rollout for the model's decoded turns); each repair is counted by the caller
(env/errors_invalid_unicode):

    a high surrogate followed by a low one  -> the character they encode (chr(0x10000 + (hi-0xD800)*0x400 + (lo-0xDC00)))
    any other surrogate                     -> U+FFFD (the replacement character)

Text without surrogates comes back as the same object, so the common case costs one scan.
`safe_data(v)` does the same to every string (keys included) inside dicts, lists and tuples.
"""

from __future__ import annotations

import re
from typing import Any

REPLACEMENT = "\ufffd"
_PAIR = re.compile("[\ud800-\udbff][\udc00-\udfff]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def has_surrogates(s: str) -> bool:
    """True if `s` holds a surrogate code point (then it is not valid UTF-8 text)."""
    return not s.isascii() and _SURROGATE.search(s) is not None


def _join_pair(m: re.Match) -> str:
    hi, lo = ord(m.group(0)[0]), ord(m.group(0)[1])
    return chr(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00))


def safe_text(s: str) -> tuple[str, int]:
    """`s` as valid Unicode text, and the number of surrogate code points repaired (0: `s` itself).

    Pairs are joined into the character they encode, lone surrogates become U+FFFD."""
    if not has_surrogates(s):
        return s, 0
    joined, pairs = _PAIR.subn(_join_pair, s)
    out, lone = _SURROGATE.subn(REPLACEMENT, joined)
    return out, 2 * pairs + lone


def safe_data(value: Any) -> tuple[Any, int]:
    """`value` with safe_text applied to every string in it (dict keys too), and how many strings
    were repaired. Containers are rebuilt only when something in them changed; other values pass
    through as they are."""
    if isinstance(value, str):
        out, k = safe_text(value)
        return out, int(k > 0)
    if isinstance(value, dict):
        items, n = [], 0
        for key, v in value.items():
            key2, a = safe_data(key)
            v2, b = safe_data(v)
            items.append((key2, v2))
            n += a + b
        return (dict(items) if n else value), n
    if isinstance(value, (list, tuple)):
        parts = [safe_data(v) for v in value]
        n = sum(k for _, k in parts)
        if not n:
            return value, 0
        rebuilt = [v for v, _ in parts]
        return (rebuilt if isinstance(value, list) else tuple(rebuilt)), n
    return value, 0
