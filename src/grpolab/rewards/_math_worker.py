"""A math-verify worker process: reads JSON requests on stdin, writes JSON answers on stdout.

Runs as `python -m grpolab.rewards._math_worker`. It lives in its own process so that the parent can
kill it when a comparison runs past its budget (sympy evaluating `9^{9^{9^9}}` never returns and
cannot be interrupted from another thread). Inside this process math-verify runs in the main
thread, so its own signal.alarm timeouts work as a first, soft layer.

When both sides parse to a single number each (after math-verify's normalisation, units stripped;
a product, a quotient or scientific notation without symbols is evaluated first), the numbers are
compared exactly (`exact_value`: a float by its decimal digits), not by math-verify's numeric
comparison, which rounds floats to 6 decimals (3.0000001 would equal 3.0). Sets, tuples, intervals
and `x = value` whose numbers are all exact must have exactly the same numbers; math-verify then
judges their structure.

Request:  {"id": int, "pred": str, "gold": str, "timeout": int, "units": bool}
Answer:   {"id": int, "ok": bool} or {"id": int, "error": str}
"""

from __future__ import annotations

import json
import logging
import resource
import sys
import warnings
from functools import lru_cache

MEMORY_LIMIT_BYTES = 2 * 1024**3


def _wrap(s: str) -> str:
    """Put an answer string in a box so math-verify parses it as one LaTeX expression."""
    s = s.strip()
    for a, b in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if len(s) >= len(a) + len(b) and s.startswith(a) and s.endswith(b):
            s = s[len(a) : len(s) - len(b)].strip()
            break
    return "\\boxed{" + s + "}"


def _exact_scalar(v):
    """`v` as an exact sympy Rational if it is one finite number, else None.

    A Float counts by the decimal digits it was written with (`Rational(str(f))`); an expression
    without free symbols (`3.0000001 \\cdot 1`, `1.6 \\times 10^{-19}`, `\\frac{3}{4} \\cdot 2`) is
    evaluated with every Float replaced by that exact rational first, so a product or scientific
    notation is compared as exactly as the plain number (math-verify's numeric comparison rounds
    floats to 6 decimals). Irrational values (`\\pi`, `\\sqrt{2}`) are not numbers here: None.
    """
    from sympy import Basic, Float, Number, Rational

    if not isinstance(v, Basic) or v.free_symbols:
        return None
    if isinstance(v, Float):
        return Rational(str(v)) if v.is_finite else None
    if isinstance(v, Number):
        return Rational(v) if v.is_finite else None
    floats = v.atoms(Float)
    if any(not f.is_finite for f in floats):
        return None
    try:
        w = v.xreplace({f: Rational(str(f)) for f in floats}).doit()
    except (ArithmeticError, TypeError, ValueError):
        return None
    if isinstance(w, Float):
        return Rational(str(w)) if w.is_finite else None
    if isinstance(w, Number) and w.is_finite and w.is_Rational:
        return Rational(w)
    return None


DIGITS = 60
"""Significant digits an irrational value is evaluated to before it is compared with an exact number."""
CLOSE = 10 ** -(DIGITS - 15)
"""Relative distance under which such a value equals the number: only evaluation error is left there (an
expression that is rational but that sympy leaves unsimplified, such as \\log(8)/\\log(2) against 3)."""


def _irrational_value(v):
    """`v` (no free symbols, not an exact rational: `3 + 10^{-7}\\sqrt{2}`, `\\pi \\times 10^{-30}`) evaluated
    to DIGITS significant digits, as a sympy Float; None where it is not one finite real number."""
    from sympy import Basic, Float

    if not isinstance(v, Basic) or v.free_symbols:
        return None
    try:
        x = v.evalf(DIGITS)
    except (ArithmeticError, TypeError, ValueError, AttributeError):
        return None
    if isinstance(x, Float) and x.is_finite:
        return x
    return None


def irrational_equals(x, r) -> bool:
    """Whether an evaluated irrational x equals the exact number r: |x - r| <= CLOSE * max(|x|, |r|), at the
    precision the digits need (DIGITS significant digits whatever the magnitude, so `\\pi \\times 10^{-30}`
    is told from `6.6 \\times 10^{-34}` and `3 + 10^{-7}\\sqrt{2}` from `3.0`; math-verify's own numeric
    comparison rounds to 6 decimals and called both pairs equal)."""
    from sympy import Abs, Float, Max, Rational

    xr = Rational(x)  # the Float's exact binary value
    return bool(Abs(xr - r) <= Rational(Float(CLOSE, DIGITS)) * Max(Abs(xr), Abs(r)))


