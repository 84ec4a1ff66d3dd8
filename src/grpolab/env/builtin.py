"""Built-in environments, by name in ENVIRONMENTS (what load_environment("<name>") finds).

- `retry_arithmetic`: the model answers an arithmetic question; a wrong final answer gets "That is
  not right. Try again." and another turn. Reward 1 when right on the first turn, `step_penalty`
  less for each extra turn (never below 0), 0 if never right. A small model that is right some of
  the time can learn to use the feedback. Fields: `answer` (the exact expected number).
- `guess_number`: find an integer in [lo, hi]; each guess gets "Higher.", "Lower." or "Correct!".
  Reward 1 when found on the first turn, `step_penalty` less per extra turn (at least
  `min_found_reward` when found), 0 if never found. Fields: `secret`, `lo`, `hi`.
- `calculator_python`: tools for tool-integrated reasoning on maths, written in TRL's
  environment_factory form: `calculator(expression)` (exact, safe: grpolab.rewards.tools) and
  `python(code)` (runs the program in grpolab's sandbox, returns what it printed). No reward of its
  own: the task's verifier scores the final answer.

A model's final answer is the content of its last <answer>...</answer> if there is one, else the
last number of its turn (grpolab.rewards.extract), compared exactly (as fractions).
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from grpolab.env.base import EnvConfigError, Reply
from grpolab.env.budget import call_deadline, note_event
from grpolab.env.runner import cut

MAX_CODE_CHARS = 20_000
"""Longest program the python tool runs."""


def final_answer(text: str) -> Fraction | None:
    """The number a turn answers with: the last <answer> block's number, else the turn's last number."""
    from grpolab.rewards.extract import last_number, last_tag_content, plain_number

    content = last_tag_content(text, "answer")
    scope = text if content is None else content
    value = plain_number(scope) if content is not None else None
    if value is None:
        last = last_number(scope)
        value = plain_number(last) if last is not None else None
    return value


def _exact(value: Any, env: str, field: str) -> Fraction:
    """A field's value as an exact number, or a configuration error naming the field."""
    if isinstance(value, bool):
        raise EnvConfigError(f"{env}: field {field!r} must be a number, got {value!r}")
    if isinstance(value, (int, Fraction)):
        return Fraction(value)
    if isinstance(value, float):
        return Fraction(repr(value))
    if isinstance(value, str):
        from grpolab.rewards.extract import plain_number

        parsed = plain_number(value)
        if parsed is None:
            try:
                parsed = Fraction(value.strip())
            except (ValueError, ZeroDivisionError):
                parsed = None
        if parsed is not None:
            return parsed
    raise EnvConfigError(f"{env}: field {field!r} must be a number, got {value!r}")


def _field(fields: dict, name: str, env: str) -> Any:
    """fields[name], or a configuration error listing the fields the example has."""
    if name not in fields:
        raise EnvConfigError(
            f"{env}: the example has no field {name!r} (it has: {', '.join(sorted(fields)) or 'none'})"
        )
    return fields[name]


class RetryArithmetic:
    """Answer, hear "not right", try again; the reward falls with each extra turn (see the module)."""

    def __init__(self, step_penalty: float = 0.25, feedback: str = "That is not right. Try again.") -> None:
        self.tools: list[dict] = []
        self.step_penalty = float(step_penalty)
        self.feedback = feedback
        self.expected: Fraction | None = None
        self.turns = 0
        self.solved_at: int | None = None

    def reset(self, fields: dict) -> str | None:
        """Read the expected answer; nothing is added to the prompt."""
        self.expected = _exact(_field(fields, "answer", "retry_arithmetic"), "retry_arithmetic", "answer")
        self.turns, self.solved_at = 0, None
        return None

    def step(self, turn_text: str) -> Reply:
        """Right: the trajectory ends. Wrong or no number: the feedback, and another turn."""
        if self.solved_at is not None:
            return Reply(done=True)
        self.turns += 1
        if final_answer(turn_text) == self.expected:
            self.solved_at = self.turns
            return Reply(done=True)
        return Reply([{"role": "user", "content": self.feedback}], done=False)

    def reward(self) -> float | None:
        """1 on the first turn, step_penalty less per extra turn (floor 0); 0 if never right."""
        if self.solved_at is None:
            return 0.0
        return max(0.0, 1.0 - self.step_penalty * (self.solved_at - 1))


class GuessNumber:
    """Guess the secret integer in [lo, hi] with higher/lower hints (see the module)."""

    def __init__(self, step_penalty: float = 0.1, min_found_reward: float = 0.1) -> None:
        self.tools: list[dict] = []
        self.step_penalty = float(step_penalty)
        self.min_found_reward = float(min_found_reward)
        self.secret = self.lo = self.hi = 0
        self.turns = 0
        self.found_at: int | None = None

    def reset(self, fields: dict) -> str | None:
        """Read secret, lo and hi (integers, lo <= secret <= hi)."""
        vals = {k: _exact(_field(fields, k, "guess_number"), "guess_number", k) for k in ("secret", "lo", "hi")}
        if any(v.denominator != 1 for v in vals.values()) or not vals["lo"] <= vals["secret"] <= vals["hi"]:
            raise EnvConfigError(f"guess_number: need integers lo <= secret <= hi, got {fields!r}"[:300])
        self.secret, self.lo, self.hi = (int(vals[k]) for k in ("secret", "lo", "hi"))
        self.turns, self.found_at = 0, None
        return None

    def step(self, turn_text: str) -> Reply:
        """ "Higher." / "Lower." / "Correct!" (which ends the trajectory), or how to answer."""
        if self.found_at is not None:
            return Reply(done=True)
        self.turns += 1
        guess = final_answer(turn_text)
        if guess is None or guess.denominator != 1:
            hint = f"Answer with one whole number between {self.lo} and {self.hi}."
        elif not self.lo <= guess <= self.hi:
            hint = f"The number is between {self.lo} and {self.hi}."
        elif guess < self.secret:
            hint = "Higher."
        elif guess > self.secret:
            hint = "Lower."
        else:
            self.found_at = self.turns
            return Reply([{"role": "user", "content": "Correct!"}], done=True)
        return Reply([{"role": "user", "content": hint}], done=False)

    def reward(self) -> float | None:
        """1 on the first turn, step_penalty less per extra turn (floor min_found_reward); 0 if not found."""
        if self.found_at is None:
            return 0.0
        return max(self.min_found_reward, 1.0 - self.step_penalty * (self.found_at - 1))


