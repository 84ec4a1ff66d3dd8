"""Per-step "aha" metrics of a batch, and a watcher that warns when a run is collapsing.

    aha_metrics(batch, main, phrases)    pure: length of correct / incorrect completions, reflection
                                         phrases, this step's length-reward correlation (docs/metrics.md)
    watcher = CollapseWatcher(cfg, log)  one per run (grpolab.training.trainer.train)
    watcher.update(metrics, batch)       adds the rolling length-reward correlation and the alert flags
                                         to the step's metrics; prints a one-line warning per alert

"Correct" is the main (highest-weight) verifier's full score (>= 1). The truncation rate is the
step's `completion/truncated_frac` (grpolab.training.step); the watcher reads it from the metrics.
"""

from __future__ import annotations

import math
import re
from collections import deque
from collections.abc import Callable, Sequence

DEFAULT_REFLECTION_PHRASES = [
    "wait",
    "let me check",
    "let me verify",
    "verify",
    "double-check",
    "recheck",
    "hmm",
    "actually",
    "espera",
    "revisemos",
    "comprobemos",
    "verifiquemos",
    "déjame comprobar",
    "en realidad",
]
"""English and Spanish phrases counted as reflection (whole words, case-insensitive)."""


def phrase_pattern(phrases: Sequence[str]) -> re.Pattern | None:
    """One regex matching any phrase as whole words, case-insensitive (None for no phrases)."""
    if not phrases:
        return None
    alts = sorted((re.escape(p.strip()) for p in phrases if p.strip()), key=len, reverse=True)
    return re.compile(r"(?<!\w)(?:" + "|".join(alts) + r")(?!\w)", re.IGNORECASE) if alts else None


def count_phrases(text: str, pattern: re.Pattern | None) -> int:
    return len(pattern.findall(text)) if pattern is not None else 0


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    """Pearson correlation; NaN when either side is constant or fewer than 2 points. With y in {0, 1}
    it is the point-biserial correlation."""
    n = len(x)
    if n < 2:
        return float("nan")
    mx, my = sum(x) / n, sum(y) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    sxx = sum((a - mx) ** 2 for a in x)
    syy = sum((b - my) ** 2 for b in y)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else float("nan")


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def length_split(lengths: Sequence[float], main_scores: Sequence[float]) -> dict[str, float]:
    """Mean length of correct (main score >= 1) and incorrect completions (NaN when there is none)."""
    correct = [float(n) for n, s in zip(lengths, main_scores) if s >= 1.0]
    wrong = [float(n) for n, s in zip(lengths, main_scores) if s < 1.0]
    return {
        "aha/length_correct": _mean(correct),
        "aha/length_incorrect": _mean(wrong),
        "aha/correct_frac": len(correct) / len(lengths) if len(lengths) else float("nan"),
    }


def aha_metrics(batch, main: str, phrases: Sequence[str] | None = None) -> dict[str, float]:
    """The aha metrics of one step's batch (grpolab.batch.Batch): rollout lengths and texts, the raw
    verifier reward and the main verifier's per-completion scores."""
    rollout = batch.rollout
    lengths = [float(x) for x in rollout.lengths.tolist()]
    main_scores = batch.reward_by_fn.get(main) or [float(r) for r in batch.raw_reward.tolist()]
    pattern = phrase_pattern(DEFAULT_REFLECTION_PHRASES if phrases is None else phrases)
    counts = [count_phrases(t, pattern) for t in rollout.texts]
    out = length_split(lengths, main_scores)
    out.update(
        {
            "aha/reflection_count": float(sum(counts)),
            "aha/reflection_frac": sum(c > 0 for c in counts) / len(counts) if counts else float("nan"),
            "aha/length_reward_corr": pearson(lengths, [float(r) for r in batch.raw_reward.tolist()]),
        }
    )
    return out


ALERTS = ("entropy", "zero_variance", "truncated", "reward_down_kl_up")


