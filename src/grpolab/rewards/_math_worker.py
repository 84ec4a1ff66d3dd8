"""A math-verify worker process: reads JSON requests on stdin, writes JSON answers on stdout.

Runs as `python -m grpolab.rewards._math_worker`. It lives in its own process so that the parent can
kill it when a comparison runs past its budget (sympy evaluating `9^{9^{9^9}}` never returns and
cannot be interrupted from another thread). Inside this process math-verify runs in the main
thread, so its own signal.alarm timeouts work as a first, soft layer.

When both sides parse to a single number each (after math-verify's normalisation, units stripped), the
numbers are compared exactly (`exact_number`: a float by its decimal digits), not by math-verify's
numeric comparison, which rounds floats to 6 decimals (3.0000001 would equal 3.0).

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


def exact_number(parsed):
    """The first value math-verify parsed, as an exact sympy Rational if it is one finite number (a Float by
    the decimal digits it was written with), else None."""
    from sympy import Float, Number, Rational

    if not parsed:
        return None
    v = parsed[0]
    if isinstance(v, Float):
        return Rational(str(v)) if v.is_finite else None
    if isinstance(v, Number) and v.is_finite:
        return Rational(v)
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
            basic_latex=True, units=units, malformed_operators=True, nits=True, boxed="all",
            equations=False,
        )
        return [LatexExtractionConfig(normalization_config=norm, boxed_match_priority=0)]

    @lru_cache(maxsize=4096)
    def parse_gold(gold: str, units: bool, timeout: int):
        return parse(_wrap(gold), extraction_config=configs(units), parsing_timeout=timeout,
                     extraction_mode="first_match")

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
            pred = parse(_wrap(req["pred"]), extraction_config=configs(units), parsing_timeout=t,
                         extraction_mode="first_match")
            g, p = exact_number(gold), exact_number(pred)
            if g is not None and p is not None:
                ok = g == p
            else:
                ok = bool(gold) and bool(pred) and bool(verify(gold, pred, timeout_seconds=t))
            msg = {"id": rid, "ok": ok}
        except BaseException as e:  # noqa: BLE001 - any failure is an answer, not a crash
            msg = {"id": rid, "error": f"{type(e).__name__}: {str(e)[:200]}"}
        out.write(json.dumps(msg) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
