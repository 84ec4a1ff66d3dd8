"""One safe parser for arithmetic expressions, shared by the countdown reward and the calculator tool.

A small recursive-descent parser over exact fractions (never eval), bounded in input length and
nesting depth. What differs between its users is a `Syntax`:

    expr  := term (('+'|'-') term)*
    term  := unary (('*'|'/') unary)*
    unary := ('+'|'-') unary | power        signs only with Syntax.unary
           | '-' NUMBER power-rest          with Syntax.negative_literals: a minus on a number only
    power := atom ('**' unary)?             only with Syntax.max_exponent (integer |e| <= it)
    atom  := NUMBER | '(' expr ')'

The caller's tokenizer turns the text into the tokens "+", "-", "*", "/", "**", "(", ")" and number
literals (strings that start with a digit or '.', read with `Fraction`). `evaluate` calls `on_number`
on each literal's value, in order (the countdown reward collects the numbers used), and
`Syntax.check` on every value an operator computes (the calculator bounds magnitudes with it).
Every failure raises `Syntax.error(message)`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction


@dataclass(frozen=True)
class Syntax:
    tokenize: Callable[[str], list[str]]
    """Text -> tokens (raises `error` on a character or literal it does not accept)."""
    error: type[Exception] = ValueError
    """Raised, with a message, for every malformed or refused expression."""
    max_chars: int = 200
    """Longest accepted expression, in characters."""
    max_depth: int = 32
    """Deepest nesting: parentheses, and (with `unary`) signs and exponents, each count one level."""
    depth_message: str = "too deeply nested"
    unary: bool = False
    """Accept unary '+' and '-'."""
    max_exponent: int | None = None
    """Accept '**' with an integer exponent of at most this magnitude; None: no '**'."""
    check: Callable[[Fraction], None] | None = None
    """Called on every value computed by an operator; raises `error` to refuse it (e.g. too large)."""
    negative_literals: bool = False
    """Accept a '-' written directly before a number literal (`-2 + 3`, `4 * -2`): it negates that
    number only. Not before '(' or another sign. Implied by `unary`."""


class _Parser:
    def __init__(self, tokens: list[str], syntax: Syntax, on_number: Callable[[Fraction], None] | None) -> None:
        self.toks = tokens
        self.pos = 0
        self.syn = syntax
        self.on_number = on_number

    def fail(self, message: str) -> Exception:
        return self.syn.error(message)

    def peek(self) -> str | None:
        return self.toks[self.pos] if self.pos < len(self.toks) else None

    def take(self) -> str:
        tok = self.peek()
        if tok is None:
            raise self.fail("unexpected end of expression")
        self.pos += 1
        return tok

    def checked(self, value: Fraction) -> Fraction:
        if self.syn.check is not None:
            self.syn.check(value)
        return value

    def expr(self, depth: int) -> Fraction:
        value = self.term(depth)
        while self.peek() in ("+", "-"):
            op, rhs = self.take(), self.term(depth)
            value = self.checked(value + rhs if op == "+" else value - rhs)
        return value

    def term(self, depth: int) -> Fraction:
        value = self.unary(depth)
        while self.peek() in ("*", "/"):
            op, rhs = self.take(), self.unary(depth)
            if op == "/" and rhs == 0:
                raise self.fail("division by zero")
            value = self.checked(value * rhs if op == "*" else value / rhs)
        return value

    def unary(self, depth: int) -> Fraction:
        if depth > self.syn.max_depth:
            raise self.fail(self.syn.depth_message)
        if self.syn.unary and self.peek() in ("+", "-"):
            op = self.take()
            value = self.unary(depth + 1)
            return -value if op == "-" else value
        if (
            self.syn.negative_literals
            and self.peek() == "-"
            and self.pos + 1 < len(self.toks)
            and self.toks[self.pos + 1][:1].isdigit()
        ):
            self.take()
            return -self.power(depth)
        return self.power(depth)

    def power(self, depth: int) -> Fraction:
        base = self.atom(depth)
        limit = self.syn.max_exponent
        if limit is not None and self.peek() == "**":
            self.take()
            exp = self.unary(depth + 1)
            if exp.denominator != 1 or abs(exp) > limit:
                raise self.fail(f"exponent must be an integer with |e| <= {limit}")
            if base == 0 and exp < 0:
                raise self.fail("division by zero")
            base = self.checked(base ** int(exp))
        return base

    def atom(self, depth: int) -> Fraction:
        tok = self.take()
        if tok == "(":
            value = self.expr(depth + 1)
            if self.take() != ")":
                raise self.fail("missing ')'")
            return value
        if tok[0].isdigit() or tok[0] == ".":
            value = Fraction(tok)
            if self.on_number is not None:
                self.on_number(value)
            return value
        raise self.fail(f"unexpected {tok!r}")


def evaluate(expr: str, syntax: Syntax, on_number: Callable[[Fraction], None] | None = None) -> Fraction:
    """Exact value of `expr` under `syntax`; `on_number` sees each number literal in order."""
    if len(expr) > syntax.max_chars:
        raise syntax.error("expression too long")
    tokens = syntax.tokenize(expr)
    if not tokens:
        raise syntax.error("empty expression")
    p = _Parser(tokens, syntax, on_number)
    value = p.expr(0)
    if p.pos != len(tokens):
        raise syntax.error(f"unexpected {tokens[p.pos]!r}")
    return value
