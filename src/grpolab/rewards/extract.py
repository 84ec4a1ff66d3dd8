"""Answer extraction helpers shared by the verifiers.

Every function here runs in time linear in the input (no regex backtracking on nested
structures) and returns `None` when nothing usable is found. "Only the last answer counts"
is implemented here: each extractor looks at the last occurrence of its marker.
"""

from __future__ import annotations

import re
from fractions import Fraction

MAX_BRACE_DEPTH = 64  # deeper LaTeX nesting is treated as malformed (never parsed)

_BOX_MARKERS = ("\\boxed", "\\fbox")


def last_tag_content(text: str, tag: str) -> str | None:
    """Content of the last `<tag>...</tag>` block, stripped; None if there is none."""
    close = f"</{tag}>"
    end = text.rfind(close)
    if end < 0:
        return None
    start = text.rfind(f"<{tag}>", 0, end)
    if start < 0:
        return None
    return text[start + len(tag) + 2 : end].strip()


def _match_brace(text: str, open_idx: int) -> int | None:
    """Index of the `}` matching the `{` at open_idx (escaped `\\{`/`\\}` skipped), or None."""
    depth = 0
    i = open_idx
    n = len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2  # skip the escaped character (\{, \}, \\ ...)
            continue
        if c == "{":
            depth += 1
            if depth > MAX_BRACE_DEPTH:
                return None
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def find_boxes(text: str, limit: int = 64) -> list[tuple[int, int, str]] | None:
    """All `\\boxed{...}` / `\\fbox{...}` as (start, end, content), in order.

    Returns None if a box is malformed (unbalanced or nested deeper than MAX_BRACE_DEPTH) or if
    there are more than `limit` boxes: such text is not a clean answer.
    """
    boxes: list[tuple[int, int, str]] = []
    i = 0
    while True:
        starts = [p for p in (text.find(m, i) for m in _BOX_MARKERS) if p >= 0]
        if not starts:
            return boxes
        s = min(starts)
        marker = "\\boxed" if text.startswith("\\boxed", s) else "\\fbox"
        j = s + len(marker)
        while j < len(text) and text[j] == " ":
            j += 1
        if j >= len(text) or text[j] != "{":
            i = j  # "\boxed" without braces: not an answer box
            continue
        end = _match_brace(text, j)
        if end is None:
            return None
        boxes.append((s, end + 1, text[j + 1 : end].strip()))
        if len(boxes) > limit:
            return None
        i = end + 1


def last_boxed(text: str) -> str | None:
    """Content of the last box, or None (no box / malformed)."""
    boxes = find_boxes(text)
    if not boxes:
        return None
    return boxes[-1][2]


def gsm8k_answer(text: str) -> str | None:
    """The rest of the line after the last `####` marker (GSM8K's answer format)."""
    pos = text.rfind("####")
    if pos < 0:
        return None
    rest = text[pos + 4 :]
    line = rest.split("\n", 1)[0].strip()
    return line or None


# A number: optional sign (not when it follows a word or a closing bracket, as in "x-3"),
# then 1,234,567.89 style or plain digits with an optional decimal part, or .5
_NUMBER_RE = re.compile(
    r"(?<![\w)\]])-?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)(?![\d])"
)


def last_number(text: str) -> str | None:
    """The last number written anywhere in the text (lenient), commas removed."""
    last = None
    for m in _NUMBER_RE.finditer(text):
        last = m.group(0)
    if last is None:
        return None
    return last.replace(",", "")


_PLAIN_NUMBER_RE = re.compile(r"^[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?$")


def plain_number(text: str) -> Fraction | None:
    """Parse a plain decimal number ("72", "-3.5", "1,234", "$1,234.", "72.0") exactly, else None."""
    s = text.strip().strip("$").strip()
    if s.startswith("\\$"):
        s = s[2:].strip()
    if s.endswith("."):
        s = s[:-1]
    if not s or len(s) > 64 or not _PLAIN_NUMBER_RE.match(s) or not any(c.isdigit() for c in s):
        return None
    try:
        return Fraction(s.replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None


_CODE_BLOCK_RE = re.compile(r"```[ \t]*(python3?|py)[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_ANY_BLOCK_RE = re.compile(r"```[ \t]*\n(.*?)```", re.DOTALL)


def last_python_block(text: str, allow_untagged: bool = False) -> str | None:
    """The last fenced ```python (or ```py) code block; optionally an untagged ``` block."""
    last = None
    for m in _CODE_BLOCK_RE.finditer(text):
        last = m.group(2)
    if last is None and allow_untagged:
        for m in _ANY_BLOCK_RE.finditer(text):
            last = m.group(1)
    return last
