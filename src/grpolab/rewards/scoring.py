"""Run reward functions over a batch: bounded time, bounded threads, failures become numbers.

`score_completions` calls every (reward function, completion) pair where its function belongs
(grpolab.rewards.contract.placement, `thread=`): async functions awaited together on an event loop,
"workers" on a small thread pool, "main" in the calling thread one after another (no timeout there:
a thread cannot be stopped from outside; signal.alarm works there). A call
that raises scores 0 (on_error="zero") or NaN (on_error="exclude": the caller drops NaN samples) and
increments `reward/errors`; a call that runs past `timeout_s` (or raises TimeoutError, as the math
and code verifiers do when their own budget runs out) does the same and increments
`reward/timeouts`. Nothing raises out of it.

A score must be a finite number (a bool counts as 0/1). NaN, inf, anything else that is not a
number, and None from a per-sample function are errors like a raise: they score as above, are counted
in `reward/errors`, and never enter the reward as a number. A batch function (RewardFn.batch, the TRL
form) is called once per run of consecutive completions that share one example (one group of G in
training, one completion in evaluation) and must return one score per completion: a list of another
length is an error for every completion of that call. Each kind of failure is logged once per
RewardFn (per run) as a warning that names the function, and every message is in `Scores.messages`.

None from a batch function follows TRL's GRPOTrainer (1.16, `_calculate_rewards`: None becomes NaN,
and the functions are summed with nansum): the function does not apply to that completion. It adds
nothing to the weighted total, is left out of `reward/<name>/mean`, is counted in `reward/<name>/none`
and `reward/none`, and is never an error. Its slot in `Scores.per_fn` holds 0.0 (a finite number for
whatever reads the scores); `Scores.none` lists where it was None.

Multi-turn runs pass `conversations`: batch functions then receive, per completion, the messages
after the prompt (assistant turns and the environment's tool / user messages, as TRL gives a tool
run's completions), each call its own copy; per-sample functions keep receiving the text. They also
pass `context`, lists with one value per completion (`environments`: each trajectory's environment,
`prompts`: the prompt it started from, reset's text included): a batch function whose callable has a
true `takes_context` attribute gets its group's slices as keyword arguments (TRL's reward functions
read the environment instances and the prompts; grpolab.rewards.custom passes them on).

Every failure is also counted per function (`reward/<name>/error_frac`: the share of the
completions it failed on) and its first message kept (Scores.first_errors), so a function that
fails on every completion can be named by the training loop (grpolab.training.stops). Batch calls
that take context also get TRL's `log_extra` / `log_metric` (Scores.extra, and the logged metrics
under their own names) and the `shared` keywords (`trainer_state`).

A reward function may carry a `max_concurrency` attribute (the code reward sets it to the
sandbox's pool size, math to its worker pool): no more of its calls run at once, so waiting for
that pool does not count against a call's time. Python cannot kill a thread: a call abandoned at
its timeout keeps its thread until it returns, and a fresh thread takes its place so the batch
goes on.
The verifiers shipped here bound their own time (worker processes, sandbox), so that never piles up.
"""

from __future__ import annotations

import copy
import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from grpolab.batch import Example
from grpolab.rewards.contract import ERROR, OK, TIMEOUT, CallLog, placement, run_async, run_here, run_pooled
from grpolab.rewards.isolated import DEFAULT_MEMORY_MB, run_isolated
from grpolab.rewards.values import MAX_SCORE, BadScore, batched, clip_score, scored

log = logging.getLogger(__name__)

ON_ERROR = ("zero", "exclude")


@dataclass
class RewardFn:
    """A named, weighted reward function.

    batch=False: fn(completion, example) -> float, one call per completion (None is an error).
    batch=True:  fn(completions, examples) -> list of float | None, one call per group of completions
                 that share an example (how grpolab.rewards runs TRL-style functions). `completions`
                 are the texts, or in a multi-turn run each completion's conversation (a list of
                 message dicts). None: the function does not apply to that completion. A callable
                 with `takes_context = True` is also given the run's context lists as keywords.
    """

    name: str
    weight: float
    fn: Callable
    batch: bool = False
    warned: set = field(default_factory=set, repr=False, compare=False)
    """Kinds of failure already logged for this function (each is logged once per RewardFn, i.e. per run)."""
    user: bool = False
    """A function of the user's (not one of grpolab's verifiers, which bound their own time): with
    `process=True` its calls run in child processes (grpolab.rewards.isolated)."""


