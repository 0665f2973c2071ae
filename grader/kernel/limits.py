"""What one submission may use, and how the machine enforces it: the sandbox's limits and memory cgroups.

Every limit is an environment variable (`Limits.from_env`); `enforcement()` says how each is enforced
here (`python -m grader.kernel.sandbox check` prints it). grader/kernel/sandbox.py builds the sandbox with them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from grader.kernel.confine import QUOTA_RLIMITS, USER_NS_QUOTAS

# torch needs about 1.5 GiB of address space to load; notebooks that start two gloo ranks need more
MEMORY_ENV = "COURSE_SANDBOX_MEMORY_BYTES"
DEFAULT_MEMORY_BYTES = 4 * 2**30
MAX_FILE_BYTES = 256 * 2**20
DISK_ENV = "COURSE_SANDBOX_DISK_BYTES"  # tmpfs for /tmp (home and working folder)
SHM_ENV = "COURSE_SANDBOX_SHM_BYTES"  # tmpfs for /dev/shm; 0: none
PROCESSES_ENV = "COURSE_SANDBOX_PROCESSES"  # processes and threads of the submission
CPU_ENV = "COURSE_SANDBOX_CPU_SECONDS"  # per process
CGROUPS_ENV = "COURSE_SANDBOX_CGROUPS"  # "off": no cgroup, the memory watchdog instead
SCOPE_ENV = "COURSE_SANDBOX_SCOPE"  # set once autograde has rerun itself in a delegated systemd user scope


@dataclass(frozen=True)
class Limits:
    """What one submission may use; every field can be set through its environment variable."""

    memory_bytes: int = DEFAULT_MEMORY_BYTES  # all processes together
    address_space_bytes: int = DEFAULT_MEMORY_BYTES  # RLIMIT_AS of each process (torch needs about 1.5 GiB)
    file_bytes: int = MAX_FILE_BYTES  # RLIMIT_FSIZE
    disk_bytes: int = 512 * 2**20  # /tmp
    shm_bytes: int = 64 * 2**20  # /dev/shm and System V shared memory
    inodes: int = 65536  # files in /tmp
    processes: int = 256  # RLIMIT_NPROC: processes and threads
    cpu_seconds: int = 600  # RLIMIT_CPU of each process

    @classmethod
    def from_env(cls) -> Limits:
        def number(name: str, default: int) -> int:
            return int(os.environ.get(name, default))

        base = cls()
        memory = number(MEMORY_ENV, base.memory_bytes)
        return cls(memory_bytes=memory, address_space_bytes=memory, disk_bytes=number(DISK_ENV, base.disk_bytes),
                   shm_bytes=number(SHM_ENV, base.shm_bytes), processes=number(PROCESSES_ENV, base.processes),
                   cpu_seconds=number(CPU_ENV, base.cpu_seconds))

    def json(self) -> str:
        return json.dumps(asdict(self))


def limits_key() -> str:
    """Everything about the sandbox that can change a grade (for a cache key)."""
    return Limits.from_env().json() + os.environ.get(CGROUPS_ENV, "")


# --- cgroups ------------------------------------------------------------------------------------------------

def _lines(path: str) -> list[str]:
    with open(path) as f:
        return f.read().splitlines()


def _mountinfo() -> list[tuple[str, str, str, str]]:
    """(root, mount point, fs type, super options) of each mount this process sees."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            tail = fields[fields.index("-") + 1:]
            found.append((fields[3], fields[4], tail[0], tail[2] if len(tail) > 2 else ""))
    return found


def _memory_on_for_children(folder: Path) -> bool:
    try:
        return "memory" in (folder / "cgroup.subtree_control").read_text().split()
    except OSError:
        return False


