"""grpolab.training.diagnostics: the per-step aha metrics of a batch and the collapse watcher's alerts."""

import math
from types import SimpleNamespace

import torch

from grpolab.training.config import build_config
from grpolab.training.diagnostics import CollapseWatcher, aha_metrics, count_phrases, pearson, phrase_pattern


def fake_batch(texts, lengths, main, total=None, truncated=None, G=2):
    rollout = SimpleNamespace(
        texts=texts,
        lengths=torch.tensor(lengths, dtype=torch.float32),
        G=G,
        truncated=torch.tensor(truncated or [False] * len(texts)),
    )
    return SimpleNamespace(
        rollout=rollout,
        raw_reward=torch.tensor(total if total is not None else main),
        reward_by_fn={"math": list(main), "format": [0.1] * len(texts)},
        empty=False,
    )


def test_length_split_uses_the_main_verifier_full_score():
    b = fake_batch(["a", "bb", "ccc", "dddd"], [2, 4, 6, 8], main=[1.0, 0.0, 1.0, 0.5], total=[1.1, 0.1, 1.1, 0.6])
    m = aha_metrics(b, "math", [])
    assert m["aha/length_correct"] == 4.0  # lengths 2 and 6 (score 1.0)
    assert m["aha/length_incorrect"] == 6.0  # 4 and 8 (0.0 and a partial 0.5 are not correct)
    assert m["aha/correct_frac"] == 0.5
    assert math.isnan(aha_metrics(fake_batch(["x"], [3], main=[0.0]), "math", [])["aha/length_correct"])


def test_reflection_phrases_whole_words_case_insensitive_english_and_spanish():
    p = phrase_pattern(["wait", "let me check", "espera", "revisemos"])
    assert count_phrases("Wait, let me check: 3+4=7. wait", p) == 3
    assert count_phrases("awaits waiting", p) == 0  # whole words only
    assert count_phrases("Espera... revisemos el cálculo", p) == 2
    b = fake_batch(["17", "8,14 wait 15", "hmm", "Espera, 12"], [2, 12, 3, 10], main=[1, 1, 0, 0])
    m = aha_metrics(b, "math", None)  # default list: English and Spanish
    assert m["aha/reflection_count"] == 3.0 and m["aha/reflection_frac"] == 0.75
    assert aha_metrics(b, "math", ["zzz"])["aha/reflection_count"] == 0.0


def test_length_reward_correlation_sign():
    up = fake_batch(["a"] * 4, [2, 3, 10, 12], main=[0, 0, 1, 1])
    down = fake_batch(["a"] * 4, [10, 12, 2, 3], main=[0, 0, 1, 1])
    assert aha_metrics(up, "math", [])["aha/length_reward_corr"] > 0.9
    assert aha_metrics(down, "math", [])["aha/length_reward_corr"] < -0.9
    assert math.isnan(pearson([1, 2, 3], [1, 1, 1]))


def step_metrics(step, **kw):
    return {
        "step": step,
        "entropy": 1.0,
        "groups/zero_std_frac": 0.5,
        "completion/truncated_frac": 0.0,
        "reward/mean": 0.5,
        "kl": 0.0,
        **kw,
    }


def test_watcher_alerts_fire_print_once_and_count():
    cfg = build_config({}, ["alert_zero_var_steps=3", "alert_window=5"])
    lines = []
    w = CollapseWatcher(cfg, lines.append)
    m = step_metrics(1)
    assert w.update(m) == {} and m["alert/count"] == 0.0 and m["alert/entropy"] == 0.0
    m = step_metrics(2, entropy=0.001, **{"completion/truncated_frac": 0.9})
    assert set(w.update(m)) == {"entropy", "truncated"} and m["alert/entropy"] == 1.0 and m["alert/count"] == 2.0
    m = step_metrics(3, entropy=0.001)
    w.update(m)
    assert m["alert/count"] == 3.0
    assert len([x for x in lines if "entropy" in x]) == 1  # printed when it starts, counted while it lasts
    assert all(x.startswith("warning: step ") and "\n" not in x for x in lines)


def test_watcher_zero_variance_for_k_steps():
    cfg = build_config({}, ["alert_zero_var_steps=3"])
    w = CollapseWatcher(cfg, lambda _: None)
    fired = [w.update(step_metrics(s, **{"groups/zero_std_frac": 1.0})) for s in range(1, 5)]
    assert ["zero_variance" in f for f in fired] == [False, False, True, True]
    assert "zero_variance" not in w.update(step_metrics(5))  # one informative group resets the count


def test_watcher_reward_falling_while_kl_rises():
    cfg = build_config({}, ["alert_window=5"])
    w = CollapseWatcher(cfg, lambda _: None)
    fired = [w.update(step_metrics(s, **{"reward/mean": 0.9 - 0.1 * s, "kl": 0.01 * s})) for s in range(1, 7)]
    assert "reward_down_kl_up" not in fired[3] and "reward_down_kl_up" in fired[4]
    w2 = CollapseWatcher(cfg, lambda _: None)  # reward rising with the KL: learning, not collapse
    assert not any(
        "reward_down_kl_up" in w2.update(step_metrics(s, **{"reward/mean": 0.1 * s, "kl": 0.01 * s}))
        for s in range(1, 7)
    )


def test_watcher_rolling_correlation_across_the_window():
    cfg = build_config({}, ["alert_window=3"])
    w = CollapseWatcher(cfg, lambda _: None)
    ms = [
        step_metrics(s, **{"reward/mean": r, "completion/length_mean": n})
        for s, (r, n) in enumerate([(0.1, 5), (0.2, 9), (0.3, 12), (0.4, 4), (0.5, 3)], 1)
    ]
    for m in ms:
        w.update(m)
    assert math.isnan(ms[1]["aha/length_reward_corr_rolling"])  # fewer than 3 steps
    assert ms[2]["aha/length_reward_corr_rolling"] > 0.9  # length and reward rose together
    assert ms[4]["aha/length_reward_corr_rolling"] < -0.7  # the window moved on: length falls as reward rises


def test_a_resumed_watcher_continues_exactly():
    cfg = build_config({}, ["alert_window=3", "alert_zero_var_steps=2"])
    seq = [
        step_metrics(
            s,
            **{
                "reward/mean": 0.1 * s,
                "completion/length_mean": 3.0 + s,
                "groups/zero_std_frac": 1.0 if s >= 3 else 0.5,
                "entropy": 0.001 if s == 4 else 1.0,
            },
        )
        for s in range(1, 7)
    ]
    straight = CollapseWatcher(cfg, lambda _: None)
    done = []
    for m in seq:
        m = dict(m)
        straight.update(m)
        done.append(m)
    resumed = CollapseWatcher(cfg, lambda _: None, history=done[:4])
    for m_ref in done[4:]:
        m = {k: v for k, v in m_ref.items() if not k.startswith(("alert/", "aha/"))}
        resumed.update(m)
        assert m == m_ref
