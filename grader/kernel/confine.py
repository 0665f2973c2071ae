"""Stage C of a submission's sandbox: the student's kernel, confined before any of its code runs.

Resource limits, a session keyring of its own, every capability dropped for good (no_new_privs, empty
bounding set), the seccomp filter (grader/kernel/seccomp.py: no keyring calls, nothing Docker refuses), then
ipykernel: it binds its sockets, PID 1 (grader/kernel/pid1.py) seals the socket
folder, and only then does the kernel serve. Standard library only (ipykernel is imported last).
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import sys

from grader.kernel import seccomp
from grader.kernel.protocol import Handshake, Request
from grader.kernel.syscalls import (
    PR_CAP_AMBIENT,
    PR_CAP_AMBIENT_CLEAR_ALL,
    PR_CAPBSET_DROP,
    PR_SET_DUMPABLE,
    PR_SET_NO_NEW_PRIVS,
    check,
    join_new_session_keyring,
    libc,
    prctl,
)

WORK = "/tmp/work"  # the kernel's home and working folder
OPEN_FILES = 4096  # per process (RLIMIT_NOFILE, soft and hard)

# Per-user kernel quotas. The kernel charges what a sandbox's processes take to their uid in its user namespace
# and, level by level, to the namespace's owner above it (Linux >= 5.14: ucounts): the grading user — root, when
# grading as root. Uncapped, one hand-in could take the grading user's whole quota (128 inotify instances here),
# and every process of that user would be refused meanwhile. Capped in the sandbox's own namespace, a kernel takes
# at most these from the grading user; a few kernels at once leave it most of each (tests/test_hardening_quotas.py).
USER_NS_QUOTAS = {  # /proc/sys/user/* in the sandbox's user namespace, written by its PID 1 (grader/kernel/pid1.py)
    "max_inotify_instances": 8, "max_inotify_watches": 8192,
    "max_fanotify_groups": 0, "max_fanotify_marks": 0,  # fanotify_init is refused by the seccomp filter anyway
    # nothing may make a namespace (seccomp refuses it too); the sandbox's own were made before
    **{f"max_{kind}_namespaces": 0 for kind in ("user", "ipc", "mnt", "net", "pid", "uts", "cgroup", "time")},
}
QUOTA_RLIMITS = (  # charged the same way, checked against the limit of the process they are charged to
    ("RLIMIT_SIGPENDING", 256),  # signals queued (sigqueue, POSIX timers); the host's default is ~ 96000
    ("RLIMIT_MSGQUEUE", 128 * 1024),  # bytes of POSIX message queues (one with the default attributes, 10 of
    # 8 KiB, takes about 81 KiB); the host's default is 800 KiB
    ("RLIMIT_MEMLOCK", 64 * 1024),  # locked System V memory (SHM_LOCK) and mlock; Docker's default
)


# System V IPC lives in the sandbox's own IPC namespace, whose limits are its own and start at the host's defaults
# (32000 semaphore sets of 32000 semaphores; 32000 message queues): kernel memory no process holds, about 72 bytes a
# semaphore (800 sets of 32000 held 1.8 GiB) and 64 a message, even an empty one. The watchdog counts them
# (grader/kernel/memwatch.py); these bound them besides. Linux lets only the namespace's uid 0 write them, and the
# sandbox maps none, so the host's root: written by a root grader's sandbox (grader/kernel/newroot.py) before it
# becomes nobody. Under a non-root grader they keep the host's defaults and only the watchdog's count holds them.
IPC_NS_LIMITS = {  # /proc/sys/kernel/*
    "sem": "250 8192 32 32",  # per set, in all, operations per semop, sets
    "msgmni": "32", "msgmnb": "16384",  # queues; bytes (and messages) per queue, the default
}  # shared memory segments keep the defaults: each counts at its pages


def cap_ipc_limits(sysctl_kernel: str) -> None:
    """Write `IPC_NS_LIMITS` into `sysctl_kernel` (the sandbox's /proc/sys/kernel) where this Linux lets it."""
    for name, value in IPC_NS_LIMITS.items():
        try:
            with open(os.path.join(sysctl_kernel, name), "w") as f:
                f.write(f"{value}\n")
        except OSError:
            pass


def cap_user_quotas(sysctl_user: str) -> None:
    """Cap what the sandbox may take of the grading user's per-user quotas: the user namespace's own limits in
    `sysctl_user` (its /proc/sys/user, as the namespace's owner, which may write them), and the resource limits
    charged the same way, for this process and every one it starts. A limit this Linux has no file for is skipped;
    one it refuses to set is an error: the sandbox is not built."""
    for name, value in USER_NS_QUOTAS.items():
        path = os.path.join(sysctl_user, name)
        if os.path.exists(path):
            with open(path, "w") as f:
                f.write(f"{value}\n")
    for name, value in QUOTA_RLIMITS:
        resource.setrlimit(getattr(resource, name), (value, value))


# Each TCP socket's buffers may grow to the last of these (bytes; min, default, max): the host's 32 MiB let 240
# loopback connections hold 917 MiB of its TCP memory in review faster than a watch sees. Per network namespace.
TCP_BUFFERS = {"tcp_rmem": "4096 131072 262144", "tcp_wmem": "4096 16384 262144"}


def cap_socket_buffers(sysctl_ipv4: str) -> None:
    """Cap each TCP socket's buffers in the sandbox's network namespace (`sysctl_ipv4`: its /proc/sys/net/ipv4, as
    the namespace's owner, which may write them). A file this Linux lacks is skipped; one it refuses is an error."""
    for name, value in TCP_BUFFERS.items():
        path = os.path.join(sysctl_ipv4, name)
        if os.path.exists(path):
            with open(path, "w") as f:
                f.write(f"{value}\n")


def drop_privileges() -> None:
    """No capability, now or after any exec (empty bounding set, no_new_privs)."""
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    for cap in range(last + 1):
        prctl(PR_CAPBSET_DROP, cap)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    data = (ctypes.c_uint32 * 6)()
    check(libc.capset(header, data), "capset")
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    prctl(PR_SET_DUMPABLE, 1)  # its own /proc files belong to it again


def _new_session_keyring() -> None:
    """A kernel keyring session of its own: keys it adds die with it instead of waiting for the next kernel."""
    try:
        join_new_session_keyring()
    except OSError:
        pass  # fails only where keys are not built in


def _set_limits(request: Request) -> None:
    limits = request["limits"]
    for kind, soft, hard in ((resource.RLIMIT_AS, limits["address_space_bytes"], None),
                             (resource.RLIMIT_FSIZE, limits["file_bytes"], None),
                             (resource.RLIMIT_NPROC, limits["processes"], None),
                             (resource.RLIMIT_CPU, limits["cpu_seconds"], limits["cpu_seconds"] + 5),
                             (resource.RLIMIT_CORE, 0, None),
                             # descriptors: each can hold a pipe's buffer, which no count of the watchdog sees
                             (resource.RLIMIT_NOFILE, OPEN_FILES, None)):
        resource.setrlimit(kind, (soft, soft if hard is None else hard))


def _check_unprivileged() -> None:
    """The probe's question (grader.kernel.sandbox.why_unavailable): does the sandbox stand, hold no privilege,
    and filter system calls?"""
    with open("/proc/self/status") as f:
        status = f.read()
    if "CapEff:\t0000000000000000" not in status:
        raise SystemExit("capabilities left after dropping them")
    if "Seccomp:\t2" not in status:
        raise SystemExit("no seccomp filter on the kernel")
    raise SystemExit(0)


def run_c(request: Request, ready_w: int, ack_r: int) -> None:
    """C: the kernel. Limits and privileges first; then ipykernel, which binds its sockets; then student code."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.setsid()
    os.umask(0o022)
    os.environ.clear()
    os.environ.update(request["env"], HOME=WORK, MPLCONFIGDIR=f"{WORK}/.matplotlib", USER="student",
                      LOGNAME="student")
    _set_limits(request)
    _new_session_keyring()
    drop_privileges()
    seccomp.load()
    os.makedirs(WORK, exist_ok=True)
    os.chdir(WORK)
    if request.get("probe"):
        _check_unprivileged()
    # the history database in memory: one file less to create, nothing kept. Parent 1: the sandbox's own init
    # (pid1.py) ends the kernel, so no poller, and no "connect another client" banner on the grader's terminal.
    sys.argv = ["ipykernel_launcher", "-f", request["connection_file"], "--HistoryManager.hist_file=:memory:",
                "--IPKernelApp.parent_handle=1"]
    from ipykernel.kernelapp import IPKernelApp

    app = IPKernelApp.instance()
    app.initialize(sys.argv[1:])
    os.write(ready_w, Handshake.LISTENING.value)
    os.close(ready_w)
    if os.read(ack_r, 1) != Handshake.SEALED.value:
        raise RuntimeError("the sandbox did not seal the socket folder")
    os.close(ack_r)
    app.start()