def delegated_v2_base(own: Path) -> Path | None:
    """Where submission cgroups can go below the grader's cgroup v2 `own`, or None.

    Either the memory controller is on for `own`'s children already (a root grader, or a delegation that
    did it), or `own` is the scope autograde reran itself in (`systemd_scope`: delegated to this user, the
    memory controller available, SCOPE_ENV set): then every process in it moves to a leaf
    `tml-<pid>-leaf` (cgroup v2 allows no process beside child cgroups) and the controller is switched on.
    A process born in such a leaf (a worker) finds the base one level up.
    """
    if _memory_on_for_children(own):
        return own
    if own.name.startswith("tml-") and own.name.endswith("-leaf") and _memory_on_for_children(own.parent):
        return own.parent
    if os.geteuid() == 0 or not os.environ.get(SCOPE_ENV):  # only ever the scope autograde made for itself
        return None
    try:
        if own.stat().st_uid != os.geteuid() or "memory" not in (own / "cgroup.controllers").read_text().split():
            return None
        leaf = own / f"tml-{os.getpid()}-leaf"
        leaf.mkdir(exist_ok=True)
        for pid in (own / "cgroup.procs").read_text().split():
            (leaf / "cgroup.procs").write_text(pid)
        (own / "cgroup.subtree_control").write_text("+memory")
    except OSError:
        return None
    return own if _memory_on_for_children(own) else None


