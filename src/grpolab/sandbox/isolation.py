"""What this machine lets the sandbox do, and the file system a candidate sees.

`Isolation` is what the probe (grpolab.sandbox.probe_isolation, which needs a real run) found: the
strongest setup that works, tried in order: namespaces (plus an own uid per slot when root, a user
namespace otherwise), then an own uid without namespaces, then `nobody`, then nothing. Whether a
cgroup per slot and a seccomp filter are in force is part of it; anything missing is said loudly,
once (grpolab.sandbox.check_isolation).

`root_plan()` lists what the minimal root holds: the interpreter, its standard library (with
site-packages masked by an empty directory), the shared libraries the interpreter and its
extension modules load (from `ldd`), and /dev/null, /dev/zero, /dev/random, /dev/urandom.
"""

from __future__ import annotations

import glob
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from functools import lru_cache

from grpolab.sandbox import limits
from grpolab.util.fields import ConfigError

log = logging.getLogger(__name__)

DEVICES = ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom")


class SandboxUnavailable(ConfigError):
    """isolation="require" but this OS does not let grpolab build the namespaces."""


@dataclass(frozen=True)
class Isolation:
    """What this machine lets the sandbox do (probed once per process)."""

    namespaces: bool  # pid + net + mount (+ipc, uts) namespaces via unshare, and a minimal root
    user_ns: bool  # namespaces need --user (not root)
    drop_uid: bool  # running as root: each slot gets its own unprivileged uid
    uid_base: int | None
    reason: str = ""
    cgroup: limits.CgroupSupport = limits.CgroupSupport("", reason="not probed")
    seccomp: bool = False

    @property
    def full(self) -> bool:
        """Namespaces, and the candidate is not the real root."""
        return self.namespaces and (self.drop_uid or self.user_ns)

    @property
    def level(self) -> str:
        return "full" if self.full else "reduced"

    @property
    def missing(self) -> list[str]:
        """The layers below full strength that are not in force here, in words."""
        out = []
        if not self.cgroup.kind:
            out.append(self.cgroup.describe())
        if not self.seccomp:
            out.append("NO seccomp filter")
        return out

    def describe(self) -> str:
        parts = ["pid+net+mount namespaces, minimal root" if self.namespaces else "NO namespaces"]
        if self.drop_uid:
            parts.append(
                "nobody (uid 65534)" if self.uid_base == 65534 else f"own uid per slot (leased from {self.uid_base})"
            )
        else:
            parts.append("user namespace" if self.user_ns else "SAME uid as the trainer")
        parts.append(self.cgroup.describe())
        parts.append("seccomp filter" if self.seccomp else "NO seccomp filter")
        return ", ".join(parts) + (f" ({self.reason})" if self.reason else "")


def unshare_cmd(user_ns: bool) -> list[str]:
    path = shutil.which("unshare") or "/usr/bin/unshare"
    cmd = [path]
    if user_ns:
        cmd += ["--user", "--map-root-user"]
    return cmd + ["--pid", "--net", "--mount", "--ipc", "--uts", "--fork", "--kill-child", "--"]


# ============================================================================ the candidate's file system


def interpreter() -> str:
    """The interpreter of the launcher, and so of the candidate (forked from it): this Python."""
    return os.path.realpath(sys.executable)


def world_reachable(path: str) -> bool:
    """True if every directory above `path` is traversable by others and the file is executable."""
    path = os.path.realpath(path)
    d = os.path.dirname(path)
    while True:
        try:
            if not os.stat(d).st_mode & 0o001:
                return False
        except OSError:
            return False
        if d == "/":
            break
        d = os.path.dirname(d)
    try:
        return bool(os.stat(path).st_mode & 0o001)
    except OSError:
        return False


def exec_interpreter(iso: Isolation) -> str | None:
    """Without namespaces, a slot uid may not reach this Python's standard library (e.g. under
    /root): then the candidate execs a world-reachable python3 instead. None: fork is enough."""
    exe = interpreter()
    if iso.namespaces or not iso.drop_uid or world_reachable(exe) and world_reachable(os.__file__):
        return None
    for cand in ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3"):
        if os.path.exists(cand) and world_reachable(cand):
            return os.path.realpath(cand)
    raise OSError(f"no Python interpreter reachable by an unprivileged uid ({exe} is not)")


def _add(path: str, plan: dict, kind: str, depth: int = 0) -> None:
    """Add `path` to the plan, replicating every symlink on the way (so the loader finds it)."""
    if depth > 20:
        raise OSError(f"too many symlinks resolving {path}")
    parts = os.path.abspath(path).strip("/").split("/")
    cur = ""
    for i, part in enumerate(parts):
        cur = f"{cur}/{part}"
        if os.path.islink(cur):
            target = os.readlink(cur)
            plan["links"][cur] = target
            resolved = os.path.normpath(os.path.join(os.path.dirname(cur), target))
            rest = "/".join(parts[i + 1 :])
            _add(os.path.join(resolved, rest) if rest else resolved, plan, kind, depth + 1)
            return
        if i < len(parts) - 1:
            plan["dirs"].add(cur)
    if kind == "tree":
        plan["dirs"].add(cur)
        plan["trees"].add(cur)
    else:
        plan["files"].add(cur)


