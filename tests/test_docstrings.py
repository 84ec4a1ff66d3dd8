"""Docstrings explain; docs measure. No docstring, comment or runtime message under src/grpolab holds a
date or a timing figure from a run: such numbers go stale with the next benchmark, and they live in
docs/results.md with the command that produces them (the dated history in docs/devlog.md). A docstring
says what the code does and why, and names the section of docs/performance.md that explains it.

The repository speaks of the project alone: no issue numbers, sessions or reviews of its development in
code, tests, scripts or docs, and no test docstring dated: a test says what it guards, not when it was
written.

What counts as text here: every comment (tokenize) and every string that stands alone as a statement
(ast: module, class and function docstrings, and the attribute docstrings under config fields).

What the patterns catch, and what they leave alone on purpose:

- a date: 2026-12-01, or a month with a year (December 2026, Dec. 1, 2026). A quoted date is an example
  value ("2024-03-01" in a tool's documented call), and YYYY-MM alone is a version (JSON Schema 2020-12).
- a timing: milliseconds or microseconds (58.5 ms, 0.7 ms/token), seconds with a fraction (0.078 s,
  4.10 s), seconds per unit (18 s per step, s/step), rates (301.6 tok/s, 219 GFLOP/s), a speed-up
  written x0.92 / x1.74, "3x faster" / "0.66x the time", "58.5 vs 88.5", and "took 25 s".
  Whole seconds that set a limit ("a timeout of 10 s", "at most 8 minutes") are settings, not
  measurements, and pass, as do equations ("2N(P+C)", "(3 x 64) x (64 x S)", "2^31-1"), shapes
  ("16 x 128"), hex and architecture names (0x7FFF0000, x86_64) and sizes ("256 MB", a setting here).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "grpolab"

_MONTHS = (
    "January|February|March|April|May|June|July|August|September|October|November|December"
    "|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec"
)
_NUM = r"\d+(?:\.\d+)?"

DATE = re.compile(
    r"(?<![\"'\w-])(?:19|20)\d\d-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])(?![\"'\w])"  # ISO, unquoted
    rf"|\b(?:{_MONTHS})\.?\s+(?:\d{{1,2}}(?:st|nd|rd|th)?,?\s+)?(?:19|20)\d\d\b"  # December 2026, Dec 1, 2026
    rf"|\b\d{{1,2}}\s+(?:{_MONTHS})\.?\s+(?:19|20)\d\d\b"
)  # 1 December 2026

TIMING = re.compile(
    rf"\b{_NUM}\s?(?:ms|µs|us|msec)\b"  # milliseconds, microseconds
    r"|\b\d+\.\d+\s?(?:s|sec|secs|seconds?)\b(?![-\w])"  # seconds with a fraction: 0.078 s
    rf"|\b{_NUM}\s?(?:s|sec|seconds?)\s?(?:per|/)\s?(?:step|token|tok|pass|round|update|rollout)\b"  # 18 s per step
    r"|\bs/(?:step|token|pass|round)\b"  # the unit alone: s/step
    rf"|\b{_NUM}\s?(?:tok|tokens|samples|G?FLOP|TFLOP|it)/s\b"  # rates
    r"|(?<![\w.])x\d+\.\d+\b"  # x0.92, x1.74
    rf"|\b{_NUM}\s?[x×]\s+(?:faster|slower|quicker|speed-?up|the\s+(?:time|throughput|speed))\b"
    rf"|\b{_NUM}\s?(?:ms|s)?\s+(?:vs\.?|versus)\s+{_NUM}\b"  # 58.5 vs 88.5
    rf"|\btook\s+(?:about\s+|~)?{_NUM}\s?(?:ms|s|sec|seconds?|min|minutes?)\b"
)


def offending(text: str) -> list[str]:
    """The dates and timing figures in one piece of text."""
    return [m.group(0) for pattern in (DATE, TIMING) for m in pattern.finditer(text)]


def texts_of(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and every string statement (docstrings) in one source file."""
    source = path.read_text()
    out = [
        (node.lineno, node.value.value)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    ]
    out += [
        (tok.start[0], tok.string)
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    ]
    return out


@pytest.mark.parametrize(
    "text",
    [
        "took 0.078 s fused against 0.276 s with torch's default",
        "58.5 vs 88.5 ms per token in bf16",
        "bf16 rollout x0.92 of fp32 that way, x0.70 with one context",
        "the whole step took 56.53 against 65.90 ms",
        "About 10x faster than torch.multinomial",
        "the lean step takes 0.66x the time of the HF forward",
        "about 20-23 s per step against 18 s per step",
        "median step 4.9 s/step, 301.6 tok/s, 219 GFLOP/s",
        "measured 2026-12-01 on the development machine",
        "Measured in December 2026 on a CPU",
        "Measured on Dec 1, 2026",
        "the GGUF dequantisation took about 25 s",
        "13.7-18.8 ms of each 16-row step",
        "a 16 x 127 x 576 multiply: 1.33 against 0.18 ms",
    ],
)
def test_pattern_catches_measurements(text):
    assert offending(text), text


