"""Running a command as another Unix user, for tests that need people apart (students on a hub, an unprivileged
grader). Not a test module; root only: `setpriv` changes the ids; `accounts` adds system accounts (no home, no
login) for a test that needs names too, and removes them afterwards.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def unavailable(why: str) -> None:
    """Skip where the suite cannot act as another user — and fail in CI (CI=true), which runs as root."""
    if os.environ.get("CI") == "true":
        pytest.fail(why)
    pytest.skip(why)


def as_user(uid: int, *argv: str) -> list[str]:
    """`argv` run with user and group id `uid` and no supplementary groups."""
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *argv]


def python_for(uid: int, folder: Path) -> str:
    """An interpreter user `uid` can run with this environment's packages: this one, or a thin venv over them
    in `folder`, owned by `uid` (e.g. for a pyenv Python below /root, which other users cannot reach)."""
    if shutil.which("setpriv") is None:
        unavailable("setpriv (util-linux) is needed to run commands as another user")
    check = subprocess.run(as_user(uid, "/bin/sh", "-c", 'exec "$0" -c "import torch, grader"', sys.executable),
                           capture_output=True, cwd="/", check=False)
    if check.returncode == 0:
        return sys.executable
    base = shutil.which(f"python{sys.version_info.major}.{sys.version_info.minor}", path="/usr/local/bin:/usr/bin")
    if base is None:
        unavailable(f"no Python {sys.version_info.major}.{sys.version_info.minor} that user {uid} can run")
    venv = folder / "venv"
    if not venv.exists():
        subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True)
        site_packages = [p for p in sys.path if os.path.basename(p) == "site-packages"]
        pth = next(venv.glob("lib/python*/site-packages")) / "course-env.pth"
        pth.write_text("".join(f"import site; site.addsitedir({p!r})\n" for p in site_packages))
        for path in (venv, *venv.rglob("*")):  # the user's own, as if they made it: others may still read it
            os.chown(path, uid, uid, follow_symlinks=False)
        os.chmod(folder, os.stat(folder).st_mode | 0o555)
    return str(venv / "bin" / "python")


@contextmanager
def accounts(*names: str) -> Iterator[dict[str, int]]:
    """System accounts `names` (user and group of the same name, no home, no login shell), as name -> uid;
    removed on exit. An account of that name left by an interrupted run is reused."""
    import pwd

    if shutil.which("useradd") is None:
        unavailable("useradd (passwd) is needed to add test accounts")
    for name in names:
        try:
            pwd.getpwnam(name)
        except KeyError:
            subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "--user-group",
                            name], check=True, capture_output=True)
    try:
        yield {name: pwd.getpwnam(name).pw_uid for name in names}
    finally:
        for name in names:
            subprocess.run(["userdel", name], check=False, capture_output=True)


def in_child(step: Callable[[], dict]) -> dict:
    """What `step` returns when run in a forked child (one that may give up root for good), through a pipe as
    JSON; {"error": …} when it raises."""
    read, write = os.pipe()
    child = os.fork()
    if child == 0:
        found: dict = {"error": "no result"}
        try:
            found = step()
        except BaseException as exc:
            found = {"error": repr(exc)}
        finally:
            os.write(write, json.dumps(found).encode())
            os._exit(0)
    os.close(write)
    os.waitpid(child, 0)
    with os.fdopen(read, "rb") as pipe:
        return json.loads(pipe.read())
