"""grpolab's metric names and TRL 1.16's GRPOTrainer's: one table, read both ways, and the rows TRL logs.

grpolab writes one row per step (one generation: algo.mu x algo.steps_per_generation optimizer updates) to
metrics.jsonl under its own names (docs/metrics.md). TRL's Trainer logs per optimizer update: a row at every
logging step holds the mean of what the updates since the last row added (transformers' Trainer.log and TRL's
GRPOTrainer.log), the generation's statistics on the update that generated, then the update's own.

    GENERATION, UPDATE, EVAL      (TRL name, grpolab name) in the order of TRL's keys; "{}" is a reward
                                  function's name
    trl_name(name), grpolab_name(name)    one name to the other ("" where the other side has none)
    TrlLog                        TRL's buffers: add_generation(row), add_update(row, update), row(epoch)
    trl_eval_row(row)             a grpolab evaluation's keys as TRL's eval_... keys

What TRL logs and grpolab has no number for (clip_ratio/low_min, clip_ratio/high_max, and in evaluations
eval_loss, eval_entropy, eval_clip_ratio/...) is left out of the rows, never made up: MISSING.
"""

from __future__ import annotations

import math
import re

GENERATION = (
    ("num_tokens", "tokens/prompt + tokens/generated, summed over the run"),
    ("completions/mean_length", "completion/length_mean"),
    ("completions/min_length", "completion/length_min"),
    ("completions/max_length", "completion/length_max"),
    ("completions/clipped_ratio", "completion/truncated_frac"),
    ("completions/mean_terminated_length", "completion/ended_length_mean"),
    ("completions/min_terminated_length", "completion/ended_length_min"),
    ("completions/max_terminated_length", "completion/ended_length_max"),
    ("rewards/{}/mean", "reward/{}/mean"),
    ("rewards/{}/std", "reward/{}/std"),
    ("reward", "reward/mean"),
    ("reward_std", "reward/std"),
    ("frac_reward_zero_std", "groups/zero_std_frac"),
)
"""What a generation adds to TRL's log, once, on its first optimizer update."""

UPDATE = (
    ("loss", "loss of each update (Run.updates; loss/policy + loss/kl [+ c x loss/aux] in metrics.jsonl)"),
    ("grad_norm", "grad_norm of each update (Run.updates; their mean in metrics.jsonl)"),
    ("learning_rate", "lr of each update (Run.updates; the step's first in metrics.jsonl)"),
    ("aux_loss", "loss/aux"),
    ("kl", "kl"),
    ("entropy", "entropy"),
    ("clip_ratio/low_mean", "clip/low_frac"),
    ("clip_ratio/high_mean", "clip/high_frac"),
    ("clip_ratio/region_mean", "clip/frac"),
    ("policy_loss", "loss of each update without the entropy bonus (Run.updates, with an entropy bonus only)"),
    ("entropy_coef", "the entropy coefficient after each update (Run.updates, with an entropy bonus only)"),
    ("step_time", "time/step_s, shared out over the step's updates"),
)
"""What each optimizer update adds (loss, grad_norm and learning_rate are transformers' own, first in a row;
aux_loss only with a mixture of experts' router term; kl only where TRL logs it: beta != 0)."""

EVAL = (
    ("eval_loss", "eval/loss"),
    ("eval_completions/mean_length", "eval/length"),
    ("eval_completions/min_length", "eval/length_min"),
    ("eval_completions/max_length", "eval/length_max"),
    ("eval_completions/clipped_ratio", "eval/truncated_frac"),
    ("eval_completions/mean_terminated_length", "eval/ended_length_mean"),
    ("eval_completions/min_terminated_length", "eval/ended_length_min"),
    ("eval_completions/max_terminated_length", "eval/ended_length_max"),
    ("eval_rewards/{}/mean", "eval/reward/{}/mean"),
    ("eval_rewards/{}/std", "eval/reward/{}/std"),
    ("eval_reward", "eval/reward"),
    ("eval_reward_std", "eval/reward_std"),
    ("eval_frac_reward_zero_std", "eval/zero_std_frac"),
)
"""An evaluation's keys; every other eval/NAME of grpolab's (accuracy, pass@k, ...) follows as eval_NAME."""