def exact_value(parsed):
    """What math-verify parsed first, as exact numbers: ("num", Rational) for one number,
    ("seq", [Rational, ...]) for a tuple or an interval's ends, ("set", [...]) for a set;
    ("eq", ...) wraps the right side of `symbol = value`. None if anything in it is not an exact
    number (then math-verify alone decides)."""
    from sympy import Eq, FiniteSet, Interval, Symbol, Tuple

    if not parsed:
        return None
    v = parsed[0]
    if isinstance(v, Eq) and isinstance(v.lhs, Symbol):
        inner = exact_value([v.rhs])
        return ("eq", inner) if inner is not None else None
    if isinstance(v, (FiniteSet, Tuple, Interval)):
        items = [v.start, v.end] if isinstance(v, Interval) else list(v.args)
        nums = [_exact_scalar(x) for x in items]
        if not nums or any(x is None for x in nums):
            return None
        return ("set" if isinstance(v, FiniteSet) else "seq", nums)
    x = _exact_scalar(v)
    if x is not None:
        return ("num", x)
    y = _irrational_value(v)
    return None if y is None else ("irr", y)


def exact_decision(gold, pred):
    """Compare two exact values (exact_value): True/False when the numbers decide alone (a number
    against a number), False when their numbers differ, None when the numbers agree but the
    structure (a set against a tuple, an interval's open ends, `x = 3` against `3`) is
    math-verify's to judge."""
    if gold is None or pred is None:
        return None
    plain = gold[0] == pred[0] == "num"
    g, p = gold, pred
    while g[0] == "eq":
        g = g[1]
    while p[0] == "eq":
        p = p[1]
    if "irr" in (g[0], p[0]):  # an irrational value: decided against an exact number, else math-verify's
        if {g[0], p[0]} != {"irr", "num"}:
            return None
        x, r = (g[1], p[1]) if g[0] == "irr" else (p[1], g[1])
        if not irrational_equals(x, r):
            return False
        return True if "eq" not in (gold[0], pred[0]) else None  # `x = value`: its structure is math-verify's
    gn = [g[1]] if g[0] == "num" else g[1]
    pn = [p[1]] if p[0] == "num" else p[1]
    if "set" in (g[0], p[0]):
        same = set(gn) == set(pn)
    else:
        same = gn == pn
    if plain or not same:
        return same
    return None


def main() -> None:
    """Serve requests until stdin closes."""
    try:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))
    except (ValueError, OSError):
        pass
    warnings.filterwarnings("ignore")
    logging.disable(logging.CRITICAL)
    from math_verify import LatexExtractionConfig, parse, verify
    from math_verify.parser import NormalizationConfig

    def configs(units: bool):
        norm = NormalizationConfig(
            basic_latex=True, units=units, malformed_operators=True, nits=True, boxed="all", equations=False
        )
        return [LatexExtractionConfig(normalization_config=norm, boxed_match_priority=0)]

    @lru_cache(maxsize=4096)
    def parse_gold(gold: str, units: bool, timeout: int):
        return parse(
            _wrap(gold), extraction_config=configs(units), parsing_timeout=timeout, extraction_mode="first_match"
        )

    out = sys.stdout
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        rid = None
        try:
            req = json.loads(line)
            rid = req["id"]
            t = max(1, int(req.get("timeout", 2)))
            units = bool(req.get("units", True))
            gold = parse_gold(req["gold"], units, t)
            pred = parse(
                _wrap(req["pred"]), extraction_config=configs(units), parsing_timeout=t, extraction_mode="first_match"
            )
            decided = exact_decision(exact_value(gold), exact_value(pred))
            if decided is not None:
                ok = decided
            else:
                ok = bool(gold) and bool(pred) and bool(verify(gold, pred, timeout_seconds=t))
            msg = {"id": rid, "ok": ok}
        except BaseException as e:  # noqa: BLE001 - any failure is an answer, not a crash
            msg = {"id": rid, "error": f"{type(e).__name__}: {str(e)[:200]}"}
        out.write(json.dumps(msg) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
