"""The tool calls of one model turn, as the environments read them: grpolab.util.tool_calls, the one parser
(Hermes/Qwen `<tool_call>{json}</tool_call>` blocks, Llama 3.x's bare `{"name": ..., "parameters": {...}}`
turn), which the `tool_call` reward reads with too (grpolab.rewards.tool_call). Its rules and bounds are in
that module's docstring.
"""

from __future__ import annotations

from grpolab.util.tool_calls import (
    BARE_FORMAT,
    BARE_OPEN,
    CLOSE_TAG,
    HERMES_FORMAT,
    MAX_BLOCK_CHARS,
    MAX_CALLS,
    MAX_DEPTH,
    MAX_INT_DIGITS,
    OPEN_TAG,
    RAW_KEEP_CHARS,
    ParseError,
    ToolCall,
    has_tool_call,
    parse_bare_call,
    parse_tool_calls,
)

__all__ = [
    "BARE_FORMAT",
    "BARE_OPEN",
    "CLOSE_TAG",
    "HERMES_FORMAT",
    "MAX_BLOCK_CHARS",
    "MAX_CALLS",
    "MAX_DEPTH",
    "MAX_INT_DIGITS",
    "OPEN_TAG",
    "RAW_KEEP_CHARS",
    "ParseError",
    "ToolCall",
    "has_tool_call",
    "parse_bare_call",
    "parse_tool_calls",
]
