"""Parse the tool calls of one model turn: Hermes/Qwen `<tool_call>{json}</tool_call>` blocks.

A turn may hold several calls; they are returned in the order they were written, each either a
`ToolCall` (name, arguments) or a `ParseError` (what was written, and why it is not a call). The
text is the model's output, so it is treated as hostile input:

- the work is bounded: at most `MAX_CALLS` blocks are read per turn (one more `ParseError` says
  the rest were ignored), and a block longer than `MAX_BLOCK_CHARS` characters is refused without
  being decoded; scanning is linear in the length of the turn;
- the JSON is read strictly: NaN/Infinity, duplicate keys and nesting deeper than `MAX_DEPTH` are
  refused, so that a call means one thing only;
- the payload must be an object with a string `name`; `arguments`, when present, must be an object
  (a missing `arguments` is read as `{}`, as a call of a tool without parameters; the tool's schema
  then says whether that is enough). Other keys are ignored;
- a `\\ud800` escape decodes to a lone UTF-16 surrogate, which no tokenizer or UTF-8 file accepts: the
  name and every string of the arguments are repaired once, here (grpolab.util.text.safe_data; lone
  surrogates become U+FFFD), before any tool sees them, and `ToolCall.repaired` says how many strings
  were (the runner counts the call as an `invalid_unicode` event).

An opening tag without its closing tag (the turn was cut off, or the model forgot it) is a
`ParseError`; when another `<tool_call>` opens before the first one closes, the first is reported
unclosed and parsing goes on from the second.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from grpolab.util.strict_json import StrictJSONError, strict_json_loads
from grpolab.util.text import safe_data

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"
MAX_CALLS = 16
"""Blocks read per turn; more are reported as one ParseError and not run."""
MAX_BLOCK_CHARS = 8192
"""Longest block content (characters between the tags) that is decoded."""
MAX_DEPTH = 16
"""Deepest bracket nesting accepted in a call's JSON."""
MAX_INT_DIGITS = 100
"""Longest integer accepted in a call's arguments (digits)."""
RAW_KEEP_CHARS = 200
"""How much of a refused block's text a ParseError keeps (enough to show the model what it wrote)."""


@dataclass(frozen=True)
class ToolCall:
    """One well-formed call: the tool's name, its arguments, and the block's text as written.

    repaired: strings of the decoded JSON (name, keys, values) that held UTF-16 surrogates and were
    made valid text (module docstring); 0 for an ordinary call."""

    name: str
    arguments: dict = field(default_factory=dict)
    raw: str = ""
    repaired: int = 0


@dataclass(frozen=True)
class ParseError:
    """A block that is not a usable call: its text (cut to RAW_KEEP_CHARS) and the reason."""

    raw: str
    reason: str


def _cut(text: str) -> str:
    """The first RAW_KEEP_CHARS characters of a refused block, marked when cut."""
    return text if len(text) <= RAW_KEEP_CHARS else text[:RAW_KEEP_CHARS] + "..."


def _decode(body: str) -> dict | str:
    """The JSON object of one block (grpolab.util.strict_json), or a reason why it is refused."""
    if not body:
        return 'the block is empty; expected a JSON object with "name" and "arguments"'
    try:
        payload = strict_json_loads(body, max_chars=MAX_BLOCK_CHARS, max_depth=MAX_DEPTH, max_int_digits=MAX_INT_DIGITS)
    except StrictJSONError as e:
        return f"the JSON is {e}" if str(e).startswith(("nested", "longer")) else str(e)
    if not isinstance(payload, dict):
        return f'expected a JSON object with "name" and "arguments", got {type(payload).__name__}'
    return payload


def _to_call(body: str, raw: str) -> ToolCall | ParseError:
    """Turn one block's content into a ToolCall, or a ParseError that says what is wrong."""
    payload = _decode(body)
    if isinstance(payload, str):
        return ParseError(_cut(raw), payload)
    payload, repaired = safe_data(payload)
    name = payload.get("name")
    if name is None:
        return ParseError(_cut(raw), 'missing "name": expected {"name": <tool name>, "arguments": {...}}')
    if not isinstance(name, str) or not name.strip():
        return ParseError(_cut(raw), f'"name" must be a non-empty string, got {json.dumps(name)[:50]}')
    arguments = payload.get("arguments", {})
    if not isinstance(arguments, dict):
        kind = "a string" if isinstance(arguments, str) else type(arguments).__name__
        return ParseError(_cut(raw), f'"arguments" must be a JSON object, got {kind}')
    return ToolCall(name=name.strip(), arguments=arguments, raw=raw, repaired=repaired)


def parse_tool_calls(text: str, max_calls: int = MAX_CALLS) -> list[ToolCall | ParseError]:
    """Every `<tool_call>...</tool_call>` block of `text`, in order, as ToolCall or ParseError.

    An empty list means the turn makes no call (the trajectory's final answer, for a tool
    environment). At most `max_calls` blocks are read; if more follow, one ParseError says so.
    """
    out: list[ToolCall | ParseError] = []
    pos = text.find(OPEN_TAG)
    while pos >= 0:
        if len(out) >= max_calls:
            out.append(ParseError("", f"more than {max_calls} tool calls in one turn; the rest were not run"))
            break
        start = pos + len(OPEN_TAG)
        end = text.find(CLOSE_TAG, start)
        next_open = text.find(OPEN_TAG, start)
        if end < 0 or (0 <= next_open < end):
            stop = next_open if next_open >= 0 else len(text)
            out.append(ParseError(_cut(text[pos:stop].strip()), f"{OPEN_TAG} without a closing {CLOSE_TAG}"))
            pos = next_open
            continue
        body = text[start:end]
        if len(body) > MAX_BLOCK_CHARS:  # not stripped or decoded: refused on its length alone
            out.append(ParseError(_cut(body.strip()), f"the block is longer than {MAX_BLOCK_CHARS} characters"))
        else:
            out.append(_to_call(body.strip(), body.strip()))
        pos = text.find(OPEN_TAG, end + len(CLOSE_TAG))
    return out


def has_tool_call(text: str) -> bool:
    """True if the text opens at least one tool-call block (cheap; nothing is decoded)."""
    return OPEN_TAG in text