MISSING = (
    "clip_ratio/low_min",
    "clip_ratio/high_max",
    "eval_entropy",
    "eval_clip_ratio/low_mean",
    "eval_clip_ratio/high_mean",
    "eval_clip_ratio/region_mean",
    "eval_clip_ratio/low_min",
    "eval_clip_ratio/high_max",
)
"""TRL's metrics grpolab has no number for (its clip ratios are token shares of the whole step, with no
per-sequence minimum or maximum; its evaluation's one loss pass, grpolab.training.eval_loss, reports the loss
alone; eval_loss is there only where the loss needs no reference or critic, which evaluation does not load)."""

DIRECT = {
    "loss": "loss",
    "grad_norm": "grad_norm",
    "learning_rate": "lr",
    "step_time": "time/step_s",
    "policy_loss": "",
    "entropy_coef": "entropy/coef",
}
"""The entries of UPDATE whose grpolab side is a metric of the step (described above, not a plain name; ""
where metrics.jsonl has none)."""

GRPOLAB_BARE = frozenset({"approx_kl", "entropy", "grad_norm", "kl", "lr", "step", "threads", "loss"})
"""grpolab's own metric names without a "/"; any other such key of a step's row is a reward function's
log_metric(name, value), which TRL logs under that name."""


def _pairs():
    for trl, ours in GENERATION + UPDATE + EVAL:
        mine = DIRECT.get(trl, ours)
        if mine:
            yield trl, mine


def _pattern(name: str) -> re.Pattern:
    return re.compile("^" + re.escape(name).replace(r"\{\}", "(.+)") + "$")


def trl_name(name: str) -> str:
    """grpolab's metric name -> TRL's ("reward/mean" -> "reward", "reward/acc/std" -> "rewards/acc/std",
    "eval/accuracy" -> "eval_accuracy"); "" where TRL logs no such number."""
    for trl, ours in _pairs():
        m = _pattern(ours).match(name)
        if m:
            return trl.replace("{}", m.group(1)) if m.groups() else trl
    return "eval_" + name[len("eval/") :] if name.startswith("eval/") else ""


def grpolab_name(name: str) -> str:
    """TRL's metric name -> grpolab's (the inverse of trl_name); "" where grpolab has none."""
    for trl, ours in _pairs():
        m = _pattern(trl).match(name)
        if m and " " not in ours:
            return ours.replace("{}", m.group(1)) if m.groups() else ours
    return "eval/" + name[len("eval_") :] if name.startswith("eval_") else ""


def _nanmean(xs: list) -> float | None:
    """TRL's mean over a logging interval: NaN and None left out; None when nothing is left."""
    valid = [float(x) for x in xs if x is not None and not math.isnan(float(x))]
    return sum(valid) / len(valid) if valid else None