@dataclass
class Scores:
    """Scores of one batch.

    total:    weighted sum per completion (NaN where on_error="exclude" dropped a sample); a None
              from a batch function adds nothing.
    per_fn:   each function's raw (unweighted) score per completion (0.0 where it returned None).
    metrics:  "reward/<name>/mean" and "reward/<name>/std" per function (over its scores that are
              neither NaN nor None; 0.0 when there is none; the std Bessel-corrected, as TRL's),
              "reward/errors", "reward/timeouts" and "reward/none" (counts in this call), and
              "reward/<name>/none" for each batch function.
    messages: one line per failed call, naming the function ("reward 'f' returned NaN for
              completion 3"), at most MAX_MESSAGES.
    none:     function name -> indices of the completions it returned None for (batch functions
              only; absent when there was none).
    errors:   function name -> indices of the completions whose call failed (raised, timed out, or
              returned something that is not a score); absent when there was none.
    """

    total: list[float]
    per_fn: dict[str, list[float]]
    metrics: dict[str, float] = field(default_factory=dict)
    messages: list[str] = field(default_factory=list)
    none: dict[str, list[int]] = field(default_factory=dict)
    errors: dict[str, list[int]] = field(default_factory=dict)
    first_errors: dict[str, str] = field(default_factory=dict)
    """function name -> the message of its first failed completion (in completion order)."""
    extra: dict[str, list] = field(default_factory=dict)
    """log_extra columns: name -> one value per completion (None where nothing was logged)."""


_OK, _ERROR, _TIMEOUT = OK, ERROR, TIMEOUT


MAX_MESSAGES = 20
_warned_lock = threading.Lock()


def _safe_text(x: object, limit: int = 200) -> str:
    """str(x), at most `limit` characters, whatever x's __str__ does (raises, or is huge)."""
    try:
        text = str(x)
    except BaseException as e:
        if isinstance(e, KeyboardInterrupt):
            raise
        return f"<{type(x).__name__} whose str() raised {type(e).__name__}>"
    return text if len(text) <= limit else text[:limit] + "..."


def _group_runs(examples: list[Example]) -> list[tuple[int, int]]:
    """[(start, end)] runs of consecutive completions that share one example (the same object)."""
    runs: list[tuple[int, int]] = []
    start = 0
    for j in range(1, len(examples) + 1):
        if j == len(examples) or examples[j] is not examples[start]:
            runs.append((start, j))
            start = j
    return runs


def _describe(name: str, j: int, status: str, value: object) -> tuple[str, str]:
    """(kind, message) of a failed call, naming the function."""
    if status == _TIMEOUT:
        return "timeout", f"reward {name!r} timed out on completion {j} ({_safe_text(value)})"
    if isinstance(value, BadScore):
        return str(value), f"reward {name!r} {value} for completion {j}; counted in reward/errors, scored as a failure"
    return type(value).__name__, f"reward {name!r} raised {type(value).__name__}: {_safe_text(value)} (completion {j})"


def _warn_once(rf: RewardFn, kind: str, message: str) -> None:
    with _warned_lock:
        if kind in rf.warned:
            return
        rf.warned.add(kind)
    log.warning("%s (logged once per run for each function and kind of failure)", message)


def _warn_all_none(fns: list[RewardFn], none: dict[str, list[int]], examples, completions, n: int) -> None:
    """TRL's warning when every reward function returned None for a completion (its total is then 0.0, a
    score no function gave): the first such completion's fields, once per call."""
    if not fns or not all(rf.name in none for rf in fns):
        return
    common = set.intersection(*(set(none[rf.name]) for rf in fns))
    if not common:
        return
    j = min(common)
    e = examples[j] if j < len(examples) else None
    fields = {"prompt": getattr(e, "prompt", None), "completion": completions[j]}
    log.warning(
        "All reward functions returned None for the following kwargs:\n%s\nPlease ensure that at least one "
        "reward function returns a valid reward (%d of %d completions had none; their total reward is 0.0).",
        fields,
        len(common),
        n,
    )


def _batch_call(f: Callable, texts: list, examples: list[Example], context: dict[str, object]) -> Callable[[], object]:
    """One call of a batch function over a group, with the group's context when it takes it."""
    if context and getattr(f, "takes_context", False):
        return lambda: f(texts, examples, **context)
    return lambda: f(texts, examples)


