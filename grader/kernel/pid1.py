"""Stage B of a submission's sandbox: PID 1 of its PID namespace.

B mounts the namespace's /proc, pivots into the new root, brings up loopback, forks the kernel (grader/kernel/
confine.py), reaps orphans, seals the socket folder once the kernel listens, enforces the memory limit when
no cgroup does (grader/kernel/memwatch.py) and says why the kernel died. When B exits, the kernel kills
every process left in the namespace. Standard library only.
"""

from __future__ import annotations

import fcntl
import os
import select
import signal
import socket
import struct

from grader.kernel import confine
from grader.kernel.memwatch import HostWatch, MemoryWatch
from grader.kernel.protocol import Handshake, Request, SandboxLimits
from grader.kernel.syscalls import (
    MNT_DETACH,
    MS_BIND,
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_RDONLY,
    MS_REC,
    MS_REMOUNT,
    PR_SET_DUMPABLE,
    PR_SET_PDEATHSIG,
    check,
    libc,
    mount,
    pivot_root,
    prctl,
)
from labkit.forking import fork_child

SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 1


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifreq = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s, SIOCGIFFLAGS, ifreq))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


def enter_root(root: str) -> None:
    """A /proc of the new PID namespace, then pivot into `root` and drop the old one."""
    mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    # the namespace's own quotas (no user namespace below this one, a few inotify instances …): what a kernel may
    # take of the grading user's, before /proc/sys turns read-only and the kernel gives up its capabilities
    confine.cap_user_quotas(f"{root}/proc/sys/user")
    confine.cap_socket_buffers(f"{root}/proc/sys/net/ipv4")
    for covered in ("sys", "sysrq-trigger", "irq", "bus"):  # as bubblewrap does: kernel knobs stay read-only
        path = f"{root}/proc/{covered}"
        if os.path.exists(path):
            mount(path, path, None, MS_BIND | MS_REC)
            mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    pivot_root(root, root + "/oldroot")
    os.chdir("/")
    check(libc.umount2(b"/oldroot", MNT_DETACH), "umount /oldroot")
    os.rmdir("/oldroot")
    mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)  # the skeleton itself


class _Output:
    """The kernel's own stdout and stderr (not what cells print: that goes to the grader as messages).

    Passed on to the worker's log up to a limit, then dropped, so a submission cannot fill the disk with it.
    """

    LIMIT = 64 * 1024

    def __init__(self, fd: int) -> None:
        self.fd, self.passed = fd, 0
        os.set_blocking(fd, False)

    def drain(self) -> bool:
        """Pass on what is there; False once no process of the sandbox can write to it any more."""
        try:
            while chunk := os.read(self.fd, 65536):
                if self.passed < self.LIMIT:
                    keep = chunk[:self.LIMIT - self.passed]
                    self.passed += len(keep)
                    os.write(2, keep + (b"\n[sandbox: the kernel's further output is dropped]\n"
                                        if self.passed >= self.LIMIT else b""))
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return False
        return False


def _reap_orphans(kernel: int) -> None:
    """Collect every exited process that was left to PID 1, never the kernel (its status is read last)."""
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None or info.si_pid == kernel:
            return
        os.waitpid(info.si_pid, 0)


def _kill_all() -> None:
    try:
        os.kill(-1, signal.SIGKILL)  # from PID 1: every other process of the namespace
    except ProcessLookupError:
        pass


class _Kernel:
    """The kernel as PID 1 sees it: its pid, the pipes of its handshake, and its own output."""

    def __init__(self, request: Request, closed_in_child: tuple[int, ...]) -> None:
        ready_r, ready_w = os.pipe()
        ack_r, ack_w = os.pipe()
        out_r, out_w = os.pipe()

        def become_kernel() -> None:
            for fd in (*closed_in_child, ready_r, ack_w, out_r):
                os.close(fd)
            os.dup2(out_w, 1)
            os.dup2(out_w, 2)
            os.close(out_w)
            confine.run_c(request, ready_w, ack_r)

        self.pid = fork_child(become_kernel)
        for fd in (ready_w, ack_r, out_w):
            os.close(fd)
        self.pidfd, self.ready, self.ack = os.pidfd_open(self.pid), ready_r, ack_w
        self.output = _Output(out_r)

    def seal(self, folder: str) -> None:
        """The kernel listens: from now on nothing may be written to the socket folder."""
        message = os.read(self.ready, 1)
        os.close(self.ready)
        if message == Handshake.LISTENING.value:
            mount(None, folder, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
            os.write(self.ack, Handshake.SEALED.value)
        os.close(self.ack)


def _watch(kernel: _Kernel, request: Request, watch: MemoryWatch | None, host: HostWatch) -> str:
    """Until the kernel exits ('') or its processes hold more memory, descriptors or socket buffers than they may
    (the reason)."""
    waiting = [kernel.pidfd, kernel.ready, kernel.output.fd]
    while True:
        readable, _, _ = select.select(waiting, [], [], 0.05 if watch else 0.2)
        if kernel.output.fd in readable and not kernel.output.drain():
            waiting.remove(kernel.output.fd)  # closed by every writer: select would report it forever
        if kernel.ready in readable:
            waiting.remove(kernel.ready)
            kernel.seal(request["folder"])
        if kernel.pidfd in readable:
            return ""
        _reap_orphans(kernel.pid)
        if watch and (used := watch.over()):
            return watch.reason(used)
        if reason := host.over():
            return reason


def _cpu_reason(code: int, usage: object, limits: SandboxLimits) -> str:
    """The CPU limit's name when it ended the kernel: SIGXCPU at the soft limit (RLIMIT_CPU is what sends it), or
    SIGKILL once its CPU time reached the limit (the hard limit, should SIGXCPU not end it)."""
    cpu = getattr(usage, "ru_utime", 0.0) + getattr(usage, "ru_stime", 0.0)
    if code == -signal.SIGXCPU or (code == -signal.SIGKILL and cpu >= limits["cpu_seconds"] - 0.5):
        return f"CPU time limit: {limits['cpu_seconds']} s"
    return ""


def run_b(request: Request, root: str, report_w: int, alive_r: int) -> int:
    """B: PID 1. Finish the sandbox, start the kernel, then reap and watch until the kernel exits."""
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if select.select([alive_r], [], [], 0)[0]:  # A is already gone
        return 1
    prctl(PR_SET_DUMPABLE, 0)  # the kernel has the same uid: it must not read or trace PID 1
    enter_root(root)
    socket.sethostname("sandbox")
    _loopback_up()
    watch = MemoryWatch(request["limits"]["memory_bytes"]) if request["watchdog"] else None
    kernel = _Kernel(request, closed_in_child=(report_w, alive_r))
    host = HostWatch()
    reason = _watch(kernel, request, watch, host)
    _kill_all()
    _, status, usage = os.wait4(kernel.pid, 0)
    kernel.output.drain()
    code = os.waitstatus_to_exitcode(status)
    reason = reason or _cpu_reason(code, usage, request["limits"])
    if reason:
        os.write(report_w, reason.encode())
    os.close(report_w)
    return code if code >= 0 else 128 - code
