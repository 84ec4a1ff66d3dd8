"""Parse the tool calls of one model turn: Hermes/Qwen `<tool_call>{json}</tool_call>` blocks, or Llama 3.x's
bare call (the whole turn one JSON object `{"name": ..., "parameters": {...}}`, no tags). The one parser of
tool calls: the environments run what it reads (grpolab.env.calls) and the `tool_call` reward scores what it
reads (grpolab.rewards.tool_call), so a call means the same to both.

A turn may hold several calls; they are returned in the order they were written, each either a
`ToolCall` (name, arguments) or a `ParseError` (what was written, and why it is not a call). The
text is the model's output, so it is treated as hostile input:

- the work is bounded: at most `MAX_CALLS` blocks are read per turn (one more `ParseError` says
  the rest were ignored), and a block longer than `MAX_BLOCK_CHARS` characters (a caller's `max_chars`)
  is refused without being decoded; scanning is linear in the length of the turn;
- the JSON is read strictly: NaN/Infinity, duplicate keys and nesting deeper than `MAX_DEPTH` are
  refused (a caller may set a lower `max_depth`), so that a call means one thing only;
- the payload must be an object with a string `name`; `arguments`, when present, must be an object
  (a missing `arguments` is read as `{}`, as a call of a tool without parameters; the tool's schema
  then says whether that is enough). Other keys are ignored;
- a `\\ud800` escape decodes to a lone UTF-16 surrogate, which no tokenizer or UTF-8 file accepts: the
  name and every string of the arguments are repaired once, here (grpolab.util.text.safe_data; lone
  surrogates become U+FFFD), before any tool sees them, and `ToolCall.repaired` says how many strings
  were (the runner counts the call as an `invalid_unicode` event).

A turn without a `<tool_call>` tag whose text (surrounding whitespace aside) opens with `{"name": "<tool>",
"parameters":` (or `"arguments":`) is read as Llama 3.1/3.2's format: their chat templates write a call as exactly that object, `"parameters"` for the
arguments, one call per turn. The whole turn must then be that one object: malformed JSON, text after it, or
a second object is a `ParseError` (its `expected` says the Llama format), never a final answer.

An opening tag without its closing tag (the turn was cut off, or the model forgot it) is a
`ParseError`; when another `<tool_call>` opens before the first one closes, the first is reported
unclosed and parsing goes on from the second.
"""

from __future__ import annotations

import json
import re
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
HERMES_FORMAT = '<tool_call>{"name": "<tool>", "arguments": {...}}</tool_call>'
"""How a Hermes/Qwen call is written (said to the model after a call it could not parse)."""
BARE_FORMAT = '{"name": "<tool>", "parameters": {...}} as the whole turn'
"""How a Llama 3.x call is written."""
BARE_OPEN = re.compile(r'\A\s*\{\s*"name"\s*:\s*"[^"\\]*"\s*,\s*"(?:parameters|arguments)"\s*:')
"""A turn that opens like a bare call: read as one (module docstring)."""


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
    """A block that is not a usable call: its text (cut to RAW_KEEP_CHARS), the reason, and how a call is
    written in the format the model was using (HERMES_FORMAT or BARE_FORMAT)."""

    raw: str
    reason: str
    expected: str = HERMES_FORMAT


def _cut(text: str) -> str:
    """The first RAW_KEEP_CHARS characters of a refused block, marked when cut."""
    return text if len(text) <= RAW_KEEP_CHARS else text[:RAW_KEEP_CHARS] + "..."


def _decode(body: str, args_key: str = "arguments", max_chars: int = MAX_BLOCK_CHARS, max_depth: int = MAX_DEPTH):
    """The JSON object of one block (grpolab.util.strict_json), or a reason why it is refused (a str)."""
    if not body:
        return f'the block is empty; expected a JSON object with "name" and "{args_key}"'
    try:
        payload = strict_json_loads(body, max_chars=max_chars, max_depth=max_depth, max_int_digits=MAX_INT_DIGITS)
    except StrictJSONError as e:
        return f"the JSON is {e}" if str(e).startswith(("nested", "longer")) else str(e)
    if not isinstance(payload, dict):
        return f'expected a JSON object with "name" and "{args_key}", got {type(payload).__name__}'
    return payload


