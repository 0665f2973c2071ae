"""The grading sandbox, built afresh for every submission by a warm process that has torch imported.

`grader.kernel.sandbox.ForkServer` starts this module (`python -m grader.kernel.forkserver FD`, an ordinary
process of the grader's user) and hands it a listening Unix socket in a folder only that user can open. The
server imports what every kernel would import, then serves one connection per submission (a
`grader.kernel.protocol.Request`). For each one it forks S, that submission's supervisor (a subreaper, so
submissions can overlap: the next kernel starts while the last one grades), and S forks:

    A  (grader/kernel/newroot.py) joins the submission's cgroups, unshares user, mount, IPC, network, UTS,
       PID and cgroup namespaces, builds a new root (read-only binds of the system, Python, helpers/ and
       labkit/; sized tmpfs for /tmp and /dev/shm; the submission's socket folder), and takes uid 1000 in its
       user namespace, which is a host uid of its own outside when the grader is root (`sandbox_uid`) and the
       grader's own uid otherwise;
    B  (grader/kernel/pid1.py) PID 1 of the new PID namespace: mounts /proc, pivots into the new root, brings
       up loopback, reaps orphans, enforces the memory limit when no cgroup does (grader/kernel/memwatch.py),
       and says why the kernel died; when it exits the kernel kills every process left in the namespace;
    C  (grader/kernel/confine.py) the kernel: resource limits, a session keyring of its own, every
       capability dropped for good, a seccomp filter at least as strict as Docker's default
       (grader/kernel/seccomp.py: no keyring calls at all), then ipykernel. Once its sockets are bound, B makes the socket folder
       read-only.

Nothing a kernel leaves survives it: its files live in tmpfs mounts of its own mount namespace, its
processes in its PID namespace, its IPC objects in its IPC namespace, its keys in a session keyring of
its own, and all of them go when B exits. The server, S and A are outside the kernel's PID namespace, so it
cannot signal or trace them, and A closes every descriptor it inherited from the server (the listening
socket above all) before anything else. The kernel's own stdout and stderr reach the worker's log
through B, 64 KiB at most.

These modules import nothing from grader/ but each other and the standard library (and labkit.forking):
`--single REQUEST` builds one sandbox and kernel without the warm process.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import pkgutil
import select
import signal
import socket
import struct
import sys
import time

from grader.kernel import newroot, seccomp
from grader.kernel.newroot import INSIDE_GID, INSIDE_UID, NOBODY
from grader.kernel.protocol import IDLE, Handshake, Report, Request
from grader.kernel.syscalls import (
    PR_SET_CHILD_SUBREAPER,
    PR_SET_DUMPABLE,
    collapse_into_huge_pages,
    die_with_parent,
    prctl,
)
from labkit.forking import fork_child

# Imported before forking: together they are most of a notebook kernel's start-up time.
PRELOAD = ("numpy", "torch", "torch.nn", "torch.nn.functional", "matplotlib.pyplot", "ipywidgets",
           "ipykernel.kernelapp", "ipykernel.ipkernel", "ipykernel.debugger", "IPython.core.debugger", "sqlite3",
           "tornado.queues", "faulthandler", "helpers", "labkit",
           # what IPKernelApp.initialize imports on top of the above
           "IPython.core.completerlib", "IPython.core.oinspect", "IPython.extensions.storemagic",
           "IPython.utils.wildcard", "tornado.platform.asyncio")


def preload() -> None:
    """Import what every kernel would import; a module that fails here fails again, visibly, in the kernel."""
    for name in PRELOAD:
        try:
            module = importlib.import_module(name)
        except Exception:
            continue
        if name in ("helpers", "labkit"):
            for info in pkgutil.iter_modules(module.__path__, f"{name}."):
                try:
                    importlib.import_module(info.name)
                except Exception:
                    pass
    # Objects of the preloaded modules are never collected: a kernel's garbage collector then neither scans
    # them nor copies their pages (fork shares memory until it is written).
    gc.freeze()


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


# Linux counts epoll watches, descriptors in flight in unix sockets and pipe pages per host uid, whatever the
# namespace: were every sandbox `nobody`, one hand-in holding them all would break the kernels beside and after it
# (zmq aborted, an honest DataLoader's workers failed). A root grader gives each sandbox a host uid of its own: this
# base plus the pid of its process A, which lives as long as the sandbox (its PID namespace ends with it), so no two
# live sandboxes share one. No account should use uids from 2**20 to 2**20 + pid_max (2**22 at most).
SANDBOX_UID_BASE = 2**20


def sandbox_uid(pid: int) -> int:
    """The host uid of the sandbox whose process A is `pid`, when the grader is root."""
    return SANDBOX_UID_BASE + pid


def _write_id_maps(pid: int, request: Request) -> None:
    """Map uid/gid 1000 inside A's new user namespace: for a root grader to a uid of its own (`sandbox_uid`; the
    group `nobody`), which gets the socket folder and the connection file in it; else to the grader's uid and gid.

    Written from here because only a process outside the new namespace may map ids other than its own.
    """
    uid, gid = os.geteuid(), os.getegid()
    outside_uid, outside_gid = (sandbox_uid(pid), NOBODY) if uid == 0 else (uid, gid)
    if uid == 0:  # the kernel writes its sockets there and reads its connection file
        for path in (request["folder"], request.get("connection_file")):
            if path is not None:
                os.chown(path, outside_uid, outside_gid, follow_symlinks=False)
    if uid != 0:
        with open(f"/proc/{pid}/setgroups", "w") as f:  # required before an unprivileged gid_map
            f.write("deny")
    with open(f"/proc/{pid}/uid_map", "w") as f:
        f.write(f"{INSIDE_UID} {outside_uid} 1\n")
    with open(f"/proc/{pid}/gid_map", "w") as f:
        f.write(f"{INSIDE_GID} {outside_gid} 1\n")


def _reap_all(deadline: float) -> None:
    """Wait until every child of this process has exited (the server is a subreaper: orphans come here)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            if time.monotonic() > deadline:
                print("forkserver: a submission's process would not exit", file=sys.stderr)
                return
            time.sleep(0.005)


