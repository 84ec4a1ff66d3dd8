"""The channels of a run: candidate <-> checker inside the sandbox, checker -> parent outside.

Inside the sandbox two processes run as the slot uid:

- the *candidate* (`_harness_main`, forked from the launcher before it read the job, `-I -S`:
  standard library only, no site, no environment) loads the model's code and serves
  calls: it reads a request frame (function name, plain-data arguments) on fd 3 and answers with
  one reply frame (the plain-data result, or the exception) on fd 4. It never learns how many
  tests there are, what is expected, or how the reply is judged;
- the *checker* (`_checker_main`, forked from the trusted launcher, not dumpable, so the candidate
  cannot ptrace it or read its memory) drives the tests: it sends each call, and for
  tests that are not a call compared with a literal it runs the task's own check code in one
  namespace where the entry point (and `candidate`) is a proxy that calls into the candidate.
  It alone holds the result pipe to the parent.

Code in the candidate's interpreter can patch anything there (json, the encoder, the harness), but
all it can change is its own replies, which is no more than returning other values. Frames are
length-prefixed; a reply for the wrong request, a malformed or oversized reply marks the run as
tampered, and nothing after it is graded.

In the parent, `decode` rebuilds results under a budget of bytes, items, depth and time, and never
rebuilds a set or dict from them (see grpolab.util.values.PlainSet), so crafted hash collisions cannot
stall grading.
"""

from __future__ import annotations

import os
import select
import time

from grpolab.util.values import PlainDict, PlainSet

MAX_VALUE_CHARS = 256 * 1024  # budget of one encoded value (roughly characters), in the child
MAX_FRAME_BYTES = 4 * 1024 * 1024  # one frame between checker and candidate
MAX_RESULT_BYTES = 4 * 1024 * 1024  # everything the checker reports to the parent
MAX_ITEMS = 200_000  # decoded items per run, in the parent
MAX_DEPTH = 40
DECODE_TIME_S = 1.0


class Tampered(ValueError):
    """The result channel broke its protocol (or a decoding budget ran out)."""


# ============================================================================ child side
# Sent as source (inspect.getsource) into `python -I -S` processes: standard library only.


def _plain(v, depth=0, budget=None):
    """Encode a value as JSON-able plain data, type-strictly (subclasses and custom objects rejected)."""
    import math as _m

    if budget is None:
        budget = [MAX_VALUE_CHARS]
    if depth > 32:
        raise ValueError("value nested too deeply")
    budget[0] -= 1
    if budget[0] < 0:
        raise ValueError("value too large")
    t = type(v)
    if v is None or t is bool:
        return v
    if t is int:
        if -(2**53) < v < 2**53:
            return v
        if v.bit_length() > 100_000:
            raise ValueError("integer too large")
        budget[0] -= v.bit_length() // 4
        return {"$": "int", "v": hex(v)}
    if t is float:
        return v if _m.isfinite(v) else {"$": "float", "v": repr(v)}
    if t is str or t is bytes:
        budget[0] -= len(v) * (1 if t is str else 2)
        if budget[0] < 0:
            raise ValueError("value too large")
        return v if t is str else {"$": "bytes", "v": v.hex()}
    if t is complex:
        return {"$": "complex", "v": [_plain(v.real, depth + 1, budget), _plain(v.imag, depth + 1, budget)]}
    if t is list or t is tuple or t is set or t is frozenset:
        return {"$": t.__name__, "v": [_plain(x, depth + 1, budget) for x in v]}
    if t is dict:  # insertion order kept: order-sensitive code sees the dict it was given
        return {"$": "dict", "v": [[_plain(k, depth + 1, budget), _plain(x, depth + 1, budget)] for k, x in v.items()]}
    raise TypeError(f"value of type {t.__name__} is not plain data")


def _unplain(x, depth=0):
    """Decode `_plain` output into Python values, in the child (raises on anything malformed)."""
    if depth > 40:
        raise ValueError("nested too deeply")
    t = type(x)
    if x is None or t in (bool, int, float, str):
        return x
    if t is not dict or len(x) != 2 or "$" not in x or "v" not in x:
        raise ValueError("malformed plain value")
    tag, v = x["$"], x["v"]
    if tag == "int" and type(v) is str and len(v) < 30_000:
        return int(v, 16)
    if tag == "float" and v in ("nan", "inf", "-inf"):
        return float(v)
    if tag == "bytes" and type(v) is str:
        return bytes.fromhex(v)
    if tag == "complex" and type(v) is list and len(v) == 2:
        return complex(_unplain(v[0], depth + 1), _unplain(v[1], depth + 1))
    if tag in ("list", "tuple", "set", "frozenset") and type(v) is list:
        items = [_unplain(i, depth + 1) for i in v]
        return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[tag](items)
    if tag == "dict" and type(v) is list:
        out = {}
        for pair in v:
            if type(pair) is not list or len(pair) != 2:
                raise ValueError("malformed dict")
            out[_unplain(pair[0], depth + 1)] = _unplain(pair[1], depth + 1)
        return out
    raise ValueError(f"unknown tag {tag!r}")


