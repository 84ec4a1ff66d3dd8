"""The CUDA path in one run: tests, a real `grpolab train`, grpolab vs TRL, MFU, static-cache decode.

    bash benchmarks/gpu.sh [--dry-run] [--out DIR] [--budget-s 480] [--only PART ...]

(gpu.sh installs the wheels of .whl/ first, when there are any, then runs this file.) Parts, in order,
each in processes of its own with a time limit, so that one that fails or hangs is reported and the
next still runs:

  env         versions, the device, whether TRL and `grpolab bench` are there
  matmul      the bf16 matmul rate, torch.matmul of 8192 x 8192 on the GPU (the MFU denominator)
  cuda_tests  pytest -m cuda over the test files that carry the marker (tests/test_cuda.py, ...)
  models      random-weight model directories from benchmarks/configs/ (SmolLM2-135M and
              Qwen2.5-0.5B shapes) with the SmolLM2 tokenizer of src/grpolab/data/smollm2-tokenizer
  train       `grpolab train model=SMOLLM2_DIR device=cuda steps=5 ...`, end to end, checkpoint included
  memory      benchmarks/memory_plan.py --set gpu: `grpolab plan`'s predicted peak per phase against
              torch.cuda.max_memory_allocated for a real step of each configuration
  bench       `grpolab bench --model QWEN_DIR --prompts 16 --G 8 --new-tokens 256 --precision bf16
              --device cuda --against trl --steps 4` (--against none when TRL is missing), and the MFU
              of each side's update phase
  decode      grpolab's decode vs transformers' static KV cache, eager and torch.compile'd
              (mode="reduce-overhead"), tokens/s
  update      grpolab's update phase alone on the Qwen shape: s, trained tokens/s, MFU (last: the
              bench part measures the update's MFU too, so this one may fall to the time budget)

MFU = 6 N T / t / R: N parameters (a tied LM head counted once), T trained tokens (completion tokens of
the sequences the update computes), t the update phase's seconds, R the measured bf16 matmul rate.

The Qwen shape keeps its 151936 embedding rows with the 49152-token SmolLM2 tokenizer: prompts use ids
below 49152; a sampled id above the tokenizer's range decodes to nothing (tokenizers skips unknown ids;
the dry run checks that with a 50000-row model), so nothing is restricted.

--dry-run: the same parts on the CPU with 2-layer models (benchmarks/configs/tiny-*.json) and tiny
sizes, in seconds, for tests/test_gpu_script.py. Everything goes to OUT/gpu_check.json and
OUT/gpu_check.log (OUT: --out, else $OUT, else runs/gpu-check); the summary is printed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "benchmarks" / "configs"
WORKERS = ROOT / "benchmarks" / "gpu_workers.py"
PARTS = ("env", "matmul", "cuda_tests", "models", "train", "memory", "bench", "decode", "update")

FULL = {
    "device": "cuda",
    "models": {"smollm2": "smollm2-135m.json", "qwen": "qwen2.5-0.5b.json"},
    "matmul": {"n": 8192, "dtype": "bfloat16", "warmup": 3, "reps": 10},
    "train": [
        "steps=5",
        "batch_size=64",
        "G=8",
        "max_new_tokens=64",
        "micro_batch=32",
        "eval_size=16",
        "save_every=5",
        "progress=false",
    ],
    "bench": {"prompts": 16, "G": 8, "new_tokens": 256, "steps": 4},
    "update": {"prompts": 16, "G": 8, "new_tokens": 256, "micro_batch": 16, "reps": 3},
    "decode": {"prompts": 16, "G": 8, "new_tokens": 256, "reps": 2},
    # seconds per part; the whole run stays under --budget-s (8 minutes by default)
    "limits": {
        "matmul": 60,
        "cuda_tests": 120,
        "models": 90,
        "train": 150,
        "memory": 180,
        "bench": 300,
        "update": 120,
        "decode": 180,
    },
}
DRY = {
    "device": "cpu",
    "models": {"smollm2": "tiny-llama.json", "qwen": "tiny-qwen2.json"},
    "matmul": {"n": 256, "dtype": "float32", "warmup": 1, "reps": 2},
    "train": [
        "steps=2",
        "batch_size=4",
        "G=2",
        "max_new_tokens=4",
        "micro_batch=4",
        "eval_size=2",
        "save_every=2",
        "progress=false",
        "report=false",
        "tensorboard=false",
    ],
    "bench": {"prompts": 1, "G": 2, "new_tokens": 4, "steps": 1},
    "update": {"prompts": 2, "G": 2, "new_tokens": 4, "micro_batch": 2, "reps": 1},
    "decode": {"prompts": 2, "G": 2, "new_tokens": 4, "reps": 1},
    # no limit per part: the dry run exercises the script on the CPU, where a part's time says nothing about
    # a GPU; its parts share --budget-s, which tests/test_gpu_script.py derives from the machine's pace
}


class Log:
    """Print and append to OUT/gpu_check.log."""

    def __init__(self, path: Path):
        self.f = open(path, "w")

    def __call__(self, msg: str = "") -> None:
        print(msg, flush=True)
        self.f.write(msg + "\n")
        self.f.flush()


def run_cmd(cmd: list[str], limit: float, log_path: Path, env: dict | None = None) -> tuple[int | None, float]:
    """Run cmd in its own process group, output to log_path; (exit code or None on timeout, seconds)."""
    t = time.perf_counter()
    with open(log_path, "w") as f:
        p = subprocess.Popen(
            cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env or child_env(), start_new_session=True
        )
        try:
            rc = p.wait(timeout=max(1.0, limit))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            rc = None
    return rc, time.perf_counter() - t


def child_env() -> dict:
    env = dict(os.environ)
    parts = [str(ROOT / "src")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


class Check:
    def __init__(self, ns):
        self.dry = ns.dry_run
        self.json = getattr(ns, "json", None)
        self.size = DRY if self.dry else FULL
        self.out = Path(ns.out or os.environ.get("OUT") or ROOT / "runs" / "gpu-check").resolve()
        self.out.mkdir(parents=True, exist_ok=True)
        # model dirs, runs, worker files: gigabytes on the GPU, so never under OUT (only a few small files
        # belong in $OUT); removed at the end unless --keep-work
        self.work = Path(ns.work).resolve() if ns.work else Path(tempfile.mkdtemp(prefix="gpu-check-"))
        self.work.mkdir(parents=True, exist_ok=True)
        self.keep_work = ns.keep_work or bool(ns.work)
        self.deadline = time.monotonic() + ns.budget_s
        self.log = Log(self.out / "gpu_check.log")
        self.res: dict = {
            "dry_run": self.dry,
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "budget_s": ns.budget_s,
            "parts": {},
        }
        self.only = set(ns.only or PARTS)
        self.no_trl = ns.no_trl

    # --- plumbing ---------------------------------------------------------------------------------

    def limit(self, part: str) -> float:
        """The part's seconds: its own limit on a GPU, the budget's remainder on a dry run (which has none)."""
        left = max(1.0, self.deadline - time.monotonic())
        return left if self.dry else min(self.size["limits"].get(part, 60), left)

    def worker(self, name: str, spec: dict, part: str) -> dict:
        """A gpu_workers.py measurement in a process of its own with the part's time limit; on a dry run
        in this process (seconds of Python start-up each, on a small machine)."""
        if self.dry:
            sys.path.insert(0, str(WORKERS.parent))
            import gpu_workers

            gpu_workers.quiet()
            try:
                res = gpu_workers.WORKERS[name](**spec)
            except Exception as e:  # noqa: BLE001 - reported like a worker's failure
                res = {"status": "failed", "error": f"{type(e).__name__}: {e}"}
            if res.get("status") != "ok":
                res.setdefault("reason", res.get("error"))
            return res
        spec_path, out_path = self.work / f"{name}.spec.json", self.work / f"{name}.json"
        spec_path.write_text(json.dumps(spec))
        out_path.unlink(missing_ok=True)
        log_path = self.work / f"{name}.log"
        rc, sec = run_cmd(
            [sys.executable, str(WORKERS), name, str(spec_path), str(out_path)], self.limit(part), log_path
        )
        if rc is None:
            return {"status": "timeout", "reason": f"killed after {sec:.0f} s", "log_tail": tail(log_path)}
        if not out_path.exists():
            return {"status": "failed", "reason": f"exit {rc}, no result", "log_tail": tail(log_path)}
        res = json.loads(out_path.read_text())
        if res.get("status") != "ok":
            res["log_tail"] = tail(log_path)
            res.setdefault("reason", res.get("error"))
        return res

    def save(self) -> None:
        tmp = self.out / ".gpu_check.json.tmp"
        tmp.write_text(json.dumps(self.res, indent=2, default=str) + "\n")
        os.replace(tmp, self.out / "gpu_check.json")

    def run(self) -> int:
        self.log(f"gpu_check: {'dry run (CPU, tiny models)' if self.dry else 'GPU run'}; results in {self.out}")
        for part in PARTS:
            if part not in self.only:
                self.res["parts"][part] = {"status": "skipped", "reason": "not in --only"}
                continue
            if part != "env" and time.monotonic() > self.deadline - 5:
                self.res["parts"][part] = {"status": "skipped", "reason": "the time budget ran out"}
                continue
            self.log(f"--- {part}")
            t = time.perf_counter()
            try:
                r = getattr(self, f"part_{part}")()
            except Exception as e:  # noqa: BLE001 - reported, the next part still runs
                r = {"status": "failed", "reason": f"{type(e).__name__}: {e}"}
            r["wall_s"] = round(time.perf_counter() - t, 2)
            self.res["parts"][part] = r
            self.log(f"    {r['status']} in {r['wall_s']:.1f} s" + (f": {r['reason']}" if r.get("reason") else ""))
            self.save()
        self.res["summary"] = summary_lines(self.res)
        self.save()
        if not self.keep_work:
            shutil.rmtree(self.work, ignore_errors=True)
        self.log("\n=== summary")
        for line in self.res["summary"]:
            self.log(line)
        bad = [p for p, r in self.res["parts"].items() if r["status"] in ("failed", "timeout")]
        bench = self.res["parts"].get("bench", {})
        if self.json and bench.get("status") == "ok":
            results = results_module()
            results.record(self.json, results.from_bench(bench["result"], bench["command"]))
        self.log(
            f"\nwrote {self.out / 'gpu_check.json'} and {self.out / 'gpu_check.log'}"
            + (f"; failed: {', '.join(bad)}" if bad else "")
        )
        return 1 if bad else 0

    # --- parts ------------------------------------------------------------------------------------

    def part_env(self) -> dict:
        import importlib.util

        import torch
        import transformers

        cuda = torch.cuda.is_available()
        r = {
            "status": "ok",
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "cuda_available": cuda,
            "device_name": torch.cuda.get_device_name(0) if cuda else None,
            "trl": _version("trl") if importlib.util.find_spec("trl") else None,
            "peft": _version("peft") if importlib.util.find_spec("peft") else None,
            "commit": _commit(),
        }
        r["bench_help"] = _bench_help()
        r["grpolab_bench"] = r["bench_help"] is not None
        if self.no_trl and r["trl"]:
            r["trl"], r["trl_hidden"] = None, "--no-trl"
        elif r["trl"]:
            try:  # present is not enough: its wheels' dependencies must import with this machine's packages
                import trl  # noqa: F401
            except Exception as e:  # noqa: BLE001
                r["trl"], r["trl_error"] = None, f"TRL is there but does not import: {type(e).__name__}: {e}"[:500]
        try:
            smi = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,memory.total,driver_version,clocks.max.sm", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            r["nvidia_smi"] = smi.stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            r["nvidia_smi"] = None
        self.env = r
        self.log(
            f"    python {r['python']}, torch {r['torch']}, transformers {r['transformers']}, "
            f"device {r['device_name'] or 'CPU'}, trl {r['trl']}, grpolab bench {'yes' if r['grpolab_bench'] else 'MISSING'}"
        )
        if not self.dry and not cuda:
            r.update(status="failed", reason="no CUDA device visible (use --dry-run on a machine without one)")
        return r

    def part_matmul(self) -> dict:
        r = self.worker("matmul", {"device": self.size["device"], **self.size["matmul"]}, "matmul")
        if r["status"] == "ok":
            self.rate = r["flops_per_s"]
            self.log(f"    {r['dtype']} {r['n']}^3: {r['tflops']:.1f} TFLOP/s")
        return r

    def part_cuda_tests(self) -> dict:
        files = sorted(
            str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py") if "mark.cuda" in p.read_text()
        )
        if not files:
            return {"status": "failed", "reason": "no test file carries the cuda marker"}
        log_path = self.out / "cuda_tests.log"
        rc, sec = run_cmd(
            [sys.executable, "-m", "pytest", "-m", "cuda", "-rs", "-p", "no:cacheprovider", *files],
            self.limit("cuda_tests"),
            log_path,
        )
        text = log_path.read_text(errors="replace")
        counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", text)}
        r = {"files": files, "exit_code": rc, "counts": counts, "log_tail": tail(log_path, 15)}
        if rc is None:
            r.update(status="timeout", reason=f"killed after {sec:.0f} s")
        elif rc != 0:
            r.update(status="failed", reason=f"pytest exit {rc}")
        else:
            r["status"] = "ok"
            if counts.get("skipped") and not counts.get("passed"):
                r["note"] = "every CUDA test skipped (no GPU)"
        self.log(f"    {counts}")
        return r

    def part_models(self) -> dict:
        cfgs = {name: str(CONFIGS / f) for name, f in self.size["models"].items()}
        r = self.worker(
            "build", {"configs": cfgs, "out_dir": str(self.work / "models"), "device": self.size["device"]}, "models"
        )
        self.models = r.get("models", {})
        for name, m in self.models.items():
            self.log(
                f"    {name}: {m['params']:,} parameters, vocab {m['vocab_size']} "
                f"(tokenizer {m['tokenizer_size']}), {m['build_s']:.1f} s"
            )
        return r

    def part_train(self) -> dict:
        if "smollm2" not in getattr(self, "models", {}):
            return {"status": "skipped", "reason": "no model (the models part failed)"}
        out = self.work / "train"
        shutil.rmtree(out, ignore_errors=True)
        args = [
            f"model={self.models['smollm2']['dir']}",
            f"device={self.size['device']}",
            f"out={out}",
            *self.size["train"],
        ]
        cmd = [sys.executable, "-m", "grpolab", "train", *args]
        self.log("    grpolab train " + " ".join(args))
        rc, sec = run_cmd(cmd, self.limit("train"), self.out / "train.log")
        r = {
            "command": "grpolab train " + " ".join(args),
            "exit_code": rc,
            "log_tail": tail(self.out / "train.log", 15),
        }
        rows = []
        if (out / "metrics.jsonl").exists():
            rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
        r["steps_logged"] = len(rows)
        if rows:
            keys = (
                "time/step_s",
                "time/generate_s",
                "time/update_s",
                "completion/length_mean",
                "reward/mean",
                "memory/peak_mb",
            )
            r["per_step"] = [{k: row.get(k) for k in ("step", *keys)} for row in rows]
            later = rows[1:] or rows  # the first step carries the warm-up
            bs = _arg(self.size["train"], "batch_size")
            r["s_per_step"] = _mean(x["time/step_s"] for x in later)
            r["rollout_tok_s"] = _mean(
                x["completion/length_mean"] * bs / x["time/generate_s"] for x in later if x.get("time/generate_s")
            )
            r["peak_mb"] = max(x.get("memory/peak_mb") or 0 for x in rows)
        r["checkpoints"] = (
            sorted(p.name for p in (out / "checkpoints").glob("step-*")) if (out / "checkpoints").exists() else []
        )
        steps = _arg(self.size["train"], "steps")
        if rc is None:
            r.update(status="timeout", reason=f"killed after {sec:.0f} s")
        elif rc != 0 or len(rows) != steps:
            r.update(status="failed", reason=f"exit {rc}, {len(rows)} of {steps} steps logged")
        else:
            r["status"] = "ok"
            self.log(
                f"    {len(rows)} steps, {r['s_per_step']:.2f} s/step after the first, "
                f"{r['rollout_tok_s']:.0f} rollout tok/s, peak {r['peak_mb']:.0f} MB"
            )
        return r

    def part_memory(self) -> dict:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        import memory_plan  # each configuration in a process of its own

        limit = self.limit("memory")
        r = memory_plan.run_set(
            "dry" if self.dry else "gpu",
            self.size["device"],
            self.work / "memory-models",
            timeout=limit,
            deadline=time.monotonic() + limit,
        )
        self.log("    " + memory_plan.summary(r))
        return {
            **r,
            "status": "ok" if r["status"] == "ok" else "failed",
            "reason": None if r["status"] == "ok" else f"{r['measured']} of {len(r['rows'])} configurations measured",
        }

    def part_bench(self) -> dict:
        env = getattr(self, "env", {})
        if not env.get("grpolab_bench"):
            self.log("    `grpolab bench` is MISSING from this checkout (grpolab bench --help failed)")
            return {"status": "skipped", "reason": "`grpolab bench` does not exist in this checkout"}
        if "qwen" not in getattr(self, "models", {}):
            return {"status": "skipped", "reason": "no model (the models part failed)"}
        b = self.size["bench"]
        against = "trl" if env.get("trl") else "none"
        args = [
            "--model",
            self.models["qwen"]["dir"],
            "--prompts",
            str(b["prompts"]),
            "--G",
            str(b["G"]),
            "--new-tokens",
            str(b["new_tokens"]),
            "--precision",
            "bf16" if not self.dry else "fp32",
            "--device",
            self.size["device"],
            "--against",
            against,
            "--steps",
            str(b["steps"]),
            "--json-out",
            str(self.work / "bench.json"),
        ]
        helptext = env.get("bench_help") or ""
        if "--rounds" in helptext:
            args += ["--rounds", "1"]  # one process per side: the 8-minute budget
        if against == "trl" and "--trl-precision" in helptext:
            args += ["--trl-precision", "bf16" if not self.dry else "fp32"]
        (self.work / "bench.json").unlink(missing_ok=True)
        self.log("    grpolab bench " + " ".join(args))
        rc, sec = run_cmd(
            [sys.executable, "-m", "grpolab", "bench", *args], self.limit("bench"), self.out / "bench.log"
        )
        r = {
            "command": "grpolab bench " + " ".join(args),
            "against": against,
            "exit_code": rc,
            "log_tail": tail(self.out / "bench.log", 25),
        }
        if against == "none":
            r["trl"] = {
                "status": "skipped",
                "reason": "--no-trl"
                if env.get("trl_hidden")
                else env.get("trl_error")
                or "TRL is not installed (pip install 'grpolab[bench]', or fetch its wheel with bash benchmarks/gpu.sh --fetch-wheels)",
            }
        if rc is None:
            return {**r, "status": "timeout", "reason": f"killed after {sec:.0f} s"}
        if rc != 0 or not (self.work / "bench.json").exists():
            return {**r, "status": "failed", "reason": f"grpolab bench exit {rc}"}
        result = json.loads((self.work / "bench.json").read_text())
        r.update(status="ok", result=result, sides={})
        n_params = self.models["qwen"]["params"]
        rate = getattr(self, "rate", None)
        for name, c in (result.get("configs") or {}).items():
            upd = (c.get("phases_s") or {}).get("update")
            side = {
                k: c.get(k)
                for k in ("precision", "s_per_step", "gen_tok_s", "train_tok_s", "peak_mb", "trained_tokens")
            }
            side["update_s"] = upd
            if rate and upd and c.get("trained_tokens"):
                side["update_mfu"] = 6 * n_params * c["trained_tokens"] / upd / rate
            r["sides"][name] = side
            self.log(
                f"    {name:10} {_fmt(side['s_per_step'], '.2f')} s/step, gen {_fmt(side['gen_tok_s'], '.0f')} tok/s, "
                f"update MFU {_fmt(side.get('update_mfu'), '.1%')}"
            )
        return r

    def part_update(self) -> dict:
        if "qwen" not in getattr(self, "models", {}):
            return {"status": "skipped", "reason": "no model (the models part failed)"}
        spec = {
            "model_dir": self.models["qwen"]["dir"],
            "device": self.size["device"],
            "precision": "fp32" if self.dry else "bf16",
            "rate": getattr(self, "rate", None),
            **self.size["update"],
        }
        r = self.worker("update", spec, "update")
        if r["status"] == "ok":
            self.log(
                f"    {r['update_s']:.3f} s for {r['trained_tokens']} tokens ({r['trained_tok_s']:.0f} tok/s), "
                f"MFU {_fmt(r.get('mfu'), '.1%')}"
            )
        return r

    def part_decode(self) -> dict:
        if "qwen" not in getattr(self, "models", {}):
            return {"status": "skipped", "reason": "no model (the models part failed)"}
        r = self.worker(
            "decode",
            {"model_dir": self.models["qwen"]["dir"], "device": self.size["device"], **self.size["decode"]},
            "decode",
        )
        for name, p in (r.get("paths") or {}).items():
            self.log(
                f"    {name:22} "
                + (
                    f"{p['tok_s']:9.0f} tok/s (first call {p['first_call_s']:.1f} s)"
                    if p["status"] == "ok"
                    else f"{p['status']}: {p.get('reason') or p.get('error')}"
                )
            )
        return r


def summary_lines(res: dict) -> list[str]:
    p = res["parts"]
    out = [f"{name:11} {r['status']}" + (f" ({r['reason']})" if r.get("reason") else "") for name, r in p.items()]
    m = p.get("matmul", {})
    if m.get("status") == "ok":
        out.append(f"matmul rate: {m['tflops']:.1f} TFLOP/s ({m['dtype']}, {m['n']}^3)")
    t = p.get("cuda_tests", {})
    if t.get("counts"):
        out.append(f"CUDA tests: {t['counts']}")
    tr = p.get("train", {})
    if tr.get("s_per_step"):
        out.append(
            f"grpolab train (SmolLM2-135M shape): {tr['s_per_step']:.2f} s/step, "
            f"{tr['rollout_tok_s']:.0f} rollout tok/s, peak {tr['peak_mb']:.0f} MB"
        )
    if p.get("memory", {}).get("rows"):
        out.append("memory plan vs the allocator's peak: " + __import__("memory_plan").summary(p["memory"]))
    for name, s in (p.get("bench", {}).get("sides") or {}).items():
        out.append(
            f"bench {name} (Qwen2.5-0.5B shape): {_fmt(s['s_per_step'], '.2f')} s/step, "
            f"{_fmt(s['gen_tok_s'], '.0f')} gen tok/s, {_fmt(s['train_tok_s'], '.0f')} train tok/s, "
            f"update MFU {_fmt(s.get('update_mfu'), '.1%')}"
        )
    if p.get("bench", {}).get("trl"):
        out.append(f"bench TRL: skipped ({p['bench']['trl']['reason']})")
    u = p.get("update", {})
    if u.get("status") == "ok":
        out.append(
            f"update phase (Qwen shape, {u['precision']}): {u['update_s']:.3f} s, "
            f"{u['trained_tok_s']:.0f} trained tok/s, MFU {_fmt(u.get('mfu'), '.1%')}"
        )
    for name, d in (p.get("decode", {}).get("paths") or {}).items():
        out.append(
            f"decode {name}: "
            + (
                f"{d['tok_s']:.0f} tok/s"
                if d["status"] == "ok"
                else f"{d['status']} ({d.get('reason') or d.get('error', '')[:120]})"
            )
        )
    return out


def _fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _mean(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def _arg(args: list[str], key: str) -> int:
    return int(next(a.split("=", 1)[1] for a in args if a.startswith(key + "=")))


def _bench_help() -> str | None:
    """`grpolab bench --help`'s text, or None when this checkout has no `grpolab bench`."""
    import contextlib
    import io

    sys.path.insert(0, str(ROOT / "src"))
    from grpolab.app.cli import COMMANDS
    from grpolab.app.cli import main as cli_main

    if "bench" not in COMMANDS:
        return None
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
        try:
            rc = cli_main(["bench", "--help"])
        except SystemExit as e:  # argparse's --help
            rc = e.code
    return buf.getvalue() if rc in (0, None) else None


def _version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "present (no metadata)"


def _commit() -> str | None:
    try:
        return (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="the CPU, tiny models and sizes (seconds)")
    ap.add_argument("--out", help="results folder (default $OUT, else runs/gpu-check)")
    ap.add_argument(
        "--work", help="folder for the model dirs and runs (default: a new folder under /tmp, removed at the end)"
    )
    ap.add_argument("--keep-work", action="store_true", help="keep the work folder")
    ap.add_argument("--budget-s", type=float, default=480, help="the whole run's time limit (default 480 s)")
    ap.add_argument(
        "--no-trl",
        action="store_true",
        help="run `grpolab bench --against none` even where TRL is installed (TRL then counts as skipped)",
    )
    ap.add_argument("--only", nargs="+", choices=PARTS, help="run only these parts (env always runs)")
    ap.add_argument("--json", help="append the bench part's result to this JSON-lines file (benchmarks/results.py)")
    ns = ap.parse_args(argv)
    if ns.only:
        ns.only = sorted(set(ns.only) | {"env"})
    return Check(ns).run()


def results_module():
    """benchmarks/results.py, where the shared entry format lives (this file may be loaded from elsewhere)."""
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    import results

    return results


if __name__ == "__main__":
    sys.exit(main())