def _close_all_but(*keep: int) -> None:
    """Close every inherited descriptor but `keep`: the server's socket must not reach a kernel."""
    for name in os.listdir("/proc/self/fd"):
        if int(name) not in keep:
            try:
                os.close(int(name))
            except OSError:
                pass  # the descriptor of the listing itself, closed already


def start_submission(request: Request) -> tuple[int, int, int]:
    """Fork A for `request`, map its ids; (A's pid, a pidfd for it, the read end of B's report pipe)."""
    report_r, report_w = os.pipe()
    to_a_r, to_a_w = os.pipe()
    from_a_r, from_a_w = os.pipe()

    def become_a() -> int:
        _close_all_but(0, 1, 2, report_w, from_a_w, to_a_r)  # the listening socket above all
        return newroot.run_a(request, report_w, from_a_w, to_a_r)

    pid = fork_child(become_a)
    for fd in (report_w, to_a_r, from_a_w):
        os.close(fd)
    pidfd = os.pidfd_open(pid)
    try:
        ready, _, _ = select.select([from_a_r], [], [], 30)
        if ready and os.read(from_a_r, 1) == Handshake.UNSHARED.value:
            _write_id_maps(pid, request)
            os.write(to_a_w, Handshake.MAPPED.value)
    except OSError as exc:  # A dies without its maps: the supervisor sees it at once
        print(f"forkserver: cannot map the ids of the submission's user namespace: {exc}", file=sys.stderr)
    finally:
        os.close(from_a_r)
        os.close(to_a_w)
    return pid, pidfd, report_r


def supervise(conn: socket.socket | None, pidfd: int) -> bool:
    """Wait until A exits (True) or the grader hangs up (False)."""
    watched: list[int | socket.socket] = [pidfd] + ([conn] if conn is not None else [])
    while True:
        readable, _, _ = select.select(watched, [], [])
        if pidfd in readable:
            return True
        if conn is not None and conn in readable and not conn.recv(1):
            return False


def _read_report(fd: int) -> str:
    os.set_blocking(fd, False)
    chunks = []
    try:
        while chunk := os.read(fd, 4096):
            chunks.append(chunk)
    except BlockingIOError:
        pass
    os.close(fd)
    return b"".join(chunks).decode(errors="replace").strip()[:500]