def _to_call(body: str, raw: str, max_chars: int, max_depth: int) -> ToolCall | ParseError:
    """Turn one block's content into a ToolCall, or a ParseError that says what is wrong."""
    return _from_payload(_decode(body, "arguments", max_chars, max_depth), raw, "arguments", HERMES_FORMAT)


def _from_payload(payload: dict | str, raw: str, args_key: str, expected: str) -> ToolCall | ParseError:
    """A decoded call (or _decode's reason) as a ToolCall or ParseError. args_key: the key of the arguments
    ("parameters" in Llama's bare calls); expected: how a call is written in that format."""
    if isinstance(payload, str):
        return ParseError(_cut(raw), payload, expected)
    payload, repaired = safe_data(payload)
    name = payload.get("name")
    if name is None:
        return ParseError(
            _cut(raw), f'missing "name": expected {{"name": <tool name>, "{args_key}": {{...}}}}', expected
        )
    if not isinstance(name, str) or not name.strip():
        return ParseError(_cut(raw), f'"name" must be a non-empty string, got {json.dumps(name)[:50]}', expected)
    arguments = payload.get(args_key, {})
    if not isinstance(arguments, dict):
        kind = "a string" if isinstance(arguments, str) else type(arguments).__name__
        return ParseError(_cut(raw), f'"{args_key}" must be a JSON object, got {kind}', expected)
    return ToolCall(name=name.strip(), arguments=arguments, raw=raw, repaired=repaired)


def parse_bare_call(
    text: str, *, max_chars: int = MAX_BLOCK_CHARS, max_depth: int = MAX_DEPTH
) -> list[ToolCall | ParseError]:
    """Llama 3.x's call: [the ToolCall] when the whole of `text` (surrounding whitespace aside) is one JSON object
    `{"name": <tool>, "parameters": {...}}` (or "arguments", when that is the key written second),
    [a ParseError] when the text opens like one (BARE_OPEN) but is not one (malformed JSON, longer than
    max_chars, text after the object), [] when it does not open like one (no call)."""
    if not BARE_OPEN.match(text):
        return []
    body = text.strip()
    if len(body) > max_chars:
        return [ParseError(_cut(body), f"the call is longer than {max_chars} characters", BARE_FORMAT)]
    payload = _decode(body, "parameters", max_chars, max_depth)
    key = (
        "arguments"
        if isinstance(payload, dict) and "parameters" not in payload and "arguments" in payload
        else "parameters"
    )
    return [_from_payload(payload, body, key, BARE_FORMAT)]


def parse_tool_calls(
    text: str, max_calls: int = MAX_CALLS, *, max_chars: int = MAX_BLOCK_CHARS, max_depth: int = MAX_DEPTH
) -> list[ToolCall | ParseError]:
    """Every `<tool_call>...</tool_call>` block of `text`, in order, as ToolCall or ParseError; a turn without
    the tag: its Llama 3.x bare call, if it opens like one (parse_bare_call).

    An empty list means the turn makes no call (the trajectory's final answer, for a tool
    environment). At most `max_calls` blocks are read; if more follow, one ParseError says so. A block
    longer than `max_chars` characters or nested deeper than `max_depth` is a ParseError.
    """
    out: list[ToolCall | ParseError] = []
    pos = text.find(OPEN_TAG)
    if pos < 0:
        return parse_bare_call(text, max_chars=max_chars, max_depth=max_depth)
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
        if len(body) > max_chars:  # not stripped or decoded: refused on its length alone
            out.append(ParseError(_cut(body.strip()), f"the block is longer than {max_chars} characters"))
        else:
            out.append(_to_call(body.strip(), body.strip(), max_chars, max_depth))
        pos = text.find(OPEN_TAG, end + len(CLOSE_TAG))
    return out


def has_tool_call(text: str) -> bool:
    """True if the text opens at least one tool-call block, or opens like a bare call (cheap; nothing is
    decoded)."""
    return OPEN_TAG in text or bool(BARE_OPEN.match(text))
