"""The fork server's wire formats as named types; standard library only (the sandbox's side imports it).

- The worker's control connection: one JSON line, a `Request` (build a sandbox and start a kernel) or a sync,
  `{}` (the server answers `IDLE` once every submission is gone) or `{"folder": F}` (once the submission of
  socket folder F is gone; at once when there is none); after a kernel exits, one JSON line `Report` back.
- The one-byte pipe handshakes between the server and a submission's stages (`Handshake`).
"""

from __future__ import annotations

import enum
from typing import TypedDict

try:  # Python 3.11+
    from typing import NotRequired
except ImportError:  # pragma: no cover - Python 3.10
    from typing_extensions import NotRequired

IDLE = b"idle\n"  # the answer to a sync


class SandboxLimits(TypedDict):
    """grader.kernel.limits.Limits as sent: what one submission may use."""

    memory_bytes: int
    address_space_bytes: int
    file_bytes: int
    disk_bytes: int
    shm_bytes: int
    inodes: int
    processes: int
    cpu_seconds: int


class Request(TypedDict):
    """What the server needs to build one submission's sandbox (grader.kernel.sandbox.sandbox_request)."""

    folder: str  # the socket folder shared with the grader, read-only once the kernel listens
    ro_binds: list[str]  # what the new root shows, read-only
    env: dict[str, str]  # the kernel's environment
    cgroups: list[str]  # cgroup.procs files the submission joins first ([]: none)
    watchdog: bool  # no cgroup limits its memory: the sandbox's PID 1 counts it (grader.kernel.memwatch)
    limits: SandboxLimits
    connection_file: NotRequired[str]  # the kernel's connection file inside the socket folder
    probe: NotRequired[bool]  # only build the sandbox and check it holds no privilege (sandbox.why_unavailable)


class Report(TypedDict):
    """The server's answer once a submission's kernel has exited."""

    exit: int  # the kernel's exit status (128 + signal when a signal ended it)
    reason: str  # the limit that killed it, when one did; else ''


class Handshake(bytes, enum.Enum):
    """The one-byte messages on the pipes between a submission's supervisor S (forked by the server), A, B (PID 1)
    and the kernel C."""

    UNSHARED = b"u"  # A -> S: my user namespace exists, write its id maps
    MAPPED = b"m"  # S -> A: the maps are written
    LISTENING = b"r"  # C -> B: my sockets are bound, seal the socket folder
    SEALED = b"a"  # B -> C: the socket folder is read-only, start serving