class CollapseWatcher:
    """Watches the step metrics for the four collapse signs; `update` adds to the metrics:

        aha/length_reward_corr_rolling  Pearson correlation across the last `alert_window` steps of
                                        completion/length_mean and reward/mean (do length and reward
                                        move together over the run?); null for fewer than 3 steps
        alert/<name>                    1.0 when the alert fires at this step, else 0.0
        alert/count                     alerts fired so far in the run (all kinds)

    Alerts (thresholds are Config fields): entropy < alert_entropy_min; groups/zero_std_frac == 1 for
    alert_zero_var_steps consecutive steps; completion/truncated_frac > alert_truncated_frac; over the
    last alert_window steps, reward/mean falls and kl rises (Pearson correlation with the step number
    below -0.5 for the reward and above 0.5 for kl). A warning is printed when an alert starts; while
    it lasts it is counted in alert/count at every step but not printed again.
    """

    def __init__(self, cfg, log: Callable[[str], None] = print, history: Sequence[dict] = ()):
        """history: the metrics already logged by this run (a resumed run), so that the rolling
        window, the consecutive-step counts and alert/count continue exactly where they stopped."""
        self.cfg = cfg
        self.log = log
        w = max(2, int(getattr(cfg, "alert_window", 10)))
        self.window = w
        self.lengths: deque[float] = deque(maxlen=w)
        self.rewards: deque[float] = deque(maxlen=w)
        self.kls: deque[float] = deque(maxlen=w)
        self.zero_var_run = 0
        self.count = 0
        self.active: set[str] = set()
        for m in history:
            self._record(m)
            self.count = int(m.get("alert/count", self.count) or 0)
            self.active = {a for a in ALERTS if m.get(f"alert/{a}")}

    @classmethod
    def for_run(cls, cfg, log, metrics_path, start: int) -> CollapseWatcher:
        """A watcher for a run continuing after step `start` (0: a new run), restored from the steps
        <= start already in metrics_path."""
        from pathlib import Path

        from grpolab.util.fileio import read_jsonl

        path = Path(metrics_path)
        history = [m for m in read_jsonl(path) if int(m.get("step", 0)) <= start] if start and path.exists() else []
        return cls(cfg, log, history)

    def _record(self, m: dict) -> None:
        zs = m.get("groups/zero_std_frac")
        self.zero_var_run = self.zero_var_run + 1 if (zs is not None and zs >= 1.0) else 0
        if isinstance(m.get("reward/mean"), (int, float)):
            self.rewards.append(float(m["reward/mean"]))
            self.kls.append(float(m.get("kl", 0.0) or 0.0))
            ln = m.get("completion/length_mean")
            self.lengths.append(float(ln) if isinstance(ln, (int, float)) else float("nan"))

    def update(self, m: dict, batch=None) -> dict:
        """Add the rolling correlation and the alert flags to `m` (in place); returns the alerts fired.
        `batch` is not read (the watcher works from the logged metrics alone, so a resumed run can
        restore it from metrics.jsonl)."""
        cfg = self.cfg
        self._record(m)
        lens = list(self.lengths)
        ok = len(lens) >= 3 and not any(math.isnan(x) for x in lens)
        m["aha/length_reward_corr_rolling"] = pearson(lens, list(self.rewards)) if ok else float("nan")
        fired: dict[str, str] = {}
        ent = m.get("entropy")
        if isinstance(ent, (int, float)) and not math.isnan(ent) and ent < cfg.alert_entropy_min:
            fired["entropy"] = (
                f"policy entropy {ent:.3g} < {cfg.alert_entropy_min:g}: sampling has become nearly deterministic"
            )
        if self.zero_var_run >= cfg.alert_zero_var_steps:
            fired["zero_variance"] = (
                f"every group had equal rewards for {self.zero_var_run} steps: no learning "
                "signal (raise G, change the task's difficulty or the temperature)"
            )
        tr = m.get("completion/truncated_frac")
        if isinstance(tr, (int, float)) and tr > cfg.alert_truncated_frac:
            fired["truncated"] = (
                f"{tr:.0%} of trajectories were cut by env.max_turn_tokens={cfg.env.max_turn_tokens} "
                f"or env.max_model_tokens={cfg.env.max_model_tokens} (raise them)"
                if cfg.env.enabled
                else f"{tr:.0%} of completions hit max_new_tokens={cfg.max_new_tokens} (raise it)"
            )
        if len(self.rewards) >= self.window:
            steps = list(range(len(self.rewards)))
            cr, ck = pearson(steps, list(self.rewards)), pearson(steps, list(self.kls))
            if cr < -0.5 and ck > 0.5:
                fired["reward_down_kl_up"] = (
                    f"reward falling (trend r={cr:.2f}) while KL rises (r={ck:.2f}) over "
                    f"the last {self.window} steps: the policy drifts without gaining"
                )
        for name in ALERTS:
            m[f"alert/{name}"] = 1.0 if name in fired else 0.0
        self.count += len(fired)
        m["alert/count"] = float(self.count)
        step = m.get("step", "?")
        for name, msg in fired.items():
            if name not in self.active:  # printed when it starts; while it lasts it is only counted
                self.log(f"warning: step {step}: {name}: {msg}")
        self.active = set(fired)
        return fired
