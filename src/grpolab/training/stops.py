"""How a run stops before its last step: on a signal, on repeated non-finite updates, on a failed save,
on a reward function that fails on every completion step after step (check_reward_failures).

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
        self.log(
            f"{signal.Signals(signum).name}: finishing this step, then writing a checkpoint "
            f"(send it again to stop at once)"
        )

    def __enter__(self) -> StopSignals:
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


def check_reward_failures(run, step: int, metrics: dict, batch, log, *, save, resume: str) -> None:
    """After a step: name each reward function that failed on every completion of it (its
    `reward/<name>/error_frac` is 1 on every rank) with its first error; count such steps in a row per
    function (run.reward_error_streak). When one reaches cfg.max_reward_error_steps (0: never), write a
    checkpoint of this step unless the loop just did (`save(run, step)`), then stop: RunStopped, exit 1."""
    cfg = run.cfg
    failing = []
    for rf in run.reward_fns:
        if metrics.get(f"reward/{rf.name}/error_frac", 0.0) >= 1.0:
            run.reward_error_streak[rf.name] = run.reward_error_streak.get(rf.name, 0) + 1
            first = batch.first_errors.get(rf.name, "its error was logged on another rank")
            log(
                f"step {step}: reward {rf.name!r} failed on every completion "
                f"({run.reward_error_streak[rf.name]} step(s) in a row); first error: {first}"
            )
            failing.append(rf.name)
        else:
            run.reward_error_streak.pop(rf.name, None)
    limit = cfg.max_reward_error_steps
    stuck = [n for n in failing if limit and run.reward_error_streak[n] >= limit]
    if not stuck:
        return
    saved = (cfg.save_every and step % cfg.save_every == 0) or step == cfg.steps
    if not saved:
        save(run, step)
    name = stuck[0]
    raise RunStopped(
        f"step {step}: reward {name!r} failed on every completion for {run.reward_error_streak[name]} "
        f"steps in a row (max_reward_error_steps={limit}); first error this step: "
        f"{batch.first_errors.get(name, 'logged on another rank')}. Checkpoint of step {step} written. "
        f"Fix the function (or raise max_reward_error_steps, 0 to never stop), then continue with: "
        f"{resume}",
        1,
    )


__all__ = ["RunStopped", "StopNow", "StopSignals", "check_reward_failures"]
