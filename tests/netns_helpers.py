"""Two "hosts" on one machine for the multi-node tests: two network namespaces joined by a veth pair.

    with TwoHosts() as hosts:               # ip netns add ...; a veth pair, one end in each namespace
        a = hosts.agent(0, [...])           # `ip netns exec NS python -m torch.distributed.run ...`
        b = hosts.agent(1, [...])
    # on exit: every process started here is SIGKILLed (its whole session), then both namespaces deleted

Only the addresses made here are used (10.77.0.1 and 10.77.0.2 on the veth ends, and each namespace's
own loopback): the namespaces have no other interface and no route but 10.77.0.0/24, so nothing they
run can reach any other address. `unavailable()` says why this cannot run (not root, no `ip`, network
namespaces not permitted), for a skip.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Self

ADDRS = ("10.77.0.1", "10.77.0.2")
PORT = 29400  # the c10d rendezvous on host 0's address: a fresh namespace has every port free


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


def unavailable() -> str | None:
    """Why two network namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    if shutil.which("ip") is None:
        return "no `ip` (iproute2) on this machine"
    name = f"grpolab-probe-{os.getpid()}"
    res = _ip("netns", "add", name, check=False)
    if res.returncode != 0:
        return f"`ip netns add` is not permitted here: {res.stderr.strip()[:200]}"
    _ip("netns", "del", name, check=False)
    return None


class TwoHosts:
    """Two network namespaces, one veth pair between them (see the module docstring)."""

    def __init__(self) -> None:
        tag = f"{os.getpid() % 100000}"
        self.ns = (f"grpolab-{tag}-a", f"grpolab-{tag}-b")
        self.dev = (f"gl{tag}a", f"gl{tag}b")  # interface names: at most 15 characters
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> Self:
        try:
            for ns in self.ns:
                _ip("netns", "add", ns)
            _ip(
                "link",
                "add",
                self.dev[0],
                "netns",
                self.ns[0],
                "type",
                "veth",
                "peer",
                "name",
                self.dev[1],
                "netns",
                self.ns[1],
            )
            for ns, dev, addr in zip(self.ns, self.dev, ADDRS):
                _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
                _ip("-n", ns, "link", "set", dev, "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def agent(
        self, host: int, torchrun_args: list[str], script_args: list[str], env: dict, log=None
    ) -> subprocess.Popen:
        """One torchrun agent in host `host`'s namespace (a session of its own, so that it and its
        workers can be killed together, as a lost machine loses them)."""
        cmd = [
            "ip",
            "netns",
            "exec",
            self.ns[host],
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "2",
            "--nproc_per_node",
            "1",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"{ADDRS[0]}:{PORT}",
            "--local-addr",
            ADDRS[host],
            # a lost host counts as gone after 2 missed heartbeats of 1 s (default: 3 of 5 s)
            "--rdzv-conf",
            (
                f"is_host={'true' if host == 0 else 'false'},join_timeout=120,"
                "keep_alive_interval=1,keep_alive_max_attempt=2"
            ),
            *torchrun_args,
            *script_args,
        ]
        env = {**env, "GLOO_SOCKET_IFNAME": self.dev[host]}
        proc = subprocess.Popen(
            cmd, env=env, stdout=log or subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.procs.append(proc)
        return proc

    def host_of(self, pid: int) -> int | None:
        """The host (0 or 1) whose namespace process `pid` runs in."""
        name = _ip("netns", "identify", str(pid), check=False).stdout.strip()
        return self.ns.index(name) if name in self.ns else None

    def kill_host(self, host: int) -> None:
        """SIGKILL every process in host `host`'s namespace (its agent and workers): a machine lost at once."""
        pids = [int(p) for p in _ip("netns", "pids", self.ns[host], check=False).stdout.split()]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for proc in self.procs:
            if proc.pid in pids:
                proc.wait(timeout=30)

    def kill(self, proc: subprocess.Popen) -> None:
        """SIGKILL an agent and everything in its session."""
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)

    def __exit__(self, *exc) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                self.kill(proc)
        for ns in self.ns:
            pids = _ip("netns", "pids", ns, check=False).stdout.split()
            for pid in pids:  # anything left in the namespace (none should be)
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            if pids:
                time.sleep(0.2)
            _ip("netns", "del", ns, check=False)  # deleting a namespace also removes its end of the veth