_DONE_FN = "_grpolab_env_program_done"


def run_python(
    code: str, *, timeout_s: float = 5.0, max_output_chars: int = 2000, isolation: str = "best_effort"
) -> str:
    """Run a program in grpolab's sandbox; what it printed, then its error if it failed.

    The sandbox runs code against tests; here one trivial test (a function the setup defines)
    makes it load the program, which is all we want: its stdout, and the exception that stopped
    it (the sandbox's load_error). The sandbox's limits and isolation apply (docs/security.md).

    Inside a tool call (grpolab.env.budget) the run waits for a sandbox slot, and runs, only until the
    call's deadline, and counts its own events: `timeout` when the program ran past timeout_s,
    `truncated` when its output was cut, `budget` when no slot was free before the deadline or the
    program was stopped at it (the runner, waiting for the same deadline, usually reports that first).
    """
    from grpolab.sandbox import SandboxConfig, TestCase, run_tests

    if len(code) > MAX_CODE_CHARS:
        return f"Error: the program is longer than {MAX_CODE_CHARS} characters."
    cfg = SandboxConfig(timeout_s=timeout_s, isolation=isolation, max_output_bytes=max(4 * max_output_chars, 4096))
    result = run_tests(
        code,
        [TestCase("call", fn=_DONE_FN)],
        cfg,
        setup=f"def {_DONE_FN}():\n    return None\n",
        deadline=call_deadline(),
    )
    if result.no_slot:
        note_event("budget")
        return "Error: no sandbox slot became free in time; the program was not run."
    parts = []
    if result.stdout.strip():
        text, removed = cut(result.stdout.rstrip("\n"), max_output_chars)
        parts.append(text)
        if removed:
            note_event("truncated")
    if result.timed_out and result.wall_s < timeout_s:  # stopped at the call's deadline, before its own limit
        note_event("budget")
        parts.append("Error: the program was stopped: the tool-time budget is spent.")
    elif result.timed_out:
        note_event("timeout")
        parts.append(f"Error: the program ran longer than {timeout_s:g} s and was stopped.")
    elif result.load_error:
        parts.append(f"Error: {result.load_error}")
        if result.stderr.strip():
            parts.append("stderr: " + cut(result.stderr.strip()[-1000:], 500)[0])
    if not parts:
        return "(the program printed nothing; use print() to show a value)"
    return "\n".join(parts)


class CalculatorPython:
    """A calculator and a Python interpreter, as tools (TRL's environment_factory form)."""

    def __init__(self, timeout_s: float = 5.0, max_output_chars: int = 2000, isolation: str = "best_effort") -> None:
        """isolation: the sandbox's (docs/security.md): best_effort runs the model's programs with what the
        machine allows; require refuses, here, where the sandbox cannot isolate them (EnvConfigError: the
        run is refused before training)."""
        from grpolab.sandbox import SandboxUnavailable, check_isolation
        from grpolab.sandbox.limits import ISOLATION_MODES

        if isolation not in ISOLATION_MODES:
            raise EnvConfigError(
                f"calculator_python: env.options.isolation must be one of {', '.join(ISOLATION_MODES)}, "
                f"got {isolation!r}"
            )
        if isolation == "require":
            try:
                check_isolation(isolation)
            except SandboxUnavailable as e:
                raise EnvConfigError(f"calculator_python: env.options.isolation=require: {e}") from None
        self._timeout_s = timeout_s
        self._max_output_chars = max_output_chars
        self._isolation = isolation

    def reset(self, **kwargs) -> None:
        """Nothing to reset: the tools keep no state between calls."""
        return

    def calculator(self, expression: str) -> str:
        """Evaluate an arithmetic expression exactly.

        Args:
            expression: Numbers with + - * / ** and parentheses, for example "2 * (3 + 4.5) / 5".

        Returns:
            The value of the expression.
        """
        from grpolab.rewards.tools import calculator

        return str(calculator(expression))

    def python(self, code: str) -> str:
        """Run a Python program and return what it prints.

        Args:
            code: A complete Python program; print() the values you want to see.

        Returns:
            The program's output, and its error if it failed.
        """
        return run_python(
            code, timeout_s=self._timeout_s, max_output_chars=self._max_output_chars, isolation=self._isolation
        )

    python.timeout_s = 120.0  # type: ignore[attr-defined]  # waits for a sandbox slot, then runs (its own limit)


ENVIRONMENTS: dict[str, type] = {
    "retry_arithmetic": RetryArithmetic,
    "guess_number": GuessNumber,
    "calculator_python": CalculatorPython,
}
