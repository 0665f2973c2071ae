"""The process jupyter_client starts for every grading kernel: the standard library only, no site-packages.

The `course-sandbox` kernelspec runs `python -I -S grader/kernel/launcher.py {connection_file}`: an interpreter
that imports no package and reads no .pth file starts in a few milliseconds of CPU, where importing
grader.kernel cost about 0.1 s of every hand-in. It runs outside the sandbox, as the grader. While `python -m
grader autograde` runs, kernel_factory has told it (FORKSERVER_ENV, REQUEST_ENV) where the worker's fork server
listens: it asks that server for a kernel and stays alive as long as the kernel runs (jupyter_client watches this
process; when it is killed, the server kills the kernel). Anywhere else it hands over to `python -m
grader.kernel.kernelspec`, which builds the same sandbox for one kernel without the warm process.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys

# Set by grader.kernel.kernelspec.kernel_factory: the fork server's control socket, and the request for this
# submission (written by grader.kernel.sandbox.ForkServer.next_runtime).
FORKSERVER_ENV = "COURSE_FORKSERVER"
REQUEST_ENV = "COURSE_SANDBOX_REQUEST"
NOBODY = 65534  # whom a root grader's kernels are on the host (grader.kernel.newroot.NOBODY)


def connection_inside(connection_file: str) -> tuple[str, str]:
    """The socket folder of an ipc connection, and the connection file copied into it."""
    with open(connection_file) as f:
        info = json.load(f)
    if info.get("transport") != "ipc":
        raise SystemExit("the grading sandbox needs KernelManager.transport = 'ipc' (TCP cannot cross its network namespace)")
    folder = os.path.dirname(os.path.realpath(info["ip"]))
    inside = os.path.join(folder, "connection.json")
    shutil.copy(connection_file, inside)
    if os.geteuid() == 0:  # the kernel, nobody on the host, writes its sockets there
        os.chown(inside, NOBODY, NOBODY)
        if os.stat(folder).st_uid != NOBODY:
            os.chown(folder, NOBODY, NOBODY)
    return folder, inside


def run_in_forkserver(control: str, request_file: str, connection_file: str) -> int:
    """Ask the fork server for a kernel and stay alive as long as it runs; the kernel's exit status."""
    _, inside = connection_inside(connection_file)
    with open(request_file) as f:
        request = {**json.load(f), "connection_file": inside}
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(control)
        conn.sendall((json.dumps(request) + "\n").encode())
        answer = conn.makefile().readline()
    try:
        report = json.loads(answer)
    except ValueError:
        return 1
    # beside the socket folder, not in it: the kernel never sees this file
    with open(request_file.removesuffix(".request.json") + ".exit.json", "w") as f:
        json.dump(report, f)
    return int(report.get("exit", 1))


def main(connection_file: str) -> int:
    control, request_file = os.environ.get(FORKSERVER_ENV), os.environ.get(REQUEST_ENV)
    if control and request_file:
        return run_in_forkserver(control, request_file, connection_file)
    os.execv(sys.executable, [sys.executable, "-m", "grader.kernel.kernelspec", connection_file])
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]) if len(sys.argv) == 2 else __doc__)
