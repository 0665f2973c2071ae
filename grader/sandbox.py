"""The grading sandbox: a Jupyter kernel that runs student code inside bubblewrap.

Inside, the kernel sees the operating system, Python and `helpers/` read-only, its own connection
folder, and an empty /tmp as its working directory — not `solutions/`, the gradebook, the
notebook with the hidden tests, nor other students' files. It has no network (only loopback, for
gloo), its own process namespace, a cap on address space and file size, and it dies with the
grader. The kernelspec `course-sandbox` starts `python -m grader.sandbox {connection_file}`: while
`python -m grader autograde` runs, that asks the worker's ForkServer (a sandbox whose Python has
torch imported already) for a kernel; anywhere else it builds the bwrap command line and replaces
itself with bwrap.

    python -m grader.sandbox install     # write the kernelspec into this environment (./course setup does it)
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

KERNEL_NAME = "course-sandbox"
# torch needs about 1.5 GiB of address space to load; notebooks that start two gloo ranks need more
MEMORY_ENV = "COURSE_SANDBOX_MEMORY_BYTES"
DEFAULT_MEMORY_BYTES = 4 * 2**30
MAX_FILE_BYTES = 256 * 2**20
HELPERS = Path(__file__).resolve().parent.parent / "helpers"
FORKSERVER = Path(__file__).resolve().parent / "forkserver.py"
# Set by grader.worker while it grades: the control socket of its ForkServer.
FORKSERVER_ENV = "COURSE_FORKSERVER"


def bwrap_works() -> bool:
    """True when bubblewrap is installed and can create namespaces here."""
    if shutil.which("bwrap") is None:
        return False
    probe = subprocess.run(["bwrap", "--ro-bind", "/", "/", "--unshare-all", "--die-with-parent", "true"],
                           capture_output=True)
    return probe.returncode == 0


def kernelspec_dir(prefix: str = sys.prefix) -> Path:
    return Path(prefix) / "share" / "jupyter" / "kernels" / KERNEL_NAME


def install_kernelspec(prefix: str = sys.prefix) -> Path:
    """Write the `course-sandbox` kernelspec for this interpreter; returns its folder."""
    folder = kernelspec_dir(prefix)
    folder.mkdir(parents=True, exist_ok=True)
    spec = {
        "argv": [sys.executable, "-m", "grader.sandbox", "{connection_file}"],
        "display_name": "Python 3 (grading sandbox)",
        "language": "python",
        # Signals cannot cross into the sandbox's process namespace; interrupts go as messages.
        "interrupt_mode": "message",
    }
    (folder / "kernel.json").write_text(json.dumps(spec, indent=1) + "\n")
    return folder


def _ro_binds() -> list[str]:
    paths = ["/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/etc", sys.base_prefix, sys.prefix, str(HELPERS)]
    args: list[str] = []
    for path in dict.fromkeys(paths):
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    return args


def _sandbox(runtime: str) -> list[str]:
    """bwrap's options for a sandbox that shares only `runtime` (read-write) with the grader."""
    mplconfig = Path(runtime) / "matplotlib"
    mplconfig.mkdir(exist_ok=True)
    cache = Path.home() / ".cache" / "matplotlib"
    for fontlist in cache.glob("fontlist-*.json"):  # saves rebuilding the font cache in every kernel
        shutil.copy(fontlist, mplconfig)
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
        "HOME": "/tmp",
        "MPLCONFIGDIR": str(mplconfig),
        "MPLBACKEND": "module://matplotlib_inline.backend_inline",
        "LANG": os.environ.get("LANG", "C.UTF-8"),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    args = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--clearenv"]
    for key, value in env.items():
        args += ["--setenv", key, value]
    # Mount order matters: the empty /tmp first, so binds below it (the runtime folder) stay visible.
    args += ["--tmpfs", "/tmp", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/dev/shm"]
    return args + _ro_binds() + ["--bind", runtime, runtime, "--chdir", "/tmp"]


def command(connection_file: str) -> list[str]:
    """The bwrap command line that runs an ipykernel on `connection_file`, in a sandbox of its own.

    The connection must use the ipc transport: its socket folder (the `ip` path's parent) is the
    only writable folder the sandbox shares with the grader, and the connection file is copied there.
    """
    runtime, inside = _connection_inside(connection_file)
    return _sandbox(runtime) + [sys.executable, "-m", "ipykernel_launcher", "-f", inside]


def _connection_inside(connection_file: str) -> tuple[str, str]:
    """The runtime folder of an ipc connection, and the connection file copied into it."""
    info = json.loads(Path(connection_file).read_text())
    if info.get("transport") != "ipc":
        raise SystemExit("the grading sandbox needs KernelManager.transport = 'ipc' (TCP cannot cross --unshare-net)")
    runtime = Path(info["ip"]).resolve().parent
    inside = runtime / "connection.json"
    shutil.copy(connection_file, inside)
    return str(runtime), str(inside)


class ForkServer:
    """One long-lived sandbox (grader/forkserver.py) that forks a pre-imported kernel per submission.

    Kernels it starts share its sandbox one after another, never at once: before each new kernel
    it kills whatever the last one left running and empties /tmp (see grader/forkserver.py). The
    kernelspec launcher finds it through the FORKSERVER_ENV variable.
    """

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="forkserver-"))
        self.runtime = self.folder / "runtime"
        self.runtime.mkdir()
        self.control = self.folder / "control.sock"  # outside the sandbox: kernels cannot reach it
        self.process: subprocess.Popen | None = None
        self.submissions = 0

    def _start(self) -> None:
        self.stop()
        self.control.unlink(missing_ok=True)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
            listener.bind(str(self.control))
            listener.listen(8)
            memory = os.environ.get(MEMORY_ENV, str(DEFAULT_MEMORY_BYTES))
            argv = _sandbox(str(self.runtime)) + ["--as-pid-1", "--ro-bind", str(FORKSERVER), str(FORKSERVER)]
            argv += [sys.executable, str(FORKSERVER), str(listener.fileno()), str(self.runtime), memory,
                     str(MAX_FILE_BYTES)]
            # Only the server holds the listening socket: if it dies, connecting fails at once.
            self.process = subprocess.Popen(argv, pass_fds=(listener.fileno(),), stdin=subprocess.DEVNULL)

    def _ask(self, request: dict, timeout: float) -> str:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout)
            conn.connect(str(self.control))
            conn.sendall((json.dumps(request) + "\n").encode())
            return conn.makefile().readline().strip()

    def next_runtime(self, timeout: float = 120) -> Path:
        """Wait until the sandbox is clean (restarting the server if it died or hangs); a fresh runtime folder."""
        try:
            if self.process is None or self.process.poll() is not None:
                raise ConnectionError("not running")
            answer = self._ask({}, timeout)
        except OSError:
            answer = ""
        if answer != "idle":
            self._start()
            if self._ask({}, timeout) != "idle":
                raise RuntimeError("the grading sandbox did not start: see the worker log")
        for entry in self.runtime.iterdir():  # whatever the last kernel left in the shared folder
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        self.submissions += 1
        folder = self.runtime / f"submission-{self.submissions}"
        folder.mkdir()
        return folder

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


