"""The grading sandbox: every submission's Jupyter kernel in namespaces of its own, with real limits.

Each submission's kernel is forked from a warm process that has torch imported (grader/kernel/forkserver.py)
and then gets fresh user, mount, IPC, network, UTS, PID and cgroup namespaces: a root filesystem of
read-only binds (the operating system, Python, `helpers/`), a sized tmpfs for /tmp (its home and
working folder) and /dev/shm, loopback only, and a uid that is `nobody` on the host when the grader runs
as root (the grader's own uid otherwise) with no capabilities. It sees neither `solutions/`, the
gradebook, the notebook with the hidden tests nor other students' files, and nothing it leaves — files,
mounts, processes, IPC objects — outlives it. The only folder it shares with the grader holds its
sockets and is read-only from the moment the kernel listens.

Limits per submission (environment variables; see `Limits`): memory of all its processes together
(cgroup v2 memory.max where the grader may create cgroups, cgroup v1 where only that exists, else a
watchdog in the sandbox's PID 1 — `enforcement()` says which holds here), processes (RLIMIT_NPROC in
its user namespace), writable space (tmpfs sizes), bytes per file, CPU seconds per process.

This module describes the sandbox (what it binds, its environment, its limits) and is the worker's client
of the fork server; grader/kernel/kernelspec.py is how jupyter_client reaches it.

    python -m grader.kernel.sandbox check       # can the sandbox be built here, and how are its limits enforced
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
from dataclasses import asdict
from pathlib import Path

from grader.kernel.limits import Limits, MemoryCgroups, enforcement
from grader.kernel.newroot import NOBODY
from grader.kernel.protocol import IDLE, Request, SandboxLimits
from grader.paths import KERNEL_PACKAGES

FORKSERVER = ("-m", "grader.kernel.forkserver")  # the interpreter's arguments that start the fork server
IDLE_ANSWER = IDLE.decode().strip()


# --- what the sandbox binds ---------------------------------------------------------------------------------

def ro_binds() -> list[str]:
    """What the kernel sees, read-only: the system, Python, the site-packages it imports from, helpers/ and
    labkit/ (not the rest of the repository: not solutions/, not grader/)."""
    paths = ["/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/etc", sys.base_prefix, sys.prefix,
             *map(str, KERNEL_PACKAGES)]
    # e.g. another environment's packages, added by a .pth file
    paths += [os.path.realpath(p) for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages")]
    paths = [p for p in dict.fromkeys(paths) if os.path.lexists(p)]
    return [p for p in paths if not any(p.startswith(other.rstrip("/") + "/") for other in paths if other != p)]


def exposed(paths: list[Path]) -> list[Path]:
    """Those of `paths` a kernel could read through a read-only bind (a course kept under /usr/src/app, say)."""
    binds = [Path(os.path.realpath(b)) for b in ro_binds()]  # a bind's source may be a link (a linked sys.prefix)
    return [p for p in paths if any(Path(os.path.realpath(p)).is_relative_to(b) for b in binds)]


def kernel_env(threads: str | None = None) -> dict[str, str]:
    """The kernel's whole environment (its home, user and matplotlib folder are set where it starts)."""
    return {
        "PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
        "MPLBACKEND": "module://matplotlib_inline.backend_inline",
        "LANG": os.environ.get("LANG", "C.UTF-8"),
        "OMP_NUM_THREADS": threads or os.environ.get("OMP_NUM_THREADS", "1"),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYDEVD_DISABLE_FILE_VALIDATION": "1",  # debugpy (preloaded for ipykernel) warns about frozen modules
    }


def sandbox_request(folder: Path, cgroups: list[str], limits: Limits, threads: str | None = None) -> Request:
    """What the fork server needs to build one submission's sandbox (JSON): its folder, binds, environment, limits
    (`threads`: torch's threads in the kernel, default this process's OMP_NUM_THREADS or 1)."""
    sent = SandboxLimits(**asdict(limits))  # type: ignore[typeddict-item]  # the same fields, checked by a test
    return {"folder": str(folder), "ro_binds": ro_binds(), "env": kernel_env(threads), "cgroups": cgroups,
            "watchdog": not cgroups, "limits": sent}


def _own_folder(folder: Path) -> None:
    """The submission's socket folder, writable by the kernel's uid until the kernel seals it."""
    folder.mkdir()
    if os.geteuid() == 0:
        os.chown(folder, NOBODY, NOBODY)


