"""TRL's own GRPOTrainer tests, run under real TRL and again with the import changed to grpolab.

    git -C TRL_REPO show HEAD:tests/test_grpo_trainer.py > /tmp/trl/test_grpo_trainer.py
    git -C TRL_REPO show HEAD:tests/testing_utils.py   > /tmp/trl/testing_utils.py
    python benchmarks/trl_suite.py /tmp/trl/test_grpo_trainer.py                 # both sides, then the table
    python benchmarks/trl_suite.py /tmp/trl/test_grpo_trainer.py --side grpolab -k "test_train and not vlm"
    python benchmarks/trl_suite.py /tmp/trl/test_grpo_trainer.py --report-only --table out.json \
        --json benchmarks/results/entries.jsonl

TRL's test file is read from where you put it and never kept in this repository. The script builds local
stand-ins of the hub models and datasets it names (benchmarks/trl_standins.py), writes two copies of the
file into WORK (one as it is, one with `from trl import GRPOConfig, GRPOTrainer` changed to grpolab) beside
TRL's testing_utils.py and a conftest of its own (which records each test's outcome and first error line,
and stops a test after --per-test seconds), and runs pytest on each from the stand-ins' folder with the hub
offline, so every "trl-internal-testing/..." id is a local directory.

The table: each test, whether it passes under TRL and under grpolab, and the first line of each failure;
the totals count the tests that pass under TRL and leave out those of PRIVATE (TRL's internals, listed
with the reason). --json appends the result (grpolab's pass count against TRL's) for docs/results.md.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
IMPORT = "from trl import GRPOConfig, GRPOTrainer"
SIDES = ("trl", "grpolab")

# Tests of TRL's internals rather than of what a GRPOTrainer user calls: left out of the totals.
# key: a test's name (class::function, or function; parameters included by prefix) -> reason.
PRIVATE: dict[str, str] = {
    "TestGetHighEntropyMask::": "calls GRPOTrainer.get_high_entropy_mask, TRL's helper of top_entropy_quantile, on a Mock",
    "TestGRPORolloutDispatch::": "drives trainer._generate with rollout_func and vLLM internals (_last_loaded_step)",
    "TestTransformersContinuousBatchingContract::": "tests transformers' continuous-batching API, not the trainer",
    "test_get_off_policy_mask*": "calls GRPOTrainer.get_off_policy_mask, TRL's static helper",
    "test_compute_liger_loss_passes_vllm_is_ratio": "patches _generate_and_score_completions and the Liger loss",
    "test_entropy_bonus_flows_gradients": "calls _get_per_token_logps_and_entropies and sets _entropy_bonus_enabled",
    "test_train_reward_func_with_log_extra": "reads trainer._logs['extra'], TRL's private completion log",
    "test_train_vlm_log_multimodal_false": "reads trainer._logs['images']",
    "test_prepare_input_called_with_correct_data": (
        "patches Trainer.training_step and checks the micro-batches transformers' inner loop passes it"
    ),
    "test_train_with_mask_truncated_completions": (
        "replaces transformers' GenerationMixin.generate with fixed Qwen2.5 token ids (the rollout's internals)"
    ),
    "test_train_with_multiple_environments": "reads trainer._env_tools and trainer._environment_pool",
    "test_iterable_dataset_requires_dispatch_batches_false": "accelerate's dispatch_batches of the data loader",
    "test_iterable_eval_keeps_map_style_train_workers": "get_train_dataloader / get_eval_dataloader worker counts",
}


def private_reason(test: str) -> str | None:
    """The reason `test` ("Class::function[params]") is left out, or None. A key ending in "::" names a
    class; one ending in "*" a prefix of function names; any other key one function (all its parameters)."""
    name = test.split("[")[0]
    func = name.split("::")[-1]
    for key, why in PRIVATE.items():
        if key.endswith("::") and name.startswith(key):
            return why
        if fnmatch.fnmatchcase(func, key):
            return why
    return None


CONFTEST = '''"""Written by grpolab's benchmarks/trl_suite.py: records each test's outcome and stops it after a time limit."""
import json, os, signal
import pytest

RECORD = os.environ["TRL_SUITE_RECORD"]
LIMIT = int(os.environ.get("TRL_SUITE_PER_TEST", "600"))
_phases = {}

# testing_utils.py of a newer TRL than the one installed imports is_*_available helpers this one lacks:
# each missing one answers whether the package is importable.
import importlib.util as _util
import trl.import_utils as _iu

for _name in ("harbor", "jmespath", "joblib", "liger_kernel", "math_verify", "mergekit", "openreward", "vllm"):
    if not hasattr(_iu, f"is_{_name}_available"):
        setattr(_iu, f"is_{_name}_available", lambda *a, _n=_name, **k: _util.find_spec(_n) is not None)


@pytest.fixture(autouse=True)
def _use_cpu_without_accelerator(monkeypatch):
    """TRL's configs default bf16 on, which transformers refuses without a GPU unless use_cpu: on a CPU
    every TRL config gets use_cpu=True before that check (grpolab's GRPOConfig maps bf16 itself)."""
    import torch

    if torch.cuda.is_available():
        return
    from trl.trainer.base_config import _BaseConfig

    original = _BaseConfig.__post_init__

    def post_init(self):
        self.use_cpu = True
        original(self)

    monkeypatch.setattr(_BaseConfig, "__post_init__", post_init)


def _first_line(report):
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr or "")
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[0][:400] if lines else ""