def _dispatch(
    calls: list[Callable],
    fns: list[RewardFn],
    groups: list[int],
    limits: dict[int, int],
    workers: int,
    timeout_s: float,
    thread: str,
    process: bool = False,
    log: CallLog | None = None,
    memory_mb: int | None = None,
) -> list[tuple[str, object]]:
    """Run every call where its function belongs (grpolab.rewards.contract.placement): with `process`, a
    user's function in child processes (grpolab.rewards.isolated); async ones awaited together on an
    event loop, the worker threads' with a timeout, the rest in this thread, one by one."""
    where = ["process" if process and fns[k].user else placement(fns[k].fn, thread, fns[k].batch) for k in groups]
    results: list = [None] * len(calls)

    def part(kind: str) -> list[int]:
        return [i for i, w in enumerate(where) if w == kind]

    pooled, here, waiting, forked = part("workers"), part("main"), part("async"), part("process")
    background = []
    if forked:

        def children() -> None:
            is_async = {groups[i]: placement(fns[groups[i]].fn, "workers") == "async" for i in forked}
            out = run_isolated(
                [calls[i] for i in forked],
                [groups[i] for i in forked],
                is_async,
                timeout_s,
                workers,
                limits,
                log,
                DEFAULT_MEMORY_MB if memory_mb is None else memory_mb,
            )
            for i, r in zip(forked, out):
                results[i] = r

        background.append(threading.Thread(target=children, name="grpolab-reward-processes", daemon=True))
        background[-1].start()
    if pooled:

        def pool() -> None:
            for i, r in zip(
                pooled, run_pooled([calls[i] for i in pooled], workers, timeout_s, [groups[i] for i in pooled], limits)
            ):
                results[i] = r

        if here or waiting or forked:
            background.append(threading.Thread(target=pool, name="grpolab-reward-pool", daemon=True))
            background[-1].start()
        else:
            pool()
    if waiting:
        background.append(
            threading.Thread(
                target=lambda: [
                    results.__setitem__(i, r)
                    for i, r in zip(waiting, run_async([calls[i] for i in waiting], timeout_s))
                ],
                name="grpolab-reward-async-wait",
                daemon=True,
            )
        )
        background[-1].start()
    for i, r in zip(here, run_here([calls[i] for i in here])):
        results[i] = r
    for t in background:
        t.join()
    return results