# The environment the launcher runs in (grpolab.sandbox._run starts it with exactly this). ldd runs in
# it too: the trainer's own LD_PRELOAD / LD_LIBRARY_PATH (vLLM's CPU platform, for one, puts libraries
# of the venv into LD_PRELOAD when it starts an engine) must not add their libraries to the root.
LAUNCHER_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}

# Where the launcher may mount the new root's tmpfs (in its private mount namespace): the first of
# these that is a real directory and holds nothing the root plan bind-mounts from.
ROOT_MOUNTPOINTS = ("/tmp", "/mnt", "/media", "/srv", "/opt", "/var/tmp", "/run", "/dev/shm", "/home", "/boot")


def _shared_libraries(objects: list[str]) -> set[str]:
    """Absolute paths of the shared libraries `objects` load, per ldd (empty if ldd is missing),
    in the launcher's environment (LAUNCHER_ENV), not the trainer's."""
    ldd = shutil.which("ldd")
    if not ldd:
        return set()
    out = set()
    for i in range(0, len(objects), 64):
        try:
            text = subprocess.run(
                [ldd, *objects[i : i + 64]], capture_output=True, text=True, timeout=60, env=dict(LAUNCHER_ENV)
            ).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        for line in text.splitlines():
            for tok in line.split():
                if tok.startswith("/") and not tok.endswith(":") and os.path.exists(tok):
                    out.add(tok)
    return out


@lru_cache(maxsize=4)
def root_plan(exe: str) -> dict:
    """What the minimal root holds for interpreter `exe` (JSON-able; computed once)."""
    base = {
        "base": sys.base_prefix,
        "platbase": sys.base_exec_prefix,
        "installed_base": sys.base_prefix,
        "installed_platbase": sys.base_exec_prefix,
    }
    paths = sysconfig.get_paths(vars=base)
    stdlibs = sorted({os.path.realpath(paths["stdlib"]), os.path.realpath(paths["platstdlib"])})
    plan: dict = {"dirs": set(), "links": {}, "files": set(), "trees": set(), "masks": set()}
    for d in stdlibs:
        _add(d, plan, "tree")
        for name in ("site-packages", "dist-packages"):
            if os.path.isdir(os.path.join(d, name)):
                plan["masks"].add(os.path.join(d, name))
    _add(exe, plan, "file")
    objects = [exe] + sorted(p for d in stdlibs for p in glob.glob(os.path.join(d, "lib-dynload", "*.so")))
    libs = _shared_libraries(objects)
    if not libs:
        raise OSError("cannot list the interpreter's shared libraries (is ldd installed?)")
    for lib in sorted(libs):
        if not any(lib.startswith(d + "/") for d in stdlibs):
            _add(lib, plan, "file")
    for dev in DEVICES:
        if os.path.exists(dev):
            _add(dev, plan, "file")
    plan["dirs"] -= {"/tmp"}
    for f in plan["files"] | set(plan["links"]):
        plan["dirs"].discard(f)
    out = {
        "dirs": sorted(plan["dirs"]),
        "links": sorted(plan["links"].items()),
        "files": sorted(plan["files"]),
        "trees": sorted(plan["trees"]),
        "masks": sorted(plan["masks"]),
    }
    out["mountpoint"] = root_mountpoint(out)
    return out


def _within(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/") or top.startswith(path.rstrip("/") + "/")


def root_mountpoint(plan: dict, candidates: tuple[str, ...] = ROOT_MOUNTPOINTS) -> str:
    """Where the launcher mounts the new root: a host directory that no source of the plan is in
    (mounting over it would hide that source). /tmp unless the interpreter, its libraries or the
    standard library live under /tmp; OSError naming the sources if every candidate holds one."""
    sources = list(plan["files"]) + list(plan["trees"])
    for cand in candidates:
        if os.path.isdir(cand) and not os.path.islink(cand) and not any(_within(s, cand) for s in sources):
            return cand
    raise OSError(
        f"no directory to mount the sandbox's root on: each of {', '.join(candidates)} holds a file "
        f"the root needs ({', '.join(sorted(sources)[:5])}, ...)"
    )


__all__ = [
    "LAUNCHER_ENV",
    "Isolation",
    "SandboxUnavailable",
    "exec_interpreter",
    "interpreter",
    "root_mountpoint",
    "root_plan",
    "unshare_cmd",
    "world_reachable",
]