def finish_submission(pid: int, pidfd: int, report_r: int, hung_up: bool) -> Report:
    """Kill what is left of the submission, wait until all of it is gone; A's exit status and B's report."""
    if hung_up:
        try:
            os.kill(pid, signal.SIGKILL)  # B follows (its parent-death signal), and with it the namespace
        except ProcessLookupError:
            pass
    _, status = os.waitpid(pid, 0)
    os.close(pidfd)
    _reap_all(time.monotonic() + 30)
    return {"exit": os.waitstatus_to_exitcode(status), "reason": _read_report(report_r)}


def _submission(conn: socket.socket, request: Request) -> int:
    """S, one submission's supervisor (a subreaper: the orphans of its sandbox come here, never to another's):
    build the sandbox, wait until its kernel exits or the grader hangs up, and answer with the report."""
    die_with_parent()
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    pid, pidfd, report_r = start_submission(request)
    hung_up = not supervise(conn, pidfd)
    report = finish_submission(pid, pidfd, report_r, hung_up)
    if not hung_up:
        try:
            conn.sendall((json.dumps(report) + "\n").encode())
        except OSError:
            pass
    return 0


def _wait_for(running: dict[int, str], folder: str | None) -> None:
    """Until the submission of `folder` is gone (None: every submission); reaps whatever else has exited."""
    for pid, its_folder in list(running.items()):
        if folder is None or its_folder == folder:
            os.waitpid(pid, 0)
            del running[pid]
    for pid in list(running):
        if os.waitpid(pid, os.WNOHANG)[0]:
            del running[pid]
    if folder is None:
        _reap_all(time.monotonic() + 30)


def serve(listener: socket.socket) -> None:
    """One connection per request. A kernel's is handed to a supervisor forked for it (S), so that submissions
    can overlap: the next one's kernel starts while the last one grades, each in a sandbox of its own."""
    me = os.geteuid()
    running: dict[int, str] = {}  # S's pid -> its submission's socket folder
    while True:
        try:
            conn, _ = listener.accept()
        except OSError as exc:  # EMFILE and the like: this request is lost, the server and its kernels are not
            print(f"fork server: accept failed: {exc}", file=sys.stderr)
            time.sleep(0.1)
            continue
        with conn:
            if _peer_uid(conn) not in (me, 0):  # only the grader's user may ask
                continue
            try:
                request = json.loads(conn.makefile().readline() or "{}")
                if "connection_file" in request:
                    def become_s(conn: socket.socket = conn, request: Request = request) -> int:
                        listener.close()  # only the server may hold it: a grader's connect fails at once when it dies
                        return _submission(conn, request)

                    running[fork_child(become_s)] = request["folder"]
                else:  # a sync: answer once that submission (without a folder: every one) is gone
                    _wait_for(running, request.get("folder"))
                    conn.sendall(IDLE)
            except (OSError, ValueError, KeyError) as exc:
                # a fork refused (the grader's process limit, which sandboxes count against) or a bad request fails
                # that request only: ending the server would take down every kernel of this worker, the one in use too
                print(f"fork server: request failed: {type(exc).__name__}: {exc}", file=sys.stderr)


def single(request: Request) -> int:
    """One sandbox and kernel, no warm process; the kernel's exit status."""
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    seccomp.prepare()
    pid, pidfd, report_r = start_submission(request)
    supervise(None, pidfd)
    report = finish_submission(pid, pidfd, report_r, False)
    if report["reason"]:
        print(f"sandbox: {report['reason']}", file=sys.stderr)
    return report["exit"]


def main() -> None:
    if sys.argv[1] == "--single":  # one kernel, no fork server: `python -m grader.kernel.forkserver --single REQUEST`
        sys.exit(single(json.loads(sys.argv[2])))
    listen_fd = int(sys.argv[1])
    die_with_parent()
    prctl(PR_SET_DUMPABLE, 0)  # no process of the grader's user can read this one's memory
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    preload()
    # Each submission forks this process's memory four times (S, A, B, C) and frees it as often: in huge pages, a fork
    # copies and an exit frees one page-table entry per 2 MiB instead of 512 (0.09 s of CPU per kernel instead of
    # 0.16 s here; about 0.6 s once). Now, before any kernel shares the pages: later, the collapse would copy them.
    collapse_into_huge_pages()
    seccomp.prepare()
    serve(socket.socket(fileno=listen_fd))


if __name__ == "__main__":
    main()