def score_completions(
    fns: list[RewardFn],
    completions: list[str],
    examples: list[Example],
    *,
    conversations: list[list[dict]] | None = None,
    context: dict[str, list] | None = None,
    shared: dict[str, object] | None = None,
    timeout_s: float = 10.0,
    workers: int = 4,
    on_error: str = "zero",
    thread: str = "workers",
    process: bool = False,
    memory_mb: int | None = None,
) -> Scores:
    """Score every completion with every reward function (see the module docstring).

    conversations: per completion, the messages after the prompt (multi-turn runs,
    Rollout.conversations); batch functions receive them instead of `completions`.
    context: name -> one value per completion (`completion_ids`; multi-turn runs: `environments`,
    `prompts`), for batch functions that take it, each call its group's slice.
    shared: name -> one value for every call of a batch function that takes context (`trainer_state`);
    such a call also gets `log_extra` and `log_metric` (grpolab.rewards.contract.CallLog: Scores.extra,
    and the logged metrics in Scores.metrics under their own names).
    thread: where synchronous calls run (grpolab.rewards.contract.placement): "auto", "main", "workers".
    process: the calls of the user's functions (RewardFn.user) run in child processes, killed at timeout_s
    with what they started, each child's memory bounded by memory_mb MiB beyond what it inherits
    (grpolab.rewards.isolated; None: its default)."""
    if len(completions) != len(examples):
        raise ValueError(f"{len(completions)} completions but {len(examples)} examples")
    if conversations is not None and len(conversations) != len(completions):
        raise ValueError(f"{len(conversations)} conversations but {len(completions)} completions")
    for key, values in (context or {}).items():
        if len(values) != len(completions):
            raise ValueError(f"{len(values)} {key} but {len(completions)} completions")
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
    n = len(completions)
    log = CallLog(n)
    calls, groups, limits = [], [], {}
    spans: list[tuple[int, int, int]] = []  # (function index, start, end) of each call
    runs = _group_runs(examples)
    for k, rf in enumerate(fns):
        limit = getattr(rf.fn, "max_concurrency", None)
        if isinstance(limit, int) and limit > 0:
            limits[k] = limit
        if rf.batch:
            for a, b in runs:
                # each call its own copy of the conversations: a function that edits its messages changes nothing else
                texts = list(completions[a:b]) if conversations is None else copy.deepcopy(list(conversations[a:b]))
                kwargs = {k: list(v[a:b]) for k, v in (context or {}).items()}
                kwargs.update(shared or {})
                kwargs.update(log_extra=log.log_extra_for(a, b), log_metric=log.log_metric)
                calls.append(batched(_batch_call(rf.fn, texts, list(examples[a:b]), kwargs), b - a))
                groups.append(k)
                spans.append((k, a, b))
        else:
            for j, (c, ex) in enumerate(zip(completions, examples, strict=True)):
                calls.append(scored(lambda f=rf.fn, c=c, ex=ex: f(c, ex)))
                groups.append(k)
                spans.append((k, j, j + 1))
    raw = _dispatch(calls, fns, groups, limits, workers, timeout_s, thread, process, log, memory_mb) if calls else []
    results: dict[tuple[int, int], tuple[str, object]] = {}  # (function, completion) -> result
    for (k, a, b), (status, value) in zip(spans, raw):
        parts = value if status == _OK and fns[k].batch else [(status, value)] * (b - a)
        for j, part in zip(range(a, b), parts):
            results[(k, j)] = part

    fail_value = 0.0 if on_error == "zero" else math.nan
    per_fn: dict[str, list[float]] = {}
    messages: list[str] = []
    none: dict[str, list[int]] = {}
    failed: dict[str, list[int]] = {}
    first: dict[str, str] = {}
    errors = timeouts = clipped = 0
    for k, rf in enumerate(fns):
        scores = []
        skipped: list[int] = []
        for j in range(n):
            status, value = results[(k, j)]
            if status == _OK and value is None and rf.batch:  # TRL: does not apply to this completion
                skipped.append(j)
                scores.append(0.0)
                continue
            if status == _OK:  # already a finite float: converted in the scoring thread
                value, cut = clip_score(value)
                if cut:
                    clipped += 1
                    _warn_once(
                        rf,
                        "clipped",
                        f"reward {rf.name!r} returned {results[(k, j)][1]!r} for completion "
                        f"{j}: clipped to {value} (|score| <= {MAX_SCORE}; counted in reward/clipped)",
                    )
                scores.append(value)
                continue
            if status == _TIMEOUT:
                timeouts += 1
            else:
                errors += 1
            failed.setdefault(rf.name, []).append(j)
            kind, message = _describe(rf.name, j, status, value)
            first.setdefault(rf.name, message)
            _warn_once(rf, kind, message)
            if len(messages) < MAX_MESSAGES:
                messages.append(message)
            scores.append(fail_value)
        per_fn[rf.name] = scores
        if skipped:
            none[rf.name] = skipped

    _warn_all_none(fns, none, examples, completions, n)
    # a None's 0.0 adds nothing; weights can take a total past the bound too
    total = [clip_score(sum(rf.weight * per_fn[rf.name][j] for rf in fns))[0] for j in range(n)]
    metrics: dict[str, float] = {}
    for rf in fns:
        skipped_set = set(none.get(rf.name, ()))
        valid = [s for j, s in enumerate(per_fn[rf.name]) if j not in skipped_set and not math.isnan(s)]
        metrics[f"reward/{rf.name}/mean"] = sum(valid) / len(valid) if valid else 0.0
        metrics[f"reward/{rf.name}/std"] = sample_std(valid)
        if rf.batch:
            metrics[f"reward/{rf.name}/none"] = float(len(skipped_set))
        metrics[f"reward/{rf.name}/error_frac"] = len(failed.get(rf.name, ())) / n if n else 0.0
    for name, value in log.metrics().items():  # log_metric: under the name the function gave (TRL's)
        metrics.setdefault(name, value)
    metrics["reward/errors"] = float(errors)
    metrics["reward/timeouts"] = float(timeouts)
    metrics["reward/clipped"] = float(clipped)
    metrics["reward/none"] = float(sum(len(v) for v in none.values()))
    return Scores(
        total=total,
        per_fn=per_fn,
        metrics=metrics,
        messages=messages,
        none=none,
        errors=failed,
        first_errors=first,
        extra=log.extra,
    )


def sample_std(values: list[float]) -> float:
    """The Bessel-corrected standard deviation, sqrt(sum (x - mean)^2 / (n - 1)) (TRL's nanstd over the
    scores a function gave, its `rewards/<name>/std`); 0.0 for fewer than two values."""
    n = len(values)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    return math.sqrt(sum((x - mean) ** 2 for x in values) / (n - 1))


def completion_ids(rollout) -> list[list[int]]:
    """Per row of a rollout (grpolab.batch.Rollout), the token ids after the prompt (EOS included, no
    padding; in a multi-turn rollout the environment's tokens too): TRL's `completion_ids`."""
    present = rollout.attention_mask > 0  # (N, C)
    return [row[keep].tolist() for row, keep in zip(rollout.completion_ids, present)]


def score_rollout(
    fns: list[RewardFn], rollout, examples: list[Example], context: dict[str, list] | None = None, **options
) -> Scores:
    """score_completions over a rollout's N = B*G completions (each example repeated G times to match):
    its texts, its conversations in a multi-turn rollout, TRL's `completion_ids` added to `context`.
    `options`: score_completions's keywords (shared, timeout_s, workers, thread)."""
    per_completion = [e for e in examples for _ in range(rollout.G)]
    context = {**(context or {}), "completion_ids": completion_ids(rollout)}
    return score_completions(
        fns, rollout.texts, per_completion, conversations=rollout.conversations, context=context, **options
    )