def _send(fd, obj):
    """Write one length-prefixed JSON frame."""
    import json

    data = json.dumps(obj, separators=(",", ":")).encode()
    data = len(data).to_bytes(4, "big") + data
    while data:
        data = data[os.write(fd, data) :]


def _recv(fd, limit):
    """Read one frame; EOFError at a clean end, ValueError on a malformed or oversized frame."""
    import json

    def exactly(n):
        buf = b""
        while len(buf) < n:
            chunk = os.read(fd, min(n - len(buf), 1 << 20))
            if not chunk:
                raise EOFError("channel closed")
            buf += chunk
        return buf

    n = int.from_bytes(exactly(4), "big")
    if n > limit:
        raise ValueError(f"frame of {n} bytes")
    return json.loads(exactly(n))


def _harness_main():
    """Candidate process: load the code, then answer calls until the checker closes the channel."""
    import sys

    def flush():  # the process is SIGKILLed when the checker is done: output must be out by then
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:  # noqa: BLE001 - the candidate may have replaced or closed it
                pass

    job = _recv(3, 1 << 26)
    ns = {"__name__": "solution"}
    try:
        exec(compile(job["setup"] + "\n" + job["code"], "solution.py", "exec"), ns)
    except BaseException as e:  # noqa: BLE001 - SystemExit included: nothing counts as success
        flush()
        _send(4, {"load_error": f"{type(e).__name__}: {str(e)[:300]}"})
        return
    flush()
    _send(4, {"ok": True})
    while True:
        try:
            req = _recv(3, 1 << 26)
        except (EOFError, OSError):
            return
        try:
            out = {"q": req["q"], "v": _plain(ns[req["fn"]](*_unplain(req["args"]), **_unplain(req["kw"])))}
        except BaseException as e:  # noqa: BLE001
            try:
                msg = f"{type(e).__name__}: {str(e)[:200]}"
            except BaseException:  # noqa: BLE001 - an exception whose str() raises
                msg = "exception"
            out = {"q": req["q"], "err": msg}
        flush()
        _send(4, out)


def _checker_main(job, req_w, rep_r, res_fd):
    """Checker process: drive every test through the candidate and report to the parent."""
    import json

    def emit(obj):
        data = (json.dumps(obj) + "\n").encode()
        while data:
            data = data[os.write(res_fd, data) :]

    class Broken(BaseException):  # not an Exception: check code cannot swallow it
        pass

    state = {"q": 0, "broken": ""}

    def call(fn, args, kw):
        if state["broken"]:
            raise Broken()
        state["q"] += 1
        try:
            _send(req_w, {"q": state["q"], "fn": fn, "args": args, "kw": kw})
            rep = _recv(rep_r, MAX_FRAME_BYTES)
        except EOFError:
            state["broken"] = "candidate exited"
            raise Broken() from None
        except (OSError, ValueError, RecursionError) as e:
            state["broken"] = f"tampered: malformed reply ({type(e).__name__})"
            raise Broken() from None
        if type(rep) is not dict or rep.get("q") != state["q"] or not (("v" in rep) ^ ("err" in rep)):
            state["broken"] = "tampered: reply out of protocol"
            raise Broken()
        return rep

    class CandidateError(Exception):
        pass

    def proxy_for(name):
        def proxy(*args, **kw):
            rep = call(name, _plain(args), _plain(kw))
            if "err" in rep:
                raise CandidateError(str(rep["err"])[:200])
            return _unplain(rep["v"])

        proxy.__name__ = name
        return proxy

    try:
        _send(req_w, {"code": job["code"], "setup": job["setup"]})
        hello = _recv(rep_r, 65536)
    except (EOFError, OSError, ValueError, RecursionError):
        emit({"load_error": "the candidate process ended before loading the code"})
        return
    if type(hello) is not dict or hello.get("ok") is not True:
        msg = hello.get("load_error") if type(hello) is dict else None
        emit({"load_error": str(msg)[:500] if msg else "malformed start"})
        return
    ns = {"__name__": "check"}
    if job["check_setup"]:
        try:
            exec(compile(job["check_setup"], "<check setup>", "exec"), ns)
        except BaseException as e:  # noqa: BLE001 - then the assert tests fail, with the reason
            emit({"check_setup_error": f"{type(e).__name__}: {str(e)[:200]}"})
    for name, target in job["names"].items():
        ns[name] = proxy_for(target)
    for i, t in enumerate(job["tests"]):
        try:
            if t["prelude"]:
                exec(compile(t["prelude"], "<check>", "exec"), ns)
            if t["kind"] == "call":
                rep = call(t["fn"], t["args"], {"$": "dict", "v": []})
                emit({"i": i, "err": str(rep["err"])[:200]} if "err" in rep else {"i": i, "v": rep["v"]})
            else:
                exec(compile(t["src"], "<check>", "exec"), ns)
                if state["broken"]:
                    raise Broken()
                emit({"i": i, "pass": True})
        except Broken:
            break
        except BaseException as e:  # noqa: BLE001 - a failed assertion, or the candidate's exception
            if state["broken"]:
                break
            try:
                emit({"i": i, "err": f"{type(e).__name__}: {str(e)[:200]}"})
            except BaseException:  # noqa: BLE001
                break
    if state["broken"].startswith("tampered"):
        emit({"tampered": state["broken"]})
    emit({"done": True})


