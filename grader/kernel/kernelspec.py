"""How a grading kernel reaches the sandbox: the `course-sandbox` kernelspec, its launcher, and the worker's factory.

jupyter_client starts a kernel by running its kernelspec's argv, here grader/kernel/launcher.py in an interpreter
without site-packages. While `python -m grader autograde` runs, `kernel_factory` has told it (FORKSERVER_ENV,
REQUEST_ENV) where the worker's fork server listens, and it asks that server for a kernel; anywhere else it
hands over to this module (`python -m grader.kernel.kernelspec {connection_file}`), which builds the same
sandbox for one kernel without the warm process.

    python -m grader.kernel.kernelspec install     # write the kernelspec into this environment (./course setup does it)
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from grader.kernel import launcher
from grader.kernel.launcher import FORKSERVER_ENV, REQUEST_ENV
from grader.kernel.limits import Limits
from grader.kernel.protocol import Request
from grader.kernel.sandbox import FORKSERVER, ForkServer, sandbox_request

if TYPE_CHECKING:
    from grader.kernel.harness import Kernel

KERNEL_NAME = "course-sandbox"


def kernelspec_dir(prefix: str = sys.prefix) -> Path:
    return Path(prefix) / "share" / "jupyter" / "kernels" / KERNEL_NAME


def _kernel_json() -> str:
    spec = {
        # -I -S: no site-packages, no .pth files, no environment variables of Python's: the launcher needs none
        "argv": [sys.executable, "-I", "-S", str(Path(launcher.__file__).resolve()), "{connection_file}"],
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


def kernel_factory(server: ForkServer, background: Callable[[Callable[[], None]], object] | None = None,
                   restart: bool = True, then: Callable[[], None] = lambda: None) -> Callable[[], Kernel]:
    """Kernels forked by `server`, one sandboxed kernel per call (grader.kernel.harness.Kernel).

    `background` (KernelsAhead): a kernel may start while earlier ones still run, and stopping one, then cleaning
    up after it (ForkServer.release), is handed to `background`. `restart` False: a dead or hung server fails the
    start instead of being restarted (ForkServer.next_runtime). `then`: called once a kernel has stopped."""
    from jupyter_client import KernelManager

    from grader.kernel.harness import Kernel

    def start() -> Kernel:
        folder = server.next_runtime(alongside=background is not None, restart=restart)
        # ipc sockets in the folder the sandbox binds: TCP cannot cross its network namespace.
        manager = KernelManager(kernel_name=KERNEL_NAME, transport="ipc", ip=str(folder / "kernel"))
        manager.connection_file = str(folder / "host-connection.json")
        env = {**os.environ, FORKSERVER_ENV: str(server.control), REQUEST_ENV: str(folder.with_suffix(".request.json"))}

        def stopped() -> None:
            if background is not None:
                server.release(folder)
            then()

        return Kernel(manager, env=env, exit_reason=lambda: server.exit_reason(folder), stopped=stopped,
                      stop_in=background)

    return start


@contextlib.contextmanager
def servers_for_threads(count: int, threads: str | None = None) -> Iterator[Callable[[], Kernel]]:
    """Sandboxed kernels for trusted runs started from several threads at once (the reference run and the known
    mistakes, recorded before grading): `count` fork servers, and each kernel is forked warm by whichever one is
    free (a start waits for one), instead of a plain kernel importing torch and the notebook's packages afresh.

    The servers are started here, by the caller's thread, and never restarted by the threads that ask for kernels:
    a server dies with the thread that started it (PR_SET_PDEATHSIG follows the thread), and pool threads come and
    go. A server that died fails its starts (the run then records nothing for the version: known_mistakes)."""
    free: queue.Queue[ForkServer] = queue.Queue()
    servers = [ForkServer(threads) for _ in range(max(1, count))]
    try:
        for server in servers:
            server.start()
            free.put(server)

        def start() -> Kernel:
            server, given_back = free.get(), threading.Event()

            def give_back() -> None:  # once: a kernel that failed to start has stopped itself already
                if not given_back.is_set():
                    given_back.set()
                    free.put(server)

            try:
                return kernel_factory(server, restart=False, then=give_back)()
            except BaseException:
                give_back()
                raise

        yield start
    finally:
        for server in servers:
            server.close()


class KernelsAhead:
    """Sandboxed kernels, each started while the one before it is in use: a submission gets a kernel that is ready.

    Each is a fresh sandbox of its own (namespaces, root, socket folder, cgroup), forked by the server, which never
    runs student code: the kernel started ahead sees nothing of the one in use, nor that one of it. One that died
    while it waited is not handed out. Kernels are stopped, and cleaned up after, in a background thread of their
    own (the sandbox's teardown is no submission's wait, nor does the next start wait for it).
    """

    def __init__(self, server: ForkServer) -> None:
        self._starting = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kernel-start")
        self._stopping = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kernel-stop")
        self._start = kernel_factory(server, background=self._stopping.submit)
        # A start ahead never restarts the server: that would kill the kernel in use (a student who did nothing)
        self._start_ahead = kernel_factory(server, background=self._stopping.submit, restart=False)
        self._ahead: Future[Kernel] | None = None
        self.ahead = True  # False: the kernel handed out next is likely the last one asked for; none starts ahead

    def __call__(self) -> Kernel:
        ahead, self._ahead = self._ahead, None
        kernel = _started(ahead)
        if kernel is None:
            kernel = self._start()
        if self.ahead:
            self._ahead = self._starting.submit(self._start_ahead)
        return kernel

    def close(self) -> None:
        """Stop the kernel started ahead (waiting for it to finish starting) and clean up after every kernel."""
        ahead, self._ahead = self._ahead, None
        kernel = _started(ahead)
        if kernel is not None:
            kernel.stop()
        self._starting.shutdown()
        self._stopping.shutdown()


def _started(ahead: Future[Kernel] | None) -> Kernel | None:
    """The kernel started ahead when it started and is alive; None otherwise (a dead one is stopped)."""
    try:
        kernel = ahead.result() if ahead is not None else None
    except Exception:  # the caller starts one now, the usual way, and meets the error there
        return None
    if kernel is not None and not kernel.alive():
        kernel.stop()
        return None
    return kernel


def launch(connection_file: str) -> None:
    """Build the sandbox for this one kernel, without a fork server (the launcher hands over to this)."""
    folder, inside = launcher.connection_inside(connection_file)
    request: Request = {**sandbox_request(Path(folder), [], Limits.from_env()), "connection_file": inside}
    os.execv(sys.executable, [sys.executable, *FORKSERVER, "--single", json.dumps(request)])


if __name__ == "__main__":
    if sys.argv[1:] == ["install"]:
        print(f"installed kernelspec {KERNEL_NAME} in {install_kernelspec()}")
    elif len(sys.argv) == 2:
        launch(sys.argv[1])
    else:
        sys.exit(__doc__)
