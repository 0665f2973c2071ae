"""How a grading kernel reaches the sandbox: the `course-sandbox` kernelspec, its launcher, and the worker's factory.

jupyter_client starts a kernel by running its kernelspec's argv, here `python -m grader.kernel.kernelspec
{connection_file}`. That launcher runs outside the sandbox, as the grader. While `python -m grader autograde`
runs, `kernel_factory` has told it (FORKSERVER_ENV, REQUEST_ENV) where the worker's fork server listens, and
it asks that server for a kernel; anywhere else it builds the same sandbox for one kernel without the warm
process.

    python -m grader.kernel.kernelspec install     # write the kernelspec into this environment (./course setup does it)
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
from pathlib import Path

from grader.kernel.limits import Limits
from grader.kernel.protocol import Request
from grader.kernel.sandbox import FORKSERVER, NOBODY, ForkServer, sandbox_request

KERNEL_NAME = "course-sandbox"
# Set by kernel_factory for the launcher: the fork server's control socket, and the request for this
# submission (written by ForkServer.next_runtime).
FORKSERVER_ENV = "COURSE_FORKSERVER"
REQUEST_ENV = "COURSE_SANDBOX_REQUEST"


def kernelspec_dir(prefix: str = sys.prefix) -> Path:
    return Path(prefix) / "share" / "jupyter" / "kernels" / KERNEL_NAME


def _kernel_json() -> str:
    spec = {
        "argv": [sys.executable, "-m", "grader.kernel.kernelspec", "{connection_file}"],
        "display_name": "Python 3 (grading sandbox)",
        "language": "python",
        # Signals cannot cross into the sandbox's process namespace; interrupts go as messages.
        "interrupt_mode": "message",
    }
    return json.dumps(spec, indent=1) + "\n"


def install_kernelspec(prefix: str = sys.prefix) -> Path:
    """Write the `course-sandbox` kernelspec for this interpreter unless it is already there as is; its folder."""
    folder = kernelspec_dir(prefix)
    wanted = _kernel_json()
    kernel_json = folder / "kernel.json"
    if not kernel_json.exists() or kernel_json.read_text() != wanted:  # e.g. one written by an older grader
        folder.mkdir(parents=True, exist_ok=True)
        kernel_json.write_text(wanted)
    return folder


def kernel_factory(server: ForkServer):
    """Kernels forked by `server`, one sandboxed kernel per call (grader.kernel.harness.Kernel)."""
    from jupyter_client import KernelManager

    from grader.kernel.harness import Kernel

    def start() -> Kernel:
        folder = server.next_runtime()
        # ipc sockets in the folder the sandbox binds: TCP cannot cross its network namespace.
        manager = KernelManager(kernel_name=KERNEL_NAME, transport="ipc", ip=str(folder / "kernel"))
        manager.connection_file = str(folder / "host-connection.json")
        env = {**os.environ, FORKSERVER_ENV: str(server.control), REQUEST_ENV: str(folder.with_suffix(".request.json"))}
        return Kernel(manager, env=env, exit_reason=lambda: server.exit_reason(folder))

    return start


def _connection_inside(connection_file: str) -> tuple[str, str]:
    """The socket folder of an ipc connection, and the connection file copied into it."""
    info = json.loads(Path(connection_file).read_text())
    if info.get("transport") != "ipc":
        raise SystemExit("the grading sandbox needs KernelManager.transport = 'ipc' (TCP cannot cross its network namespace)")
    folder = Path(info["ip"]).resolve().parent
    inside = folder / "connection.json"
    shutil.copy(connection_file, inside)
    if os.geteuid() == 0:  # the kernel, nobody on the host, writes its sockets there
        os.chown(inside, NOBODY, NOBODY)
        if folder.stat().st_uid != NOBODY:
            os.chown(folder, NOBODY, NOBODY)
    return str(folder), str(inside)


def _run_in_forkserver(control: str, request_file: str, connection_file: str) -> int:
    """Ask the fork server for a kernel and stay alive as long as it runs: jupyter_client watches this process."""
    _, inside = _connection_inside(connection_file)
    request = {**json.loads(Path(request_file).read_text()), "connection_file": inside}
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(control)
        conn.sendall((json.dumps(request) + "\n").encode())
        answer = conn.makefile().readline()
    try:
        report = json.loads(answer)
    except ValueError:
        return 1
    # beside the socket folder, not in it: the kernel never sees this file
    Path(request_file.removesuffix(".request.json") + ".exit.json").write_text(json.dumps(report))
    return int(report.get("exit", 1))


def launch(connection_file: str) -> None:
    """Start the kernel in the worker's fork server if there is one; else build the sandbox for this one kernel."""
    control, request_file = os.environ.get(FORKSERVER_ENV), os.environ.get(REQUEST_ENV)
    if control and request_file:
        sys.exit(_run_in_forkserver(control, request_file, connection_file))
    folder, inside = _connection_inside(connection_file)
    request: Request = {**sandbox_request(Path(folder), [], Limits.from_env()), "connection_file": inside}
    os.execv(sys.executable, [sys.executable, *FORKSERVER, "--single", json.dumps(request)])


if __name__ == "__main__":
    if sys.argv[1:] == ["install"]:
        print(f"installed kernelspec {KERNEL_NAME} in {install_kernelspec()}")
    elif len(sys.argv) == 2:
        launch(sys.argv[1])
    else:
        sys.exit(__doc__)
