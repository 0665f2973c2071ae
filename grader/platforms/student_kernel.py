"""A Jupyter kernel that runs as an unprivileged user: the Gradescope autograder's isolation where the sandbox cannot
be built (a container that forbids user namespaces), as Gradescope's best practices describe it.

`python grader/platforms/student_kernel.py CONNECTION_FILE`, started by jupyter_client as root (the kernelspec that
grader/platforms/gradescope.py writes names it), hands the kernel's folder to the user, becomes that user with no
supplementary groups and no way to regain privileges, stops whatever an earlier kernel of that user left running,
and becomes the kernel. The grader's files that matter (solutions/, build/ with the reference records, grader/, the
results folder) are not readable by that user (`gradescope.prepare` and `gradescope.run` set that). Unlike the
sandbox, nothing limits memory or the network here: the container is the limit. Standard library only.
"""

from __future__ import annotations

import ctypes
import os
import pwd
import signal
import sys
from pathlib import Path

USER = "tml-student"  # created by setup.sh
UID_ENV = "TML_STUDENT_UID"  # a uid to use where that user does not exist (a local run)
PR_SET_NO_NEW_PRIVS = 38


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


def become_student(connection_file: str) -> None:
    uid, gid = student()
    if uid == 0:
        raise SystemExit("the student's uid is 0")
    folder = Path(connection_file).parent
    for path in (folder, Path(connection_file)):
        os.chown(path, uid, gid)
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise SystemExit("prctl(PR_SET_NO_NEW_PRIVS) failed")
    try:
        os.kill(-1, signal.SIGKILL)  # every process this user still has (an earlier kernel's leftovers), not this one
    except ProcessLookupError:
        pass
    os.umask(0o077)
    os.chdir(folder)
    os.environ.update(HOME=str(folder), USER=USER, LOGNAME=USER, MPLCONFIGDIR=str(folder / ".matplotlib"))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    become_student(sys.argv[1])
    os.execv(sys.executable, [sys.executable, "-m", "ipykernel_launcher", "-f", sys.argv[1]])
