"""The memory limit where no cgroup enforces it: the sandbox's PID 1 adds up what the submission holds.

Standard library only: it runs in the sandbox's PID 1 (grader/kernel/pid1.py).
"""

from __future__ import annotations

import os
import time


def _tasks() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and p != "1"]


def _anon_bytes(pid: int, source: str = "status") -> int:
    """Anonymous and shared memory of one process: resident (quick, an upper bound) or proportional (smaps)."""
    keys = ("RssAnon:", "RssShmem:") if source == "status" else ("Pss_Anon:", "Pss_Shmem:")
    total = 0
    try:
        with open(f"/proc/{pid}/{source}") as f:
            for line in f:
                if line.startswith(keys):
                    total += int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return total


def _memfd_bytes(pids: list[int]) -> int:
    """Memory in memfd files any of `pids` holds open (each file once): it belongs to no process's resident set."""
    seen: dict[tuple[int, int], int] = {}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            path = f"/proc/{pid}/fd/{fd}"
            try:
                if os.readlink(path).startswith("/memfd:"):
                    info = os.stat(path)
                    seen[(info.st_dev, info.st_ino)] = info.st_blocks * 512
            except OSError:
                continue
    return sum(seen.values())


def _sysv_bytes() -> int:
    """System V shared memory no process has attached (attached segments count as the processes' memory),
    and message queues: they live in the namespace, not in any process."""
    total = 0
    for table, column, attached in (("shm", "rss", "nattch"), ("msg", "cbytes", None)):
        try:
            with open(f"/proc/sysvipc/{table}") as f:
                header = f.readline().split()
                for line in f:
                    row = dict(zip(header, line.split()))
                    if attached is None or row.get(attached) == "0":
                        total += int(row.get(column, 0))
        except (OSError, ValueError):
            pass
    return total


def size_text(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


class MemoryWatch:
    """What the namespace's processes hold together, checked against the limit.

    Counted: anonymous and shared memory of every process (pages shared with the fork server, torch
    imported once, in proportion: their resident size first, cheap and never less, and only above the
    limit the proportional size), System V segments and message queues, and memfd files (their
    descriptors are looked at every half second). Files in /tmp and /dev/shm are bounded by those
    mounts' sizes instead.
    """

    FD_SCAN_S = 0.5

    def __init__(self, limit: int) -> None:
        self.limit, self.memfd, self.scanned = limit, 0, 0.0

    def over(self) -> int:
        """0, or the bytes held together when that is above the limit."""
        pids = _tasks()
        if time.monotonic() - self.scanned > self.FD_SCAN_S:
            self.memfd, self.scanned = _memfd_bytes(pids), time.monotonic()
        fixed = _sysv_bytes() + self.memfd
        if fixed + sum(_anon_bytes(p) for p in pids) <= self.limit:
            return 0
        used = fixed + sum(_anon_bytes(p, "smaps_rollup") for p in pids)
        return used if used > self.limit else 0
