"""The few Linux calls the sandbox needs that Python's os module lacks, through libc; standard library only.

Shared by the fork server and the three stages of a submission's sandbox (grader/kernel/forkserver.py).
"""

from __future__ import annotations

import ctypes
import os
import signal

CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC = 0x20000, 0x2000000, 0x4000000, 0x8000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = (
    1, 2, 4, 8, 32, 4096, 16384, 1 << 18)
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 4, 24, 38
PR_SET_CHILD_SUBREAPER, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 36, 47, 4
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
SYS_KEYCTL = {"x86_64": 250, "aarch64": 219, "riscv64": 219, "ppc64le": 271, "s390x": 280}
KEYCTL_JOIN_SESSION_KEYRING = 1
MADV_COLLAPSE = 25  # Linux 6.1+

libc = ctypes.CDLL(None, use_errno=True)


def check(result: int, what: str) -> int:
    """`result` of a libc call, or OSError with errno's message when it failed (< 0)."""
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def prctl(option: int, arg: int = 0) -> None:
    check(libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), f"prctl({option})")


def _bytes(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    check(libc.mount(_bytes(source), _bytes(target), _bytes(fstype), ctypes.c_ulong(flags), _bytes(data)),
          f"mount {target}")


def die_with_parent(parent: int | None = None) -> None:
    """SIGKILL when the parent dies; exit now if it (`parent`, by default the current one) already has."""
    parent = os.getppid() if parent is None else parent
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)


def pivot_root(new_root: str, put_old: str) -> None:
    check(libc.syscall(SYS_PIVOT_ROOT[os.uname().machine], new_root.encode(), put_old.encode()), "pivot_root")


def join_new_session_keyring() -> None:
    """A fresh, anonymous session keyring for this process and its children (keyctl(JOIN_SESSION_KEYRING, NULL))."""
    number = SYS_KEYCTL.get(os.uname().machine)
    if number is None:
        raise OSError(f"no keyctl number known for {os.uname().machine}")
    check(libc.syscall(number, KEYCTL_JOIN_SESSION_KEYRING, None), "keyctl(JOIN_SESSION_KEYRING)")


def collapse_into_huge_pages() -> int:
    """Back this process's private anonymous memory with transparent huge pages (MADV_COLLAPSE, Linux 6.1+), unless
    the machine has them off: a fork then copies one page-table entry per huge page instead of one per page, and an
    exit frees as few. Returns the bytes asked for (0 where nothing was collapsed: an older kernel, THP off)."""
    thp = "/sys/kernel/mm/transparent_hugepage"
    try:
        with open(f"{thp}/enabled") as enabled, open(f"{thp}/hpage_pmd_size") as size:
            if "[never]" in enabled.read():
                return 0
            huge = int(size.read())
    except (OSError, ValueError):
        return 0
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    asked = 0
    with open("/proc/self/maps") as maps:
        regions = [line.split() for line in maps]
    for fields in regions:
        low, high = (int(x, 16) for x in fields[0].split("-"))
        anonymous = len(fields) < 6 or fields[5] == "[heap]"
        if fields[1].startswith("rw") and fields[1][3] == "p" and anonymous:
            start, end = -(-low // huge) * huge, high // huge * huge
            if end > start and libc.madvise(start, end - start, MADV_COLLAPSE) == 0:
                asked += end - start
    return asked