def _alarm(signum, frame):
    raise TimeoutError(f"stopped after {LIMIT} s (TRL_SUITE_PER_TEST)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(LIMIT)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def pytest_runtest_logreport(report):
    rec = _phases.setdefault(report.nodeid, {"outcome": "passed", "error": "", "seconds": 0.0})
    rec["seconds"] += report.duration
    if hasattr(report, "wasxfail"):
        rec["outcome"] = "xfailed" if report.skipped else "xpassed"
        rec["error"] = rec["error"] or str(report.wasxfail)[:400]
    elif report.failed and rec["outcome"] not in ("failed",):
        rec["outcome"] = "failed" if report.when == "call" else "error"
        rec["error"] = _first_line(report)
    elif report.skipped and rec["outcome"] == "passed":
        rec["outcome"] = "skipped"
        rec["error"] = _first_line(report) if report.longrepr else ""
        if isinstance(report.longrepr, tuple):
            rec["error"] = str(report.longrepr[2])[:400]
    if report.when == "teardown":
        with open(RECORD, "a") as f:
            f.write(json.dumps({"test": report.nodeid.split("::", 1)[1], **rec}) + "\\n")
'''


def test_name(nodeid: str) -> str:
    return nodeid.split("::", 1)[1] if "::" in nodeid else nodeid


def prepare(test_file: Path, utils: Path, work: Path, log=print) -> dict[str, Path]:
    """Stand-ins under WORK/hub and one test package per side under WORK/<side>_side: {side: test path}."""
    sys.path.insert(0, str(HERE))
    import trl_standins

    built = trl_standins.build(work / "hub", log=log)
    missing = [k for k, v in built.items() if v != "ok"]
    if missing:
        log(f"no stand-in for {', '.join(missing)} (their tests fail on both sides)")
    source = test_file.read_text()
    if IMPORT not in source:
        raise SystemExit(f"{test_file}: no line `{IMPORT}`; is it TRL's tests/test_grpo_trainer.py?")
    out = {}
    for side in SIDES:
        pkg = work / f"{side}_side"
        pkg.mkdir(parents=True, exist_ok=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "testing_utils.py").write_text(utils.read_text())
        (pkg / "conftest.py").write_text(CONFTEST)
        text = source if side == "trl" else source.replace(IMPORT, "from grpolab import GRPOConfig, GRPOTrainer")
        (pkg / "test_grpo_trainer.py").write_text(text)
        out[side] = pkg / "test_grpo_trainer.py"
    return out


def run_side(side: str, test: Path, work: Path, select: str | None, per_test: int, extra: list[str]) -> Path:
    """pytest on one side from the stand-ins' folder; outcomes appended to WORK/records/<side>.jsonl."""
    record = work / "records" / f"{side}.jsonl"
    record.parent.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HOME": str(work / "hf_home"),
        "TRL_SUITE_RECORD": str(record),
        "TRL_SUITE_PER_TEST": str(per_test),
        "TOKENIZERS_PARALLELISM": "false",
        "WANDB_MODE": "disabled",
    }
    cmd = [sys.executable, "-m", "pytest", str(test), "-q", "-p", "no:randomly", "-p", "no:cacheprovider"]
    cmd += ["--rootdir", str(work), "-o", "addopts=", "-W", "ignore", "--tb=no", "-rN"]
    if select:
        cmd += ["-k", select]
    cmd += extra
    print(f"[{side}] {' '.join(cmd)}", flush=True)
    t0 = time.time()
    subprocess.run(cmd, cwd=work / "hub", env=env)
    print(f"[{side}] {time.time() - t0:.0f} s", flush=True)
    return record


def load_records(work: Path, side: str) -> dict[str, dict]:
    """{test: the latest record} of one side (a rerun replaces earlier outcomes)."""
    path = work / "records" / f"{side}.jsonl"
    out: dict[str, dict] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                out[r["test"]] = r
    return out


def table(work: Path) -> dict:
    """Per-test rows of both sides and the totals (module docstring)."""
    recs = {side: load_records(work, side) for side in SIDES}
    tests = sorted(set(recs["trl"]) | set(recs["grpolab"]))
    rows = []
    for t in tests:
        a, b = recs["trl"].get(t, {}), recs["grpolab"].get(t, {})
        rows.append(
            {
                "test": t,
                "trl": a.get("outcome", "not run"),
                "grpolab": b.get("outcome", "not run"),
                "trl_error": a.get("error", ""),
                "grpolab_error": b.get("error", ""),
                "private": private_reason(t),
            }
        )
    passing = [r for r in rows if r["trl"] == "passed"]
    public = [r for r in passing if not r["private"]]
    totals = {
        "tests": len(rows),
        "trl_passed": len(passing),
        "grpolab_passed": sum(r["grpolab"] == "passed" for r in passing),
        "private_left_out": len(passing) - len(public),
        "public_trl_passed": len(public),
        "public_grpolab_passed": sum(r["grpolab"] == "passed" for r in public),
        "grpolab_passed_where_trl_did_not": sum(r["grpolab"] == "passed" and r["trl"] != "passed" for r in rows),
    }
    return {"rows": rows, "totals": totals, "private": PRIVATE}


def cause(error: str) -> str:
    """A failure's first line without the values that vary between tests (paths, numbers)."""
    text = re.sub(r"/tmp/\S+|'[^']*tmp[^']*'", "PATH", error)
    text = re.sub(r"\d+(\.\d+)?", "N", text)
    return text[:160]


def render(t: dict) -> str:
    tot = t["totals"]
    lines = [
        f"tests: {tot['tests']}; pass under TRL: {tot['trl_passed']}; of those pass under grpolab: "
        f"{tot['grpolab_passed']}",
        f"public (TRL's internals left out, {tot['private_left_out']}): {tot['public_grpolab_passed']} of "
        f"{tot['public_trl_passed']} pass under grpolab",
        "",
        f"{'test':70s} {'TRL':8s} {'grpolab':8s} first error (grpolab, else TRL)",
    ]
    for r in t["rows"]:
        err = r["grpolab_error"] if r["grpolab"] != "passed" else ""
        err = err or (r["trl_error"] if r["trl"] != "passed" else "")
        mark = " (private)" if r["private"] else ""
        lines.append(f"{r['test'][:70]:70s} {r['trl'][:8]:8s} {r['grpolab'][:8]:8s} {err[:110]}{mark}")
    return "\n".join(lines)


def entries(t: dict, source: str, command: str) -> list[dict]:
    sys.path.insert(0, str(HERE))
    import results

    tot = t["totals"]
    setting = (
        f"{source}: the {tot['public_trl_passed']} tests that pass under TRL 1.16 on a CPU with local stand-ins, "
        f"TRL's internals left out ({tot['private_left_out']})"
    )
    return [
        results.entry(
            "trl-suite", setting, tot["public_grpolab_passed"], tot["public_trl_passed"], command=command, n=None
        )
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("test_file", type=Path, help="TRL's tests/test_grpo_trainer.py, extracted (not in this repo)")
    ap.add_argument("--testing-utils", type=Path, help="TRL's tests/testing_utils.py (default: beside test_file)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/grpolab-trl-suite"), help="stand-ins and records")
    ap.add_argument("--side", choices=(*SIDES, "both"), default="both")
    ap.add_argument("-k", dest="select", help="pytest -k expression (a subset; records of others are kept)")
    ap.add_argument("--fresh", action="store_true", help="forget earlier records of the chosen sides")
    ap.add_argument("--per-test", type=int, default=600, help="seconds before a test is stopped")
    ap.add_argument("--report-only", action="store_true", help="only print the table of the records there are")
    ap.add_argument("--table", type=Path, help="write the per-test table and totals as JSON here")
    ap.add_argument("--json", help="append the totals as a docs/results.md entry to this JSON-lines file")
    ap.add_argument(
        "--source",
        default="TRL's tests/test_grpo_trainer.py",
        help="the file's origin (repository, commit), for the entry",
    )
    a, extra = ap.parse_known_args(argv)
    if not a.test_file.is_file():
        raise SystemExit(f"{a.test_file}: not a file; extract TRL's tests/test_grpo_trainer.py there first")
    utils = a.testing_utils or a.test_file.with_name("testing_utils.py")
    if not utils.is_file():
        raise SystemExit(f"{utils}: TRL's tests/testing_utils.py is needed beside the test file (--testing-utils)")
    work = a.work.resolve()
    tests = prepare(a.test_file, utils, work)
    if not a.report_only:
        for side in SIDES if a.side == "both" else (a.side,):
            if a.fresh:
                (work / "records" / f"{side}.jsonl").unlink(missing_ok=True)
            run_side(side, tests[side], work, a.select, a.per_test, extra)
    t = table(work)
    print(render(t))
    if a.table:
        a.table.write_text(json.dumps(t, indent=2))
    if a.json:
        sys.path.insert(0, str(HERE))
        import results

        command = f"python benchmarks/trl_suite.py {a.test_file} ({a.source}, extracted)"
        results.record(a.json, entries(t, a.source, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
