"""Run untrusted Python (model-written code) against tests, and grade it in the parent.

One file per layer (docs/security.md has the table of what each guarantees):

- `slots`     at most MAX_PARALLEL runs at once; machine-wide uid leases; sweeping leftovers.
- `isolation` what the machine allows (`Isolation`), the minimal root file system.
- `limits`    SandboxConfig, rlimits, a cgroup per slot, the seccomp filter.
- `launcher`  the command the parent starts and the trusted init inside the namespaces.
- `channel`   candidate <-> checker <-> parent protocol, budgeted decoding, the pipe pump.
- `grading`   TestCase, SandboxResult, judging results in the parent.

This module ties them into one run (`run_tests`), a bounded pool (`run_many`), and the probe of
what the machine allows (`probe_isolation`, once, with a harmless program; `check_isolation` warns
or refuses).
`isolation="require"` refuses to run when namespaces are unavailable; "best_effort" warns once,
prominently, and runs with reduced isolation.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from grpolab.sandbox import channel, grading, isolation, launcher, limits, slots
from grpolab.sandbox.grading import SandboxResult, TestCase, literal_test
from grpolab.sandbox.isolation import (
    Isolation,
    SandboxUnavailable,
    exec_interpreter,
    interpreter,
    root_plan,
    unshare_cmd,
)
from grpolab.sandbox.limits import ISOLATION_MODES, SandboxConfig
from grpolab.sandbox.slots import MAX_PARALLEL, NOBODY, SLOTS, pids_of_uid, sandbox_uids
from grpolab.util.procs import kill_process_group
from grpolab.util.values import plain_equal

log = logging.getLogger(__name__)

PARENT_EXTRA_S = 0.0  # the parent kills at timeout_s + this (tests raise it to exercise the init's watchdog)


def _run(
    code: str,
    tests: Sequence[TestCase],
    cfg: SandboxConfig,
    iso: Isolation,
    *,
    setup: str = "",
    check_setup: str = "",
    want_values: bool = False,
    deadline: float | None = None,
):
    """One run under a given isolation (internal; run_tests picks the isolation). `deadline`
    (time.monotonic()) bounds the wait for a slot and the run itself."""
    slot = SLOTS.acquire(None if deadline is None else max(0.0, deadline - time.monotonic()))
    if slot is None:
        result = SandboxResult(
            passed=[False] * len(tests),
            details=["no sandbox slot before the deadline"] * len(tests),
            timed_out=True,
            isolation=iso.describe(),
            no_slot=True,
        )
        return (result, []) if want_values else result
    workdir = None
    uid = None
    t0 = time.monotonic()
    try:
        if iso.drop_uid and iso.uid_base is not None:
            uid = NOBODY if iso.uid_base == NOBODY else SLOTS.uid(slot)
        if not iso.namespaces:
            workdir = tempfile.mkdtemp(prefix="grpolab-sbx-")
            if uid is not None:
                os.chown(workdir, uid, uid)
        rl = cfg.rlimits()
        if uid is None and os.geteuid() != 0:
            rl["nproc"] += len(pids_of_uid(os.getuid()))  # NPROC counts all our processes
        r_fd, w_fd = os.pipe()
        lcfg = launcher.launcher_config(
            exec_python=exec_interpreter(iso),
            plan=root_plan(interpreter()) if iso.namespaces else None,
            uid=uid,
            workdir=workdir,
            limits=rl,
            res_fd=w_fd,
            wall_s=cfg.timeout_s + launcher.WATCHDOG_GRACE_S,
            cgroups=limits.slot_cgroup(slot, cfg, iso.cgroup) if uid not in (None, NOBODY) else [],
            seccomp=limits.seccomp_program() if iso.seccomp else None,
            tmpfs_mb=cfg.tmpfs_mb,
            tmpfs_inodes=cfg.tmpfs_inodes,
        )
        cmd = launcher.launcher_command(lcfg, unshare_cmd(iso.user_ns) if iso.namespaces else None)
        job = grading.encode_job(code, tests, setup, check_setup)
        try:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(w_fd,),
                start_new_session=True,
                close_fds=True,
                env=dict(isolation.LAUNCHER_ENV),
                cwd="/",
            )
        finally:
            os.close(w_fd)
        try:
            end = t0 + cfg.timeout_s + PARENT_EXTRA_S
            out, err, res, timed_out, overflow = channel.pump(
                proc, job, r_fd, end if deadline is None else min(end, deadline), cfg.max_output_bytes
            )
        finally:
            if not kill_process_group(proc):
                log.error("sandbox: launcher %d did not die after SIGKILL", proc.pid)
            for f in (proc.stdin, proc.stdout, proc.stderr):
                try:
                    f.close()
                except OSError:
                    pass
            os.close(r_fd)
        records, load_error, tampered = grading.parse_results(res, len(tests))
        passed, details, bad = grading.grade(tests, records)
        tampered = tampered or overflow or bad
        if tampered:
            passed = [False] * len(tests)
            details = ["result channel tampered with"] * len(tests) if not bad else details
        result = SandboxResult(
            passed=passed,
            details=details,
            stdout=out.decode("utf-8", "replace"),
            stderr=err.decode("utf-8", "replace"),
            returncode=proc.returncode,
            timed_out=timed_out,
            wall_s=time.monotonic() - t0,
            isolation=iso.describe(),
            load_error=load_error,
            tampered=tampered,
        )
        if want_values:
            return result, grading.decoded_values(tests, records)
        return result
    finally:
        if uid is not None and uid != NOBODY:
            SLOTS.sweep(uid)  # with a PID namespace nothing is left; without one this kills escapees
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
        SLOTS.release(slot)


# ============================================================================ probing (needs real runs)


_probe_lock = threading.Lock()
_probe_result: Isolation | None = None
_probe_error: SandboxUnavailable | None = None
_warned = False


def _probe_candidate(iso: Isolation) -> tuple[bool, str]:
    """Run a harmless program under `iso`; True if it worked and reported the expected isolation."""
    code = (
        "import os, resource, socket\n"
        "def probe():\n"
        "    try:\n"
        "        socket.create_connection(('1.1.1.1', 53), timeout=0.5).close(); net = True\n"
        "    except OSError:\n"
        "        net = False\n"
        "    return [os.getppid(), os.getuid(), resource.getrlimit(resource.RLIMIT_NPROC)[0], net,\n"
        "            os.path.exists('/proc/1')]\n"
    )
    cfg = SandboxConfig(timeout_s=20.0, cpu_s=10)
    try:
        res, values = _run(code, [TestCase("call", fn="probe")], cfg, iso, want_values=True)
    except OSError as e:
        return False, str(e)
    if iso.namespaces and launcher.ROOT_ERROR in res.stderr:
        # The kernel gave the namespaces but grpolab could not build the root: a fault of this
        # installation, never a reason to run model-written code with less isolation.
        line = next(x for x in res.stderr.splitlines() if launcher.ROOT_ERROR in x)
        raise SandboxUnavailable(
            f"{line.strip()}. The namespaces work on this machine, so grpolab refuses to fall back to running "
            "model-written code without them; the root plan is grpolab.sandbox.isolation.root_plan() "
            "(see docs/security.md)."
        )
    if not values or not isinstance(values[0], list):
        return False, (res.load_error or res.stderr.strip()[-300:] or f"exit code {res.returncode}")
    ppid, uid, nproc, net, host_proc = values[0]
    if iso.namespaces and (ppid != 1 or net or host_proc):  # the candidate's parent is the namespace's init
        return False, (
            f"namespaces not effective (parent pid {ppid}, network {'reachable' if net else 'cut'}, "
            f"host /proc {'visible' if host_proc else 'hidden'})"
        )
    if iso.drop_uid and uid == 0:
        return False, "could not drop root"
    return True, ""


def probe_isolation(force: bool = False) -> Isolation:
    """Find the strongest isolation this machine allows (cached; `force` re-probes).

    SandboxUnavailable (whatever the isolation mode) when the namespaces work but the launcher
    could not build the minimal root: weaker isolation is for machines without namespaces, not a
    silent fallback for a root that failed to build."""
    global _probe_result, _probe_error
    with _probe_lock:
        if _probe_error is not None and not force:
            raise _probe_error
        if _probe_result is not None and not force:
            return _probe_result
        _probe_error = None
        root = os.geteuid() == 0
        have_unshare = shutil.which("unshare") is not None and sys.platform.startswith("linux")
        cg = limits.cgroup_support() if root else limits.CgroupSupport("", reason="not root: cannot create cgroups")
        sec = limits.seccomp_program() is not None
        reasons, candidates = [], []
        if have_unshare:
            candidates.append(Isolation(True, not root, root, slots.UID_BASE if root else None, cgroup=cg, seccomp=sec))
        else:
            reasons.append("the `unshare` tool (util-linux) is not installed")
        if root:
            candidates.append(Isolation(False, False, True, slots.UID_BASE, cgroup=cg, seccomp=sec))
            candidates.append(Isolation(False, False, True, 65534, cgroup=cg, seccomp=sec))
        candidates.append(Isolation(False, False, False, None, seccomp=sec))
        chosen = candidates[-1]
        for iso in candidates:
            try:
                ok, why = _probe_candidate(iso)
            except SandboxUnavailable as e:
                _probe_error = e
                log.error("%s", e)
                raise
            if ok:
                chosen = iso
                break
            reasons.append(f"{iso.describe()}: {why}")
        _probe_result = Isolation(
            chosen.namespaces,
            chosen.user_ns,
            chosen.drop_uid,
            chosen.uid_base,
            reason="; ".join(reasons) if not chosen.full else "",
            cgroup=chosen.cgroup,
            seccomp=chosen.seccomp,
        )
        return _probe_result


def check_isolation(mode: str) -> Isolation:
    """Probe; raise SandboxUnavailable under "require" if isolation is reduced, else warn once.

    Full isolation without a cgroup or a seccomp filter is accepted under both modes, with the
    same one-time warning naming what is missing.
    """
    global _warned
    iso = probe_isolation()
    if iso.full and not iso.missing:
        return iso
    if iso.full:
        msg = (
            "grpolab sandbox: full isolation, but WITHOUT "
            + " and ".join(iso.missing)
            + f": {iso.describe()}. Memory of a run is bounded per process only; see docs/security.md."
        )
    else:
        msg = (
            "grpolab sandbox: REDUCED ISOLATION. Model-written code will run without "
            f"PID/network/mount namespaces or without dropping privileges: {iso.describe()}. "
            "Set sandbox isolation: require to refuse instead."
        )
        if mode == "require":
            raise SandboxUnavailable(
                msg.replace(
                    "Set sandbox isolation: require to refuse instead.",
                    "isolation: require refuses to run code like this.",
                )
            )
    if not _warned:
        _warned = True
        banner = "!" * 100
        print(f"\n{banner}\n{msg}\n{banner}\n", file=sys.stderr, flush=True)
        log.warning(msg)
    return iso


def run_tests(
    code: str,
    tests: Sequence[TestCase],
    config: SandboxConfig | None = None,
    *,
    setup: str = "",
    check_setup: str = "",
    deadline: float | None = None,
) -> SandboxResult:
    """Run `code` (after `setup`) in the sandbox and grade it against `tests`.

    `check_setup` is the task's own trusted code (helpers its check code uses), run in the
    checker's namespace before the first test. `deadline` (a time.monotonic() value, optional):
    the run waits for a slot only until then (else it returns with `no_slot` and `timed_out`, the
    code never run) and is killed then if still running, so a caller that gives up at its
    deadline leaves no run behind it holding a slot.
    """
    cfg = (config or SandboxConfig()).validate()
    iso = check_isolation(cfg.isolation)
    if not tests:
        return SandboxResult(passed=[], details=[], isolation=iso.describe())
    return _run(code, tests, cfg, iso, setup=setup, check_setup=check_setup, deadline=deadline)


def run_many(
    jobs: Sequence[tuple[str, Sequence[TestCase]]],
    config: SandboxConfig | None = None,
    workers: int | None = None,
    setup: str = "",
) -> list[SandboxResult]:
    """Run several candidates on a bounded pool (at most MAX_PARALLEL at once)."""
    cfg = (config or SandboxConfig()).validate()
    check_isolation(cfg.isolation)
    n = max(1, min(workers or MAX_PARALLEL, MAX_PARALLEL))
    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="grpolab-sandbox") as ex:
        return list(ex.map(lambda job: run_tests(job[0], job[1], cfg, setup=setup), jobs))


__all__ = [
    "ISOLATION_MODES",
    "MAX_PARALLEL",
    "Isolation",
    "SandboxConfig",
    "SandboxResult",
    "SandboxUnavailable",
    "TestCase",
    "check_isolation",
    "literal_test",
    "plain_equal",
    "probe_isolation",
    "run_many",
    "run_tests",
    "sandbox_uids",
    # the layers, for tests and audits
    "channel",
    "grading",
    "isolation",
    "launcher",
    "limits",
    "slots",
]
