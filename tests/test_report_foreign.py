"""A report of a run directory written by someone else: its files are data, never markup, and no
line of them can stop `grpolab report`."""

from __future__ import annotations

import json

from grpolab.app.cli import main

XSS = "<script>alert(1)</script>"


def _foreign_run(tmp_path):
    run = tmp_path / "foreign"
    run.mkdir()
    (run / "config.yaml").write_text('steps: 2\nmodel: "m\\ud800"\n')
    metrics = [{"step": s, "reward/mean": 0.5, "completion/length_mean": 4.0} for s in (1, 2)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    tokens = {
        "n": XSS,
        "shown": "<img src=x onerror=alert(2)>",
        "n_env": "<b>bold</b>",
        "computed": True,
        "text": ["a", "b"],
        "adv": [0.5, -0.5],
    }
    samples = [
        {
            "step": 1,
            "prompt": "p",
            "answer": "a",
            "completion": "c",
            "reward": 1.0,
            "rewards": {"r": 1.0},
            "length": XSS,
            "tokens": tokens,
        },
        {
            "step": 2,
            "prompt": "p",
            "answer": "a",
            "completion": "c",
            "reward": 0.0,
            "rewards": {"r": 0.0},
            "length": 3,
            "tokens": dict(tokens, env=[False, True]),
        },
    ]
    lines = [json.dumps(r) for r in samples]
    lines.append(
        '{"step": 2, "prompt": "lone \\ud800 surrogate", "answer": "\\udfff", "completion": "x\\ud83d",'
        ' "reward": 0.5, "rewards": {"\\ud800": 0.5}, "length": 1}'
    )
    lines.append("[" * 100_000 + "]" * 100_000)  # nested past the JSON decoder's recursion limit
    (run / "samples.jsonl").write_text("\n".join(lines) + "\n")
    (run / "summary.json").write_text('{"note": "\\ud800"}')
    return run


def test_foreign_fields_are_escaped_and_surrogates_do_not_stop_the_report(tmp_path):
    """`length`, `tokens.n` and `tokens.shown` were printed as they were (script in the page), and a
    JSON surrogate escape in a line stopped `grpolab report` with UnicodeEncodeError."""
    run = _foreign_run(tmp_path)
    assert main(["report", str(run)]) == 0
    raw = (run / "report.html").read_bytes()
    html = raw.decode("utf-8")  # strict: the page is valid UTF-8
    assert XSS not in html and "onerror=alert(2)" not in html and "<b>bold</b>" not in html
    assert "lone \ufffd surrogate" in html
    assert " · ? tokens" in html  # the non-integer length is shown as unknown
    assert "· 2 tokens" in html  # tokens.n that is not a count: the tokens shown are counted