# ============================================================================ parent side


class Budget:
    """What one run's results may cost to decode in the parent."""

    def __init__(self, items: int = MAX_ITEMS, depth: int = MAX_DEPTH, seconds: float = DECODE_TIME_S) -> None:
        self.items, self.depth = items, depth
        self.deadline = time.monotonic() + seconds
        self._calls = 0

    def take(self, n: int = 1) -> None:
        self.items -= n
        if self.items < 0:
            raise Tampered("result has too many items")
        self._calls += 1
        if self._calls % 1024 == 0 and time.monotonic() > self.deadline:
            raise Tampered("decoding the results took too long")

    def check_time(self) -> None:
        if time.monotonic() > self.deadline:
            raise Tampered("grading the results took too long")


def decode(x, budget: Budget, depth: int = 0):
    """A plain value from its JSON form, under `budget`; sets and dicts come back unhashed."""
    if depth > budget.depth:
        raise Tampered("result nested too deeply")
    budget.take()
    t = type(x)
    if x is None or t in (bool, int, float, str):
        return x
    if t is not dict or len(x) != 2 or "$" not in x or "v" not in x:
        raise ValueError("malformed plain value")
    tag, v = x["$"], x["v"]
    if tag == "int" and type(v) is str and len(v) < 30_000:
        budget.take(len(v) // 64)
        return int(v, 16)
    if tag == "float" and v in ("nan", "inf", "-inf"):
        return float(v)
    if tag == "bytes" and type(v) is str:
        budget.take(len(v) // 64)
        return bytes.fromhex(v)
    if tag == "complex" and type(v) is list and len(v) == 2:
        re_, im = (decode(p, budget, depth + 1) for p in v)
        if type(re_) is not float and type(re_) is not int or type(im) is not float and type(im) is not int:
            raise ValueError("malformed complex")
        return complex(re_, im)
    if tag in ("list", "tuple", "set", "frozenset") and type(v) is list:
        budget.take(len(v))
        items = [decode(i, budget, depth + 1) for i in v]
        if tag == "list":
            return items
        return tuple(items) if tag == "tuple" else PlainSet(tuple(items), frozen=tag == "frozenset")
    if tag == "dict" and type(v) is list:
        budget.take(len(v))
        pairs = []
        for pair in v:
            if type(pair) is not list or len(pair) != 2:
                raise ValueError("malformed dict")
            pairs.append((decode(pair[0], budget, depth + 1), decode(pair[1], budget, depth + 1)))
        return PlainDict(tuple(pairs))
    raise ValueError(f"unknown tag {tag!r}")


def pump(proc, job: bytes, r_fd: int, deadline: float, max_output: int):
    """Feed the job, drain stdout/stderr/results until they close or `deadline` passes.

    stdin stays open after the job (the sandbox's init treats its end as the trainer's death).
    Returns (stdout, stderr, results, timed_out, overflow).
    """
    assert proc.stdin and proc.stdout and proc.stderr
    win = proc.stdin.fileno()
    fds = {"out": proc.stdout.fileno(), "err": proc.stderr.fileno(), "res": r_fd}
    caps = {"out": max_output, "err": max_output, "res": MAX_RESULT_BYTES}
    bufs = {k: bytearray() for k in fds}
    open_names = set(fds)
    os.set_blocking(win, False)
    pending = memoryview(job)
    timed_out = overflow = False
    exited_at = None
    while open_names:
        now = time.monotonic()
        if now >= deadline:
            timed_out = True
            break
        if exited_at is None and proc.poll() is not None:
            exited_at = now
        if exited_at is not None and now - exited_at > 0.5:
            break  # the launcher is gone and something still holds a pipe: stop waiting
        writing = len(pending) > 0
        try:
            r, w, _ = select.select(
                [fds[k] for k in open_names], [win] if writing else [], [], max(0.0, min(0.1, deadline - now))
            )
        except InterruptedError:
            continue
        for name in [k for k in open_names if fds[k] in r]:
            try:
                data = os.read(fds[name], 65536)
            except OSError:
                data = b""
            if not data:
                open_names.discard(name)
                continue
            room = caps[name] - len(bufs[name])
            bufs[name] += data[: max(0, room)]
            if len(data) > room:
                open_names.discard(name)  # over the cap: stop reading; closing makes the child see EPIPE
                if name == "res":
                    overflow = True
                else:
                    (proc.stdout if name == "out" else proc.stderr).close()
        if w:
            try:
                pending = pending[os.write(win, pending[:65536]) :]
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                pending = pending[:0]
    return bytes(bufs["out"]), bytes(bufs["err"]), bytes(bufs["res"]), timed_out, overflow


def frame(obj_json: bytes) -> bytes:
    """A length-prefixed frame around already-encoded JSON."""
    return len(obj_json).to_bytes(4, "big") + obj_json


__all__ = ["MAX_RESULT_BYTES", "Budget", "Tampered", "decode", "frame", "pump"]
