"""A Jupyter kernel that runs as an unprivileged user: the Gradescope autograder's isolation where the sandbox cannot
be built (a container that forbids user namespaces), as Gradescope's best practices describe it.

`python grader/platforms/student_kernel.py CONNECTION_FILE`, started by jupyter_client as root (the kernelspec that
grader/platforms/gradescope.py writes names it), hands the kernel's folder to the user, becomes that user with no
supplementary groups and no way to regain privileges, stops whatever an earlier kernel of that user left running,
takes the sandbox's kernel environment in place of run_autograder's, and becomes the kernel (gradescope.grade stops
every process of the user again once the hand-in is graded). The grader's files that matter (solutions/, build/ with
the reference records, grader/, the results folder) are not readable by that user (`gradescope.prepare` and
`gradescope.run` set that).

It then confines the kernel as far as an unprivileged process can: the sandbox's per-process limits (address
space, processes and threads of the user, CPU time, file size; grader/kernel/limits.py) and the sandbox's seccomp
filter (grader/kernel/seccomp.py, through pyseccomp: so no longer standard library only; the grading environment
has it, and everything the user cannot read is imported as root first) with socket() refused for every family but
AF_UNIX and NETLINK_ROUTE: no network at all (the kernel's own sockets are ipc ones,
grader.judge.grading.plain_kernel_factory). Where NETWORK_ENV is set (notebook 07: gloo's ranks meet over loopback
TCP, which seccomp cannot tell from any other address) the families stay as in the sandbox. What stays open
(README, Gradescope): the network on 07, memory beyond one process's limit (many processes together), the
container's other files.
"""

from __future__ import annotations

import ctypes
import os
import pwd
import resource
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from grader.kernel.limits import Limits

USER = "tml-student"  # created by setup.sh
UID_ENV = "TML_STUDENT_UID"  # a uid to use where that user does not exist (a local run)
PR_SET_NO_NEW_PRIVS = 38
NETWORK_ENV = "TML_STUDENT_NETWORK"  # "inet": the kernel may open network sockets (set by the grader, for 07)


def student() -> tuple[int, int]:
    """(uid, gid) of the user who runs student code."""
    try:
        entry = pwd.getpwnam(USER)
        return entry.pw_uid, entry.pw_gid
    except KeyError:
        if os.environ.get(UID_ENV, "").isdigit():
            uid = int(os.environ[UID_ENV])
            return uid, uid
    raise SystemExit(f"no user {USER} (setup.sh creates it) and no {UID_ENV}: refusing to run student code as root")


def _drop_to(uid: int, gid: int) -> None:
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise SystemExit("prctl(PR_SET_NO_NEW_PRIVS) failed")


def _kill_the_rest() -> None:
    """Every process of this process's user but this one (kill(-1) spares its caller)."""
    try:
        os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:
        pass


def become_student(connection_file: str, kernel_env: dict[str, str] | None = None) -> None:
    """Become the student's user in the kernel's folder, with `kernel_env` (the sandbox's kernel environment,
    grader.kernel.sandbox.kernel_env) as the whole environment: nothing of run_autograder's (an instructor's
    exported token, say) reaches student code."""
    uid, gid = student()
    if uid == 0:
        raise SystemExit("the student's uid is 0")
    folder = Path(connection_file).parent
    for path in (folder, Path(connection_file)):
        os.chown(path, uid, gid)
    _drop_to(uid, gid)
    _kill_the_rest()  # an earlier kernel's leftovers
    os.umask(0o077)
    os.chdir(folder)
    os.environ.clear()
    os.environ.update(kernel_env or {}, HOME=str(folder), USER=USER, LOGNAME=USER,
                      MPLCONFIGDIR=str(folder / ".matplotlib"))


def stop_students_processes(rounds: int = 20) -> bool:
    """(As root) stop every process of the student's user, daemons a kernel left running included: a child that
    becomes that user kills all of them, again until none is left (one forking meanwhile can escape a round).
    True when none is left."""
    uid, gid = student()
    for _ in range(rounds):
        if not _processes_of(uid):
            return True
        child = os.fork()
        if child == 0:
            try:
                _drop_to(uid, gid)
                _kill_the_rest()
            finally:
                os._exit(0)
        os.waitpid(child, 0)
    return not _processes_of(uid)


def _processes_of(uid: int) -> list[int]:
    """The processes (not zombies: their user can no longer run anything) that run as `uid`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:  # gone meanwhile
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if int(fields["Uid"].split()[1]) == uid and not fields["State"].strip().startswith("Z"):
            found.append(int(pid))
    return found


def confine(syscalls: object, limits: Limits) -> None:
    """The sandbox's per-process `limits`, then `syscalls` (seccomp.build's filter) for this process and all it
    starts; both made as root (grader/ is unreadable to the user). After become_student: no_new_privs lets an
    unprivileged process load a filter."""
    for kind, value in ((resource.RLIMIT_AS, limits.address_space_bytes), (resource.RLIMIT_NPROC, limits.processes),
                        (resource.RLIMIT_CPU, limits.cpu_seconds), (resource.RLIMIT_FSIZE, limits.file_bytes)):
        resource.setrlimit(kind, (value, value))
    syscalls.load()  # type: ignore[attr-defined]


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # started by path: the grader of this tree
    from grader.kernel import seccomp
    from grader.kernel.limits import Limits
    from grader.kernel.sandbox import kernel_env

    syscalls = seccomp.build(network=os.environ.get(NETWORK_ENV) == "inet")
    limits = Limits.from_env()  # the instructor's limits, read before the environment is the kernel's
    become_student(sys.argv[1], kernel_env())
    confine(syscalls, limits)
    os.execv(sys.executable, [sys.executable, "-m", "ipykernel_launcher", "-f", sys.argv[1]])