def kernel_factory(server: ForkServer):
    """Kernels forked by `server`, one sandboxed kernel per call (grader.harness.Kernel)."""
    from jupyter_client import KernelManager

    from grader.harness import Kernel

    def start() -> Kernel:
        runtime = server.next_runtime()
        # ipc sockets in the folder the sandbox binds: TCP cannot cross --unshare-net.
        manager = KernelManager(kernel_name=KERNEL_NAME, transport="ipc", ip=str(runtime / "kernel"))
        manager.connection_file = str(runtime / "host-connection.json")
        return Kernel(manager, env={**os.environ, FORKSERVER_ENV: str(server.control)})

    return start


def _run_in_forkserver(control: str, connection_file: str) -> int:
    """Ask the fork server for a kernel and stay alive as long as it runs: jupyter_client watches this process."""
    _, inside = _connection_inside(connection_file)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(control)
        conn.sendall((json.dumps({"connection_file": inside}) + "\n").encode())
        answer = conn.makefile().readline().split()
    return int(answer[1]) if answer[:1] == ["exit"] else 1


def launch(connection_file: str) -> None:
    """Start the kernel in the worker's fork server if there is one; else limit resources and become bwrap."""
    control = os.environ.get(FORKSERVER_ENV)
    if control:
        sys.exit(_run_in_forkserver(control, connection_file))
    memory = int(os.environ.get(MEMORY_ENV, DEFAULT_MEMORY_BYTES))
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (MAX_FILE_BYTES, MAX_FILE_BYTES))
    os.execvp("bwrap", command(connection_file))


if __name__ == "__main__":
    if sys.argv[1:] == ["install"]:
        print(f"installed kernelspec {KERNEL_NAME} in {install_kernelspec()}")
    elif len(sys.argv) == 2:
        launch(sys.argv[1])
    else:
        sys.exit(__doc__)