def remove_tree(path: Path) -> None:
    """Delete `path` whatever its contents' permissions (what a kernel wrote there before it was sealed)."""
    if not os.path.lexists(path):
        return
    if path.is_dir() and not path.is_symlink():
        os.chmod(path, stat.S_IRWXU)
        for entry in path.iterdir():
            remove_tree(entry)
        path.rmdir()
    else:
        path.unlink()


@functools.lru_cache(maxsize=1)
def why_unavailable() -> str:
    """'' when a kernel sandbox can be built here (tried once: namespaces, mounts, dropping privileges); else why not."""
    folder = Path(tempfile.mkdtemp(prefix="sandbox-probe-"))
    try:
        _own_folder(folder / "run")
        request: Request = {**sandbox_request(folder / "run", [], Limits()), "probe": True}
        probe = subprocess.run([sys.executable, *FORKSERVER, "--single", json.dumps(request)],
                               capture_output=True, text=True, timeout=60, env=kernel_env(), check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        remove_tree(folder)
    if probe.returncode == 0:
        return ""
    lines = [line for line in probe.stderr.splitlines() if line.strip()]
    return lines[-1] if lines else f"exit status {probe.returncode}"


FOLDER_PREFIX = "forkserver-"


def sweep_stale_folders() -> int:
    """Remove the fork-server folders of workers that are gone (killed before their cleanup); how many."""
    removed = 0
    for folder in Path(tempfile.gettempdir()).glob(f"{FOLDER_PREFIX}*-*"):
        pid = folder.name.removeprefix(FOLDER_PREFIX).split("-")[0]
        try:
            mine = folder.lstat().st_uid == os.geteuid() and folder.is_dir() and not folder.is_symlink()
        except OSError:
            continue
        if mine and pid.isdigit() and not Path(f"/proc/{pid}").exists():
            try:
                remove_tree(folder)
                removed += 1
            except OSError:
                pass
    return removed


class ForkServer:
    """The worker's warm process (grader/kernel/forkserver.py); it builds a fresh sandbox for each kernel it forks.

    `next_runtime` waits until everything of the earlier submissions is gone, removes their socket folders and
    cgroups, and prepares the next ones; or, for a kernel started ahead while the last one still grades
    (grader.kernel.kernelspec.KernelsAhead), prepares them beside it, and `release` cleans up after each one.
    The kernelspec launcher finds the server and the request through grader.kernel.kernelspec's FORKSERVER_ENV
    and REQUEST_ENV variables.
    """

    def __init__(self, threads: str | None = None) -> None:
        sweep_stale_folders()
        self.threads = threads  # torch's threads in each kernel (sandbox_request)
        # 0700: only the grader's user gets in; the worker's pid in the name tells the sweep whose it is
        self.folder = Path(tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{os.getpid()}-"))
        self.runtime = self.folder / "runtime"
        self.runtime.mkdir()
        self.control = self.folder / "control.sock"
        self.process: subprocess.Popen | None = None
        self.submissions = 0
        self.released = 0  # the cgroups of submissions up to this one are removed
        self._lock = threading.Lock()  # the kernel started ahead asks from another thread
        self.limits = Limits.from_env()
        self.cgroups = MemoryCgroups.detect(f"{os.getpid()}-{self.folder.name[-8:]}")
        if self.cgroups is not None:
            self.cgroups.sweep()
        else:
            print("grader: no cgroup for the sandbox's memory limit here; a watchdog enforces it "
                  "(python -m grader.kernel.sandbox check)", file=sys.stderr)

    def _start(self) -> None:
        self.stop()
        self.control.unlink(missing_ok=True)
        mplconfig = self.folder / "matplotlib"
        mplconfig.mkdir(exist_ok=True)
        for fontlist in (Path.home() / ".cache" / "matplotlib").glob("fontlist-*.json"):  # no font-cache rebuild
            shutil.copy(fontlist, mplconfig)
        env = {**kernel_env(self.threads), "HOME": str(self.folder), "MPLCONFIGDIR": str(mplconfig)}
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
            listener.bind(str(self.control))
            listener.listen(8)
            argv = [sys.executable, *FORKSERVER, str(listener.fileno())]
            # Only the server holds the listening socket: if it dies, connecting fails at once.
            self.process = subprocess.Popen(argv, pass_fds=(listener.fileno(),), stdin=subprocess.DEVNULL, env=env,
                                            cwd=self.folder)

    def spawn(self) -> None:
        """Start the server process in this thread (which it will not outlive) without waiting for it: the first
        `next_runtime` waits until it answers, and its imports overlap whatever the caller does meanwhile."""
        with self._lock:
            self._start()

    def start(self, timeout: float = 120) -> None:
        """Start the server now, in this thread (which it will not outlive), and wait until it answers."""
        with self._lock:
            self._launch(timeout)

    def _launch(self, timeout: float) -> None:
        self._start()
        if self._ask({}, timeout) != IDLE_ANSWER:
            raise RuntimeError("the grading sandbox did not start: see the worker log")

    def _ask(self, request: dict, timeout: float) -> str:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(timeout)
            conn.connect(str(self.control))
            conn.sendall((json.dumps(request) + "\n").encode())
            return conn.makefile().readline().strip()

    def _clean(self) -> None:
        """Remove every earlier submission's socket folder, request, exit report and cgroup."""
        for entry in self.runtime.iterdir():
            remove_tree(entry)
        if self.cgroups is not None:
            for name in range(self.released + 1, self.submissions + 1):
                self.cgroups.remove(str(name))
        self.released = self.submissions

    def next_runtime(self, timeout: float = 120, alongside: bool = False, restart: bool = True) -> Path:
        """A fresh socket folder (and cgroup) for the next kernel, the server restarted if it died or hangs.

        First every earlier submission must be gone, and is cleaned up after; `alongside`: the kernel being graded
        runs on (the next one starts ahead of its turn, KernelsAhead), and `release` cleans up after each.
        `restart` False (a start ahead, while a kernel of this server is in use): a dead or hung server is not
        restarted — that would kill the kernel in use — but reported; the next start in turn restarts it.
        """
        with self._lock:
            try:
                if self.process is None or self.process.poll() is not None:
                    raise ConnectionError("not running")
                answer = self._ask({"folder": ""} if alongside else {}, timeout)
            except OSError:
                answer = ""
            if answer != IDLE_ANSWER:
                if not restart:
                    raise RuntimeError("the fork server did not answer; a kernel of it is in use, so it is not "
                                       "restarted now")
                self._launch(timeout)
            if not alongside:
                self._clean()
            self.submissions += 1
            name = str(self.submissions)
        folder = self.runtime / f"submission-{name}"
        _own_folder(folder)
        cgroups = self.cgroups.create(name, self.limits.memory_bytes) if self.cgroups else []
        folder.with_suffix(".request.json").write_text(json.dumps(sandbox_request(folder, cgroups, self.limits, self.threads)))
        return folder

    def release(self, folder: Path, timeout: float = 60) -> None:
        """Once the submission of `folder` is gone (its kernel was stopped), remove its files and cgroup."""
        try:
            self._ask({"folder": str(folder)}, timeout)
        except OSError:  # the server is gone, and with it every submission
            pass
        for path in (folder, folder.with_suffix(".request.json"), folder.with_suffix(".exit.json")):
            remove_tree(path)
        if self.cgroups is not None:
            self.cgroups.remove(folder.name.removeprefix("submission-"))

    def exit_reason(self, folder: Path) -> str:
        """Why the kernel of `folder` died, when a limit killed it; '' otherwise (or while it runs)."""
        try:
            report = json.loads(folder.with_suffix(".exit.json").read_text())
        except (OSError, ValueError):
            report = {}
        if report.get("reason"):
            return str(report["reason"])
        name = folder.name.removeprefix("submission-")
        killed = report.get("exit") == 128 + 9  # SIGKILL, what the kernel's OOM killer sends
        if killed and self.cgroups is not None and self.cgroups.oom_kills(name):
            return f"memory limit: its processes together reached {self.limits.memory_bytes / 2**30:.2f} GiB (cgroup)"
        return ""

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def close(self) -> None:
        self.stop()
        self._clean()
        remove_tree(self.folder)


if __name__ == "__main__":
    if sys.argv[1:] == ["check"]:
        problem = why_unavailable()
        print("sandbox: " + (f"cannot be built here: {problem}" if problem else "works"))
        for what, how in enforcement().items():
            print(f"  {what}: {how}")
        sys.exit(1 if problem else 0)
    else:
        sys.exit(__doc__)
