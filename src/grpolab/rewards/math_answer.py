"""The `math` reward: extract the final answer, compare it to the reference with math-verify.

What is exact and what is symbolic (docs/rewards.md):

- both answers plain rationals (grpolab.rewards.extract.plain_rational: a decimal "3.0000001", "1,234",
  a fraction "3/4", "\\frac{1}{2}"): compared exactly in-process as fractions.Fraction, no sympy, no
  rounding: 3.0000001 != 3.0, 0.333333 != 1/3, 0.5 == \\frac{1}{2}.
- otherwise math-verify decides, in a worker process. When what it parses on both sides is one
  number each (units stripped: "7 cm" is 7), the worker compares them exactly too (a float by its
  decimal digits); only answers that are expressions, sets, equations or intervals are compared
  symbolically by math-verify, whose numeric comparison rounds floats inside them to 6 decimals.

Time is bounded by construction. Everything that is not a pair of plain rationals goes to a pool of
math-verify worker *processes* (grpolab.rewards._math_worker);
a comparison that runs past its budget gets its worker killed and raises `RewardTimeout`, which
`score_completions` counts as a timeout and scores 0. This works from any thread: math-verify's
own signal.alarm timeouts are only used inside the worker, where they run in the main thread.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import re
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

from grpolab.batch import Example
from grpolab.rewards.extract import (
    find_boxes,
    gsm8k_answer,
    last_number,
    last_tag_content,
    plain_number,
    plain_rational,
)
from grpolab.util.fields import ConfigError
from grpolab.util.procs import kill_process_group
from grpolab.util.threads import SINGLE_THREAD_ENV

EXTRACT_MODES = ("answer_tag", "boxed", "gsm8k", "last_number", "auto")
_HEDGE_RE = re.compile(r"(?i)(\bor\b|\\lor\b|\\vee\b|\\text\{\s*or\s*\}|\beither\b)")
_WORKER_START_TIMEOUT_S = 60.0


class RewardTimeout(TimeoutError):
    """A verifier ran past its time budget (counted in `reward/timeouts`)."""


# ----------------------------------------------------------------------------- worker pool


class _Worker:
    """One math-verify subprocess speaking JSON lines."""

    def __init__(self) -> None:
        env = dict(os.environ)
        src_root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = src_root + os.pathsep + env.get("PYTHONPATH", "")
        for k, v in SINGLE_THREAD_ENV.items():  # one compute thread beside the trainer (grpolab.util.threads)
            env.setdefault(k, v)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "grpolab.rewards._math_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
        self._buf = b""
        self._next_id = 0
        ready = self._read_line(time.monotonic() + _WORKER_START_TIMEOUT_S)
        if ready is None or not json.loads(ready).get("ready"):
            self.kill()
            raise RuntimeError("math-verify worker failed to start (is math-verify installed?)")

    def _read_line(self, deadline: float) -> bytes | None:
        """Read one line from the worker before `deadline`; None on timeout or EOF."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            r, _, _ = select.select([fd], [], [], left)
            if not r:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line

    def verify(self, pred: str, gold: str, timeout_s: float, units: bool) -> bool:
        """Ask the worker; raise RewardTimeout (and die) if it does not answer in time."""
        self._next_id += 1
        rid = self._next_id
        req = {"id": rid, "pred": pred, "gold": gold, "timeout": max(1, int(timeout_s)), "units": units}
        try:
            self.proc.stdin.write((json.dumps(req) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            self.kill()
            raise RuntimeError(f"math-verify worker died: {e}") from e
        line = self._read_line(time.monotonic() + timeout_s)
        if line is None:
            self.kill()
            raise RewardTimeout(f"math-verify took longer than {timeout_s:.1f}s")
        msg = json.loads(line)
        if msg.get("id") != rid:
            self.kill()
            raise RuntimeError("math-verify worker protocol error")
        if "error" in msg:
            return False  # unparsable / too large for sympy: not a correct answer
        return bool(msg["ok"])

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """Kill the worker's whole process group and reap it."""
        kill_process_group(self.proc)
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass


class _WorkerPool:
    """A bounded, thread-safe pool of math-verify workers, started lazily."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._idle: queue.LifoQueue[_Worker] = queue.LifoQueue()
        self._lock = threading.Lock()
        self._count = 0
        self._all: list[_Worker] = []

    def _checkout(self) -> _Worker:
        """An idle worker, a new one if the pool is not full, else wait for one."""
        while True:
            try:
                return self._idle.get_nowait()
            except queue.Empty:
                pass
            with self._lock:
                start = self._count < self.size
                if start:
                    self._count += 1
            if start:
                try:
                    w = _Worker()
                except BaseException:
                    with self._lock:
                        self._count -= 1
                    raise
                with self._lock:
                    self._all.append(w)
                return w
            try:
                return self._idle.get(timeout=0.05)
            except queue.Empty:
                continue  # a busy worker may have died: re-check whether we may start one

    def _release(self, w: _Worker) -> None:
        if w.alive():
            self._idle.put(w)
        else:
            with self._lock:
                self._count -= 1
                if w in self._all:
                    self._all.remove(w)

    def verify(self, pred: str, gold: str, timeout_s: float, units: bool) -> bool:
        w = self._checkout()
        try:
            return w.verify(pred, gold, timeout_s, units)
        finally:
            self._release(w)

    def close(self) -> None:
        """Kill every worker (registered with atexit)."""
        with self._lock:
            workers, self._all = list(self._all), []
        for w in workers:
            w.kill()


_POOL = _WorkerPool(size=max(1, min(4, os.cpu_count() or 1)))
atexit.register(_POOL.close)


def shutdown_workers() -> None:
    """Stop all math-verify workers (they restart on the next call)."""
    _POOL.close()
    with _POOL._lock:
        _POOL._count = 0
        while not _POOL._idle.empty():
            _POOL._idle.get_nowait()


# ----------------------------------------------------------------------------- extraction


def extract_answer(completion: str, mode: str, answer_tag: str = "answer") -> str | None:
    """The final answer string under `mode` (see EXTRACT_MODES), or None if there is none.

    answer_tag: the last <answer>..</answer>; a single box inside it is unwrapped.
    boxed: the content of the last \\boxed{..}.  gsm8k: the text after the last `####`.
    auto: answer_tag, else boxed, else gsm8k.  last_number: the last number anywhere (lenient).
    Returns "" (scores 0) for hedged answers: several different boxes in the final answer.
    """
    if mode == "last_number":
        return last_number(completion)
    if mode in ("answer_tag", "auto"):
        ans = last_tag_content(completion, answer_tag)
        if ans is not None:
            return _unbox_single(ans)
        if mode == "answer_tag":
            return None
    if mode in ("boxed", "auto"):
        boxes = find_boxes(completion)
        if boxes is None:
            return ""  # malformed or box spam
        if boxes:
            return _last_box_unless_hedged(completion, boxes)
        if mode == "boxed":
            return None
    return gsm8k_answer(completion)


def _unbox_single(ans: str) -> str:
    """Inside an answer tag: one box (or identical repeats) -> its content; different boxes -> ''."""
    boxes = find_boxes(ans)
    if boxes is None:
        return ""
    contents = {b[2] for b in boxes}
    if len(contents) > 1:
        return ""
    if len(contents) == 1:
        return contents.pop()
    return ans


def _last_box_unless_hedged(text: str, boxes: list[tuple[int, int, str]]) -> str:
    """The last box, or '' if its paragraph (its final answer) holds a different box too."""
    start, _, content = boxes[-1]
    para_start = text.rfind("\n\n", 0, start)
    for s, _, c in boxes[:-1]:
        if s > para_start and c != content:
            return ""
    return content


def is_hedged(ans: str, gold: str) -> bool:
    """True for answers that list alternatives ("3 or 5") when the reference does not."""
    return bool(_HEDGE_RE.search(ans)) and not _HEDGE_RE.search(gold)


_BIG_EXPONENT_RE = re.compile(r"(\^|\*\*)\s*\{?\s*\(?\s*\d{7,}")


def _explosive(s: str) -> bool:
    """Cheap pre-filter for sympy bombs: power towers (a^{b^c}, a**b**c) and huge exponents.

    Only a shortcut: the worker's hard timeout is what bounds time on anything it misses.
    """
    if _BIG_EXPONENT_RE.search(s):
        return True
    if re.search(r"\*\*\s*\(?\s*[\w.]+\s*\)?\s*\*\*", s):
        return True
    i = s.find("^")
    while i >= 0:
        j = i + 1
        while j < len(s) and s[j] == " ":
            j += 1
        if j < len(s) and s[j] == "{":
            depth, k = 0, j
            while k < len(s):
                if s[k] == "{":
                    depth += 1
                elif s[k] == "}":
                    depth -= 1
                    if depth == 0:
                        break
                elif s[k] == "^":
                    return True
                k += 1
        elif j < len(s) and s[j:].lstrip("0123456789 ").startswith("^"):
            return True  # 9^9^9
        i = s.find("^", i + 1)
    return False


MAX_ANSWER_DEPTH = 8  # latex2sympy is exponential in nesting depth: 15 levels already take seconds


def _too_deep(s: str) -> bool:
    """True if brackets nest deeper than MAX_ANSWER_DEPTH (no real final answer does)."""
    depth = 0
    for c in s:
        if c in "{([":
            depth += 1
            if depth > MAX_ANSWER_DEPTH:
                return True
        elif c in "})]":
            depth -= 1
    return False


# ----------------------------------------------------------------------------- the reward


def math_score(
    completion: str,
    gold: str,
    *,
    extract: str = "auto",
    answer_tag: str = "answer",
    timeout_s: float = 4.0,
    max_answer_chars: int = 1000,
    max_chars: int = 100_000,
    units: bool = True,
) -> float:
    """1.0 if the final answer of `completion` equals `gold`, else 0.0 (see make_math)."""
    if len(completion) > max_chars:
        completion = completion[-max_chars:]  # the final answer is at the end
    if "####" in gold:
        gold = gsm8k_answer(gold) or gold
    gold = gold.strip()
    if extract == "last_number":
        return _last_number_score(completion, gold)
    ans = extract_answer(completion, extract, answer_tag)
    if not ans or not ans.strip() or len(ans) > max_answer_chars or _too_deep(ans):
        return 0.0
    if is_hedged(ans, gold):
        return 0.0
    if _explosive(ans) and not _explosive(gold):
        return 0.0
    a, g = plain_rational(ans), plain_rational(gold)
    if a is not None and g is not None:  # exact, as rationals (module docstring)
        return 1.0 if a == g else 0.0
    return 1.0 if _POOL.verify(ans, gold, timeout_s, units) else 0.0


def math_answer_found(
    completion: str,
    *,
    extract: str = "auto",
    answer_tag: str = "answer",
    max_answer_chars: int = 1000,
    max_chars: int = 100_000,
) -> bool:
    """Whether `completion` holds an answer math_score can compare: the extracted answer (last_number: a
    number) is non-empty, not hedged with several boxes, at most max_answer_chars long and not nested
    past MAX_ANSWER_DEPTH. False is "no parsable answer" in the evaluation's extraction report; a
    completion with an answer that scores 0 is "wrong"."""
    if len(completion) > max_chars:
        completion = completion[-max_chars:]
    ans = extract_answer(completion, extract, answer_tag)
    if extract == "last_number":
        return ans is not None and plain_number(ans) is not None
    return bool(ans and ans.strip()) and len(ans) <= max_answer_chars and not _too_deep(ans)


def _last_number_score(completion: str, gold: str) -> float:
    """Lenient mode: the last number anywhere in the completion, compared numerically."""
    g = plain_number(gold)
    if g is None:
        raise ValueError(f"math(extract=last_number) needs a numeric reference answer, got {gold[:50]!r}")
    num = last_number(completion)
    if num is None:
        return 0.0
    a = plain_number(num)
    return 1.0 if a is not None and a == g else 0.0


def make_math(
    extract: str = "auto",
    answer_tag: str = "answer",
    timeout_s: float = 4.0,
    max_answer_chars: int = 1000,
    max_chars: int = 100_000,
    units: bool = True,
):
    """Build the `math` reward function (1.0 for an equivalent final answer, else 0.0).

    extract: where the answer is read from, one of EXTRACT_MODES (default "auto": <answer> tag,
        else the last \\boxed{}, else GSM8K's `####`). "last_number" is deliberately lenient.
    answer_tag: tag name for the answer block.  timeout_s: hard budget per comparison.
    max_answer_chars: longer extracted answers score 0.  max_chars: only the last max_chars of a
    completion are read.  units: let math-verify strip units ("7 cm" == "7").
    """
    if extract not in EXTRACT_MODES:
        raise ConfigError(f"math: extract must be one of {', '.join(EXTRACT_MODES)}, got {extract!r}")
    if not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
        raise ConfigError(f"math: timeout_s must be a positive number, got {timeout_s!r}")
    for key, val in (("max_answer_chars", max_answer_chars), ("max_chars", max_chars)):
        if not (isinstance(val, int) and val > 0):
            raise ConfigError(f"math: {key} must be a positive integer, got {val!r}")
    if not (isinstance(answer_tag, str) and re.fullmatch(r"[A-Za-z_][\w\-]*", answer_tag)):
        raise ConfigError(f"math: answer_tag must be a tag name, got {answer_tag!r}")

    def math_reward(completion: str, example: Example) -> float:
        return math_score(
            completion,
            example.answer,
            extract=extract,
            answer_tag=answer_tag,
            timeout_s=float(timeout_s),
            max_answer_chars=max_answer_chars,
            max_chars=max_chars,
            units=bool(units),
        )

    def answer_found(completion: str, example: Example) -> bool:
        return math_answer_found(
            completion, extract=extract, answer_tag=answer_tag, max_answer_chars=max_answer_chars, max_chars=max_chars
        )

    math_reward.max_concurrency = _POOL.size  # type: ignore[attr-defined]
    math_reward.answer_found = answer_found  # type: ignore[attr-defined]  (the extraction report)
    return math_reward