class TrlLog:
    """TRL's log buffers for one run (one process): what each update adds, emptied into one row at each
    logging step. reward_names: the reward functions in order; kl: whether TRL logs kl (beta != 0)."""

    def __init__(self, reward_names: list[str], kl: bool, num_tokens: float = 0.0):
        self.reward_names, self.kl = list(reward_names), kl
        self.metrics: dict[str, list] = {}  # TRL's self._metrics["train"]: insertion order is the key order
        self.losses: list = []
        self.grad_norm = self.learning_rate = None
        self.num_tokens = num_tokens  # TRL's state.num_input_tokens_seen
        self.all_losses: list[float] = []  # every update's loss: the run's training_loss
        self.entropy_coef: float | None = None  # with an entropy bonus: the coefficient after the last update

    def _names(self, table) -> list[tuple[str, str]]:
        out = []
        for trl, ours in table:
            if "{}" in trl:
                out += [(trl.replace("{}", n), ours.replace("{}", n)) for n in self.reward_names]
            else:
                out.append((trl, ours))
        return out

    def add_generation(self, row: dict) -> None:
        """A step's generation (its metrics.jsonl row): num_tokens, the completions and the rewards."""
        self.num_tokens += float(row.get("tokens/prompt", 0.0)) + float(row.get("tokens/generated", 0.0))
        self.metrics["num_tokens"] = [self.num_tokens]
        for trl, ours in self._names(GENERATION[1:]):
            if ours in row:
                self.metrics.setdefault(trl, []).append(row[ours])
        for name, value in row.items():  # a reward function's log_metric(name, value)
            if "/" not in name and name not in GRPOLAB_BARE and isinstance(value, (int, float)):
                self.metrics.setdefault(name, []).append(value)

    def add_update(self, row: dict, update: dict, step_time: float) -> None:
        """One optimizer update: its loss, gradient norm and learning rate (`update`, a Run.updates record),
        and the step's kl, entropy and clip ratios (TRL measures them per update; grpolab once per step)."""
        loss = update.get("loss")
        self.losses.append(loss)
        if loss is not None:
            self.all_losses.append(float(loss))
        self.grad_norm, self.learning_rate = update.get("grad_norm"), update.get("learning_rate")
        for trl, ours in UPDATE[3:-3]:
            if ours in row and (trl != "kl" or self.kl):
                self.metrics.setdefault(trl, []).append(row[ours])
        for trl in ("policy_loss", "entropy_coef"):  # with an entropy bonus: the update's own
            if trl in update:
                self.metrics.setdefault(trl, []).append(update[trl])
        self.entropy_coef = update.get("entropy_coef", self.entropy_coef)
        self.metrics.setdefault("step_time", []).append(step_time)

    def row(self, epoch: float) -> dict:
        """The row TRL logs now (transformers' loss mean since the last row, the last gradient norm and learning
        rate, TRL's means), the buffers emptied."""
        out = {"loss": _nanmean(self.losses)}
        if self.grad_norm is not None:
            out["grad_norm"] = self.grad_norm
        out["learning_rate"] = self.learning_rate
        out.update({k: _nanmean(v) for k, v in self.metrics.items()})
        out["epoch"] = epoch
        self.metrics, self.losses = {}, []
        return out

    def residual(self) -> dict:
        """TRL's means of what the updates since the last row added (not transformers' loss, gradient norm
        and learning rate), the buffers emptied: GRPOTrainer.log merges them into whatever row is logged
        next, the closing train_runtime/train_loss row when the run ends between logging steps."""
        out = {k: _nanmean(v) for k, v in self.metrics.items()}
        self.metrics, self.losses = {}, []
        return out


def step_times(row: dict, n: int) -> list[float]:
    """time/step_s shared out over a step's n updates as TRL times them: the first update carries the
    generation, t_1 = step_s - update_s + update_s / n, the others t_i = update_s / n."""
    total, upd = float(row.get("time/step_s", 0.0)), float(row.get("time/update_s", 0.0))
    return [total - upd + upd / n] + [upd / n] * (n - 1) if n else []


def trl_eval_row(row: dict, reward_names: list[str]) -> dict:
    """A grpolab evaluation's keys (eval/...) as TRL's (eval_...), TRL's first, in its order, then the rest
    of grpolab's (eval_accuracy, eval_pass@1, ...)."""
    out = {}
    seen = set()
    for trl, ours in EVAL:
        for n in reward_names if "{}" in trl else [None]:
            t, o = (trl.replace("{}", n), ours.replace("{}", n)) if n else (trl, ours)
            if o in row:
                out[t] = row[o]
                seen.add(o)
    for k, v in row.items():
        if k.startswith("eval/") and k not in seen and not k.startswith("eval/reward/"):
            out["eval_" + k[len("eval/") :]] = v
    return out


__all__ = [
    "EVAL",
    "GENERATION",
    "MISSING",
    "UPDATE",
    "TrlLog",
    "grpolab_name",
    "step_times",
    "trl_eval_row",
    "trl_name",
]