@pytest.mark.parametrize(
    "text",
    [
        "a timeout of 10 s per call; at most 8 minutes per run",
        "generation ~ 2N(P+C)BG FLOPs, the update ~ 6N(P+C)BG",
        "48 tiny (3 x 64) x (64 x S) products per layer",
        "mallopt(M_TRIM_THRESHOLD, 2^31-1); mallopt(M_TOP_PAD, 64 MB)",
        "16 x 128 positions of SmolLM2 in bf16 take 201 MB (256 MB cap)",
        "_RET_ALLOW = 0x7FFF0000; seccomp on x86_64 and aarch64",
        'date_add {"date": "2024-02-27", "days": 3} -> "2024-03-01"',
        "JSON schema draft (default 2020-12)",
        "returns (B, L) float32; lr 1e-6; eps 1e-8; ratio 0.5",
        "keeps bf16 where it took at most 0.9x the fp32 time",
        "the session's flags; seconds per step are measured in docs/performance.md",
        "PPO costs 2x the memory of GRPO (16 B·P vs 32 B·P per parameter)",
        "measured in docs/performance.md, 'The lean decode step'",
    ],
)
def test_pattern_leaves_settings_and_equations(text):
    assert not offending(text), offending(text)


def test_no_dates_or_timings_in_docstrings_and_comments():
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for line, text in texts_of(path):
            for hit in offending(text):
                found.append(f"{path.relative_to(SRC.parents[1])}:{line}: {hit!r}")
    assert not found, (
        "dates or timing figures in docstrings or comments (move the number to "
        "docs/performance.md, next to its command, and point there):\n" + "\n".join(found)
    )


# A figure quoted as a range of ratios ("0.93-1.5x", "6-8x slower"), as a runtime message might.
RATIO_RANGE = re.compile(rf"\b{_NUM}\s?-\s?{_NUM}\s?[x×](?![\w])")
# How a development log speaks of itself.
MAKING = re.compile(
    r"\bissues? #?\d+|\b(?:this|that|next|earlier|previous) session\b|\bsession's\b"
    r"|\bsessions\b|\bthe review\b|\breview's\b|\bhelpers? (?:session|engineer)",
    re.I,
)


def strings_of(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every string constant in one source file that is not a docstring-like statement:
    messages, f-string parts, defaults."""
    tree = ast.parse(path.read_text())
    statements = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in statements
    ]


@pytest.mark.parametrize("text", ["vLLM measured 0.93-1.5x its tokens/s", "ran 6-8x slower"])
def test_ratio_ranges_are_caught(text):
    assert RATIO_RANGE.search(text)


@pytest.mark.parametrize(
    "text",
    ["see issue 30", "on this session's machine", "fixed in the review", "Issue 23: floats", "the next session's CPU"],
)
def test_development_history_is_caught(text):
    assert MAKING.search(text), text


@pytest.mark.parametrize(
    "text",
    [
        "a decode session holds the KV cache",
        "runs in a new session (setsid)",
        "scope='session'",
        "the chat session ends on /exit",
    ],
)
def test_sessions_of_the_code_pass(text):
    assert not MAKING.search(text), text


def test_no_measured_figure_in_runtime_messages():
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for line, text in strings_of(path):
            hits = [
                m.group(0)
                for pattern in (DATE, TIMING, RATIO_RANGE)
                for m in pattern.finditer(text)
                if any(c.isdigit() for c in m.group(0))
            ]  # a unit alone ("s/step") labels a column
            found += [f"{path.relative_to(ROOT)}:{line}: {hit!r}" for hit in hits]
    assert not found, (
        "measured figures in strings of the code (say it in docs/results.md and point to "
        "docs/performance.md):\n" + "\n".join(found)
    )


def test_the_repository_speaks_of_the_project_alone():
    files = [
        *SRC.rglob("*.py"),
        *(ROOT / "tests").glob("*.py"),
        *(ROOT / "benchmarks").glob("*.py"),
        *(ROOT / "benchmarks").glob("*.sh"),
        *(ROOT / "docs").glob("*.md"),
    ]
    found = []
    for path in sorted(files):
        if path.name == "test_docstrings.py":  # this file's examples
            continue
        for n, line in enumerate(path.read_text().splitlines(), start=1):
            found += [f"{path.relative_to(ROOT)}:{n}: {m.group(0)!r}" for m in MAKING.finditer(line)]
    assert not found, "the repository's own making, which no reader can look up:\n" + "\n".join(found)


def test_test_docstrings_are_not_dated():
    found = []
    for path in sorted((ROOT / "tests").glob("*.py")):
        if path.name == "test_docstrings.py":
            continue
        for line, text in texts_of(path):
            found += [f"{path.relative_to(ROOT)}:{line}: {m.group(0)!r}" for m in DATE.finditer(text)]
    assert not found, "a test's docstring says what it guards, not when:\n" + "\n".join(found)
