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
_NUMBER_RE = re.compile(r"(?<![\w)\]])-?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)(?![\d])")


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


_FRAC_RE = re.compile(r"^\\[dt]?frac\s*(?:\{([^{}]*)\}|(\d))\s*(?:\{([^{}]*)\}|(\d))$")


def plain_rational(text: str) -> Fraction | None:
    """Parse a plain decimal or a plain fraction exactly, else None.

    Accepted: what plain_number accepts; `a/b` with a and b plain numbers ("3/4", "-1.5/2"); LaTeX
    `\\frac{a}{b}` (also `\\dfrac`, `\\tfrac`, `\\frac12`), optionally signed, with plain numbers
    inside the braces; any of them inside `$...$`. A zero denominator is not a number (None).
    Values are exact: `Fraction("3.0000001")` is 30000001/10000000, not 3.
    """
    value = plain_number(text)
    if value is not None:
        return value
    s = text.strip()
    for a, b in (("$$", "$$"), ("$", "$"), ("\\(", "\\)")):
        if len(s) > len(a) + len(b) and s.startswith(a) and s.endswith(b):
            s = s[len(a) : -len(b)].strip()
            break
    if not s or len(s) > 140:
        return None
    sign = 1
    if s[0] in "+-":
        sign, s = (-1 if s[0] == "-" else 1), s[1:].strip()
    m = _FRAC_RE.match(s)
    if m:
        num, den = (
            m.group(1) if m.group(1) is not None else m.group(2),
            m.group(3) if m.group(3) is not None else m.group(4),
        )
    elif s.count("/") == 1:
        num, den = s.split("/")
    else:
        return None
    if num.strip()[:1] in ("+", "-") or den.strip()[:1] in ("+", "-"):
        return None  # one sign, in front: "-3/4", not "--3/4" or "3/-4"
    n, d = plain_number(num), plain_number(den)
    if n is None or d is None or d == 0:
        return None
    return sign * n / d


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
