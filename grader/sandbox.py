"""The grading sandbox: a Jupyter kernel that runs student code inside bubblewrap.

Inside, the kernel sees the operating system, Python and `helpers/` read-only, its own connection
folder, and an empty /tmp as its working directory — not `solutions/`, the gradebook, the
notebook with the hidden tests, nor other students' files. It has no network (only loopback, for
gloo), its own process namespace, a cap on address space and file size, and it dies with the
grader. The kernelspec `course-sandbox` starts `python -m grader.sandbox {connection_file}`, which
builds that command line and replaces itself with bwrap.

    python -m grader.sandbox install     # write the kernelspec into this environment (./course setup does it)
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

KERNEL_NAME = "course-sandbox"
# torch needs about 1.5 GiB of address space to load; notebooks that start two gloo ranks need more
MEMORY_ENV = "COURSE_SANDBOX_MEMORY_BYTES"
DEFAULT_MEMORY_BYTES = 4 * 2**30
MAX_FILE_BYTES = 256 * 2**20
HELPERS = Path(__file__).resolve().parent.parent / "helpers"


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


def command(connection_file: str) -> list[str]:
    """The bwrap command line that runs an ipykernel on `connection_file`.

    The connection must use the ipc transport: its socket folder (the `ip` path's parent) is the
    only writable folder the sandbox shares with the grader, and the connection file is copied there.
    """
    info = json.loads(Path(connection_file).read_text())
    if info.get("transport") != "ipc":
        raise SystemExit("the grading sandbox needs KernelManager.transport = 'ipc' (TCP cannot cross --unshare-net)")
    runtime = str(Path(info["ip"]).resolve().parent)
    inside = Path(runtime) / "connection.json"
    shutil.copy(connection_file, inside)
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
    args += _ro_binds() + ["--bind", runtime, runtime, "--chdir", "/tmp"]
    return args + [sys.executable, "-m", "ipykernel_launcher", "-f", str(inside)]


def launch(connection_file: str) -> None:
    """Limit this process's resources (inherited by the sandbox) and become bwrap."""
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
