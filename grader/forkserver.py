"""Inside the grading sandbox: import torch once, then fork one fresh kernel per submission.

`grader.sandbox.ForkServer` starts this file as PID 1 of a bubblewrap sandbox and hands it a
listening Unix socket (the socket's path is outside the sandbox, so kernels cannot reach it).
Each connection asks for one kernel; the server forks a child with the course's heavy imports
already loaded, which becomes an ipykernel for that connection file. When the kernel exits, or
the grader drops the connection, the server kills every other process in the sandbox and empties
/tmp and /dev/shm before it accepts the next connection, so nothing of one submission is left for
the next. As PID 1 of its namespace it receives no signal sent from inside, and it is not dumpable,
so a kernel can neither stop nor inspect it.

This file is bound into the sandbox on its own: it imports nothing from grader/.
"""

from __future__ import annotations

import ctypes
import importlib
import json
import os
import pkgutil
import resource
import select
import shutil
import signal
import socket
import struct
import sys
import time
import traceback

PR_SET_DUMPABLE = 4
# Imported before forking: together they are most of a notebook kernel's start-up time.
PRELOAD = ("numpy", "torch", "torch.nn", "torch.nn.functional", "matplotlib.pyplot", "ipywidgets",
           "ipykernel.kernelapp", "helpers")


def _set_dumpable(flag: int) -> None:
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, flag, 0, 0, 0)


def preload() -> None:
    """Import what every kernel would import; a module that fails here fails again, visibly, in the kernel."""
    for name in PRELOAD:
        try:
            module = importlib.import_module(name)
        except Exception:  # noqa: BLE001 — the kernel reports it to the student
            continue
        if name == "helpers":
            for info in pkgutil.iter_modules(module.__path__, "helpers."):
                try:
                    importlib.import_module(info.name)
                except Exception:  # noqa: BLE001
                    pass


def _peer_pid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[0]


def become_kernel(connection_file: str, memory_bytes: int, file_bytes: int) -> None:
    """In the forked child: a clean working folder, the resource limits, then ipykernel (never returns)."""
    try:
        _set_dumpable(1)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.setsid()
        work = "/tmp/work"
        os.makedirs(work, exist_ok=True)
        os.chdir(work)
        os.environ.update(HOME=work, MPLCONFIGDIR=os.path.join(work, ".matplotlib"))
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
        sys.argv = ["ipykernel_launcher", "-f", connection_file]
        from ipykernel import kernelapp

        kernelapp.launch_new_instance(argv=sys.argv[1:])
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 — report, never fall back into the server's loop
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _processes() -> list[int]:
    """Live processes of the sandbox other than this server (zombies excluded)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            found.append(int(entry))
    return found


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _empty(folder: str, keep: str) -> None:
    """Delete everything under `folder` except the path down to `keep` (the grader's runtime folder)."""
    for entry in os.scandir(folder):
        if entry.path == keep:
            continue
        if keep.startswith(entry.path + os.sep):
            _empty(entry.path, keep)
        elif entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            try:
                os.unlink(entry.path)
            except OSError:
                pass


def sweep(runtime: str) -> None:
    """Kill every process but this one and empty the writable folders: the next kernel starts clean."""
    deadline = time.monotonic() + 10
    while (others := _processes()) and time.monotonic() < deadline:
        for pid in others:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.01)
        _reap()
    _reap()
    _empty("/tmp", runtime)
    _empty("/dev/shm", runtime)


def supervise(conn: socket.socket, pid: int) -> int | None:
    """Wait until the kernel exits (its exit code) or the grader hangs up (None, the kernel is killed)."""
    pidfd = os.pidfd_open(pid)
    try:
        while True:
            readable, _, _ = select.select([conn, pidfd], [], [])
            if pidfd in readable:
                _, status = os.waitpid(pid, 0)
                return os.waitstatus_to_exitcode(status)
            if not conn.recv(1):  # the launcher is gone: jupyter_client killed the kernel
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return None
    finally:
        os.close(pidfd)


def serve(listener: socket.socket, runtime: str, memory_bytes: int, file_bytes: int) -> None:
    while True:
        conn, _ = listener.accept()
        with conn:
            # Only the grader, outside the sandbox, may ask: its PID is 0 in this namespace.
            if _peer_pid(conn) != 0:
                continue
            request = json.loads(conn.makefile().readline() or "{}")
            if "connection_file" not in request:  # a sync: answer once everything is clean
                conn.sendall(b"idle\n")
                continue
            pid = os.fork()
            if pid == 0:
                listener.close()
                conn.close()
                become_kernel(request["connection_file"], memory_bytes, file_bytes)
            code = supervise(conn, pid)
            sweep(runtime)
            if code is not None:
                try:
                    conn.sendall(f"exit {code}\n".encode())
                except OSError:
                    pass


def main() -> None:
    listen_fd, runtime, memory_bytes, file_bytes = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    _set_dumpable(0)
    # PID 1 receives a signal from inside its namespace only where it has a handler: Python's SIGINT one goes.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    preload()
    serve(socket.socket(fileno=listen_fd), runtime, memory_bytes, file_bytes)


if __name__ == "__main__":
    main()