class MemoryCgroups:
    """One cgroup per submission with its memory limit, below the grader's own cgroup.

    v2: needs the memory controller enabled for the grader's cgroup's children, or a subtree delegated to the
    grader where it can switch it on (`delegated_v2_base`); v1: needs write access to the memory hierarchy (a
    root grader). `detect()` returns None where neither works.
    """

    def __init__(self, version: int, base: Path, tag: str) -> None:
        self.version, self.base, self.tag = version, base, tag

    @classmethod
    def detect(cls, tag: str) -> MemoryCgroups | None:
        if os.environ.get(CGROUPS_ENV, "auto") == "off":
            return None
        for candidate in (cls._v2(tag), cls._v1(tag)):
            if candidate is not None and candidate._works():
                return candidate
        return None

    @classmethod
    def _v2(cls, tag: str) -> MemoryCgroups | None:
        try:
            path = next(line.split(":", 2)[2].strip() for line in _lines("/proc/self/cgroup") if line.startswith("0::"))
            mount = next(point for root, point, fstype, _ in _mountinfo() if fstype == "cgroup2" and root == "/")
        except (OSError, StopIteration):
            return None
        base = delegated_v2_base(Path(mount + path))
        return cls(2, base, tag) if base is not None else None

    @classmethod
    def _v1(cls, tag: str) -> MemoryCgroups | None:
        try:
            path = next(line.split(":", 2)[2].strip() for line in _lines("/proc/self/cgroup")
                        if "memory" in line.split(":", 2)[1].split(","))
            mount = next(point for root, point, fstype, opts in _mountinfo()
                         if fstype == "cgroup" and "memory" in opts.split(",") and root == "/")
        except (OSError, StopIteration, IndexError):
            return None
        return cls(1, Path(mount + path), tag)

    def sweep(self) -> None:
        """Remove the cgroups that workers no longer running left behind (a worker killed before its cleanup)."""
        for folder in self.base.glob("tml-*"):
            pid = folder.name.split("-")[1]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                try:
                    folder.rmdir()
                except OSError:
                    pass

    def _works(self) -> bool:
        try:
            self.create("probe", 2**30)
        except OSError:
            return False
        finally:
            self.remove("probe")
        return True

    def path(self, name: str) -> Path:
        return self.base / f"tml-{self.tag}-{name}"

    def create(self, name: str, memory_bytes: int) -> list[str]:
        """A fresh cgroup limited to `memory_bytes` (no swap); the cgroup.procs file a process writes 0 into."""
        folder = self.path(name)
        self.remove(name)
        folder.mkdir()
        if self.version == 2:
            (folder / "memory.max").write_text(str(memory_bytes))
            if (folder / "memory.swap.max").exists():
                (folder / "memory.swap.max").write_text("0")
            if (folder / "memory.oom.group").exists():  # over the limit, the whole submission goes, as with v1's
                (folder / "memory.oom.group").write_text("1")  # watchdog: the status then names the limit
        else:
            (folder / "memory.limit_in_bytes").write_text(str(memory_bytes))
            if (folder / "memory.memsw.limit_in_bytes").exists():
                (folder / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
        return [str(folder / "cgroup.procs")]

    def oom_kills(self, name: str) -> int:
        """How many processes the kernel killed in this cgroup for going over its limit."""
        folder = self.path(name)
        try:
            text = (folder / ("memory.events" if self.version == 2 else "memory.oom_control")).read_text()
        except OSError:
            return 0
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def remove(self, name: str) -> None:
        folder = self.path(name)
        for _ in range(200):  # processes that are exiting still hold it for a moment
            try:
                folder.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                import time

                time.sleep(0.01)


def systemd_scope(argv: list[str]) -> list[str] | None:
    """For a grader that gets no memory cgroup here (not root, nothing delegated): `argv` rerun in a systemd user
    scope whose cgroup is delegated to it (`systemd-run --user --scope -p Delegate=yes`), where that works; else None."""
    if os.geteuid() == 0 or os.environ.get(SCOPE_ENV) or os.environ.get(CGROUPS_ENV, "auto") == "off":
        return None
    run = shutil.which("systemd-run")
    if run is None or MemoryCgroups.detect(f"scope-{os.getpid()}") is not None:
        return None
    scope = [run, "--user", "--scope", "--quiet", "--collect", "-p", "Delegate=yes"]
    try:  # a user manager to talk to, and delegation allowed
        if subprocess.run([*scope, "true"], capture_output=True, timeout=20, check=False).returncode != 0:
            return None
    except (OSError, subprocess.SubprocessError):
        return None
    return [*scope, "--", *argv]


def memory_enforcement() -> str:
    """In a few words: what limits each submission's memory here (a cgroup, or the sandbox's watchdog)."""
    cgroups = MemoryCgroups.detect(f"check-{os.getpid()}")
    return (f"a cgroup v{cgroups.version} per submission" if cgroups else
            "the sandbox's watchdog (no memory cgroup here; `python -m grader.kernel.sandbox check` says more)")


def enforcement() -> dict[str, str]:
    """How each limit is enforced on this machine, for this user (for the instructor and the README)."""
    limits = Limits.from_env()
    cgroups = MemoryCgroups.detect(f"check-{os.getpid()}")
    memory = (f"cgroup v{cgroups.version} memory limit {limits.memory_bytes} bytes for all processes together"
              if cgroups else
              f"NO cgroup here (no delegated cgroup v2 memory controller, no writable v1 hierarchy): a watchdog "
              f"in the sandbox's PID 1 kills the submission when it holds more than {limits.memory_bytes} bytes: "
              f"the anonymous and shared memory of every process of its PID namespace (undumpable ones at their "
              f"resident size), System V IPC, its /tmp and /dev/shm, and the buffers of every socket of its network "
              f"namespace (polled every 50 ms); shared memory it could not count is refused (memfd_create, "
              f"anonymous shared mappings); NOT pipe buffers")
    if cgroups is None:
        from grader.kernel.memwatch import socket_bytes

        missing: list[str] = []
        socket_bytes(missing)
        if missing:
            memory += f" — NOT the buffers of {', '.join(missing)} sockets: this kernel cannot report them (sock_diag)"
    if cgroups is None and systemd_scope(["true"]) is not None:
        memory += ("; `python -m grader autograde` reruns itself in a systemd user scope with its cgroup delegated "
                   "(systemd-run --user --scope -p Delegate=yes), where each submission gets a cgroup instead")
    return {
        "memory": memory + f"; RLIMIT_AS {limits.memory_bytes} bytes per process",
        "processes": f"RLIMIT_NPROC {limits.processes} in the submission's user namespace",
        "writable space": f"tmpfs /tmp {limits.disk_bytes} bytes, /dev/shm {limits.shm_bytes} bytes, "
                          f"{limits.file_bytes} bytes per file (RLIMIT_FSIZE)",
        "cpu": f"RLIMIT_CPU {limits.cpu_seconds} s per process",
        "per-user quotas": "capped in the submission's user namespace, so it takes at most this much of yours: "
                           + ", ".join(f"{name} {value}" for name, value in USER_NS_QUOTAS.items() if value)
                           + ", " + ", ".join(f"{name} {value}" for name, value in QUOTA_RLIMITS),
        "user": ("a host uid of its own (2**20 + a pid) outside its user namespace, no capabilities"
                 if os.geteuid() == 0 else
                 f"uid {os.geteuid()} (yours) outside its user namespace, no capabilities"),
        "system calls": "seccomp filter at least as strict as Docker's default profile (grader/kernel/seccomp.py); "
                        "no keyring calls (each kernel also joins a fresh session keyring)",
    }
