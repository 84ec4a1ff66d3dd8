"""How a run stops before its last step: on a signal, on repeated non-finite updates, on a failed save.

    with StopSignals() as signals:          # SIGINT / SIGTERM
        for step in ...:
            ... one step ...
            if signals.requested:           # the first signal: finish the step, checkpoint, stop
                raise RunStopped(...)

A first SIGINT (Ctrl-C) or SIGTERM (a cluster's preemption notice) only sets `requested`: the step
that is running finishes, a checkpoint is written, and the CLI exits with 128 + the signal number
(130 / 143) after printing the exact resume command. A second signal raises StopNow at once: whatever
was being written is abandoned (checkpoints are atomic, so the last complete one stays intact).
"""

from __future__ import annotations

import signal
import threading


class RunStopped(Exception):
    """The run stopped early, on purpose or on a fault; `exit_code` is what the CLI returns."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


class StopNow(BaseException):
    """A second stop signal: leave immediately (a BaseException, so no `except Exception` swallows it)."""

    def __init__(self, signum: int):
        super().__init__(f"stopped at once by a second {signal.Signals(signum).name}")
        self.signum = signum


class StopSignals:
    """Context manager that turns SIGINT / SIGTERM into a request to stop after the current step.

    Only the main thread can install signal handlers; elsewhere (a notebook's worker thread) this does
    nothing and the default behaviour stays.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, log=print):
        self.requested: int | None = None
        self.log = log
        self._previous: dict[int, object] = {}

    def _handle(self, signum, frame) -> None:
        if self.requested is not None:
            raise StopNow(signum)
        self.requested = signum
        self.log(f"{signal.Signals(signum).name}: finishing this step, then writing a checkpoint "
                 f"(send it again to stop at once)")

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for s in self.SIGNALS:
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous.clear()

    @property
    def exit_code(self) -> int:
        return 128 + int(self.requested or 0)

    @property
    def name(self) -> str:
        return signal.Signals(self.requested).name if self.requested else ""


__all__ = ["RunStopped", "StopNow", "StopSignals"]
