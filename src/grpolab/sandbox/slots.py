"""Run slots and their uids: at most MAX_PARALLEL runs at once, each slot with a uid of its own.

When grpolab runs as root, slot k runs as an unprivileged uid *leased* machine-wide: an exclusive
flock on LEASE_DIR/<uid>.lock, held for the life of the process (the kernel drops it when the
process dies, however it dies). Every grpolab process on the machine uses the same directory,
whatever its TMPDIR, so two trainers never share a uid. A uid is only leased if no account or group
has it (pwd/grp) and no process runs as it; and only uids this process holds a lease for can be
swept (every process of the uid SIGKILLed) after a run.
"""

from __future__ import annotations

import fcntl
import grp
import logging
import os
import pwd
import queue
import threading
import time

log = logging.getLogger(__name__)

LEASE_DIR = "/run/grpolab/sandbox-uids"
UID_BASE = 61000  # slot uids are leased from [UID_BASE, UID_BASE + UID_SPAN)
UID_SPAN = 4096
NOBODY = 65534


def pids_of_uid(uid: int) -> list[int]:
    """Processes whose real uid is `uid` (read from /proc)."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                for line in f:
                    if line.startswith("Uid:"):
                        if int(line.split()[1]) == uid:
                            pids.append(int(name))
                        break
        except (OSError, ValueError):
            continue
    return pids


def uid_is_unused(uid: int) -> bool:
    """True if no account and no group has this id (a uid grpolab may take for a slot)."""
    for lookup in (pwd.getpwuid, grp.getgrgid):
        try:
            lookup(uid)
            return False
        except KeyError:
            pass
    return True


class Slots:
    """A bounded set of run slots; slot k runs as a uid leased to this process alone."""

    def __init__(self, n: int, lease_dir: str = LEASE_DIR, base: int = UID_BASE, span: int = UID_SPAN) -> None:
        self.n = n
        self.lease_dir, self.base, self.span = lease_dir, base, span
        self._q: queue.Queue[int] = queue.Queue()
        for k in range(n):
            self._q.put(k)
        self._uids: dict[int, int] = {}
        self._locks: dict[int, int] = {}
        self._lock = threading.Lock()

    def acquire(self, timeout_s: float | None = None) -> int | None:
        """A free slot, waiting for one at most timeout_s (None: as long as it takes); None if none freed."""
        try:
            return self._q.get(timeout=timeout_s) if timeout_s is not None else self._q.get()
        except queue.Empty:
            return None

    def release(self, k: int) -> None:
        self._q.put(k)

    def leased(self) -> list[int]:
        """The uids this process holds leases for."""
        return sorted(self._uids.values())

    def uid(self, k: int) -> int:
        """The uid leased for slot k (leasing one on first use)."""
        with self._lock:
            if k not in self._uids:
                self._uids[k] = self._lease()
            return self._uids[k]

    def _lease(self) -> int:
        try:
            os.makedirs(self.lease_dir, mode=0o700, exist_ok=True)
        except OSError as e:
            raise OSError(f"sandbox: cannot create the machine-wide uid lease directory {self.lease_dir}: {e}") from e
        taken = set(self._uids.values())
        for uid in range(self.base, self.base + self.span):
            if uid in taken or not uid_is_unused(uid):
                continue
            fd = os.open(os.path.join(self.lease_dir, f"{uid}.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            if pids_of_uid(uid):  # someone runs as it: not ours to take (nor to kill)
                log.warning("sandbox: uid %d has running processes but no grpolab lease; skipping it", uid)
                os.close(fd)
                continue
            self._locks[uid] = fd
            return uid
        raise OSError(f"no free sandbox uid in [{self.base}, {self.base + self.span})")

    def sweep(self, uid: int, deadline_s: float = 5.0) -> bool:
        """SIGKILL every process of `uid`, a uid this process leased; True once none is left.

        Raises ValueError for any other uid: grpolab never kills processes it cannot prove are its own.
        """
        if uid not in self._locks:
            raise ValueError(f"sandbox: refusing to sweep uid {uid}: not leased by this process")
        end = time.monotonic() + deadline_s
        while True:
            pids = pids_of_uid(uid)
            if not pids:
                return True
            for pid in pids:
                try:
                    os.kill(pid, 9)
                except (ProcessLookupError, PermissionError):
                    pass
            if time.monotonic() > end:
                log.error("sandbox: %d processes of uid %d survive SIGKILL", len(pids), uid)
                return False
            time.sleep(0.01)


MAX_PARALLEL = max(1, os.cpu_count() or 1)
SLOTS = Slots(MAX_PARALLEL)


def sandbox_uids() -> list[int]:
    """The uids this process has leased for its sandbox slots so far."""
    return SLOTS.leased()


__all__ = [
    "LEASE_DIR",
    "MAX_PARALLEL",
    "NOBODY",
    "SLOTS",
    "UID_BASE",
    "Slots",
    "pids_of_uid",
    "sandbox_uids",
    "uid_is_unused",
]
