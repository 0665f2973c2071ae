"""Stage A of a submission's sandbox: cgroups, fresh namespaces, the id maps, and the kernel's new root.

A is forked by the fork server (grader/kernel/forkserver.py) for each submission; it forks B, PID 1 of the
new PID namespace (grader/kernel/pid1.py), and exits with B's status. Standard library only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from grader.kernel import confine, pid1
from grader.kernel.protocol import Handshake, Request, SandboxLimits
from grader.kernel.syscalls import (
    CLONE_NEWCGROUP,
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWPID,
    CLONE_NEWUSER,
    CLONE_NEWUTS,
    MS_BIND,
    MS_NOATIME,
    MS_NODEV,
    MS_NODIRATIME,
    MS_NOEXEC,
    MS_NOSUID,
    MS_PRIVATE,
    MS_RDONLY,
    MS_REC,
    MS_RELATIME,
    MS_REMOUNT,
    PR_SET_DUMPABLE,
    check,
    die_with_parent,
    libc,
    mount,
    prctl,
)
from labkit.forking import fork_child

INSIDE_UID = INSIDE_GID = 1000  # the student's uid in its user namespace
NOBODY = 65534  # who a root grader's kernels are outside their namespace
# the device nodes the sandbox shows, and what serves each: /dev/full reads as zeros like /dev/zero but cannot be
# mapped, so no process makes anonymous shared memory through /dev/zero (seccomp refuses the other way in:
# grader/kernel/seccomp.py UNCOUNTABLE); writing to it fails (ENOSPC) where /dev/zero would discard
DEVICES = {"null": "null", "zero": "full", "full": "full", "random": "random", "urandom": "urandom"}


def _mount_flags(path: str) -> int:
    """The flags of the mount at `path` that a less privileged namespace may not clear (they are locked)."""
    f_flag = os.statvfs(path).f_flag
    flags = 0
    for st, ms in ((os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV), (os.ST_NOEXEC, MS_NOEXEC),
                   (os.ST_NOATIME, MS_NOATIME), (os.ST_NODIRATIME, MS_NODIRATIME), (os.ST_RELATIME, MS_RELATIME)):
        if f_flag & st:
            flags |= ms
    return flags


def _mounts_under(target: str) -> list[str]:
    """The mount at `target` (the one on top) and every mount below it, parents first."""
    entries = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            point = fields[4].encode().decode("unicode_escape") if "\\" in fields[4] else fields[4]
            entries.append((fields[0], fields[1], point))
    tops = [mount_id for mount_id, _, point in entries if point == target]
    if not tops:
        return []
    found, ids = [target], {tops[-1]}
    for mount_id, parent, point in entries:  # mountinfo lists a mount after its parent
        if parent in ids and mount_id not in ids:
            ids.add(mount_id)
            found.append(point)
    return found


def make_path(root: str, path: str, is_dir: bool) -> str:
    """Create `path` (and its parents) inside `root`; returns the full path."""
    full = root + path
    os.makedirs(full if is_dir else os.path.dirname(full), exist_ok=True)
    if not is_dir and not os.path.exists(full):
        open(full, "w").close()
    return full


def _bind(source_fd: int, root: str, target: str, is_dir: bool, readonly: bool,
          extra: int = MS_NOSUID | MS_NODEV) -> None:
    """Bind the file or folder open as `source_fd` at `target` in `root`, recursively; read-only all the way down."""
    full = make_path(root, target, is_dir)
    mount(f"/proc/self/fd/{source_fd}", full, None, MS_BIND | MS_REC)
    if readonly:
        for point in _mounts_under(full):
            mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | extra | _mount_flags(point))


Source = tuple[str, "int | str", bool]  # (path, O_PATH descriptor or symlink target, is a folder)


def _open_sources(paths: list[str]) -> list[Source]:
    """(path, O_PATH descriptor or symlink target, is a folder) for each path, opened while the host is visible."""
    sources: list[Source] = []
    for path in paths:
        if not os.path.lexists(path):
            continue
        if os.path.islink(path) and os.path.dirname(path) == "/":  # /bin -> usr/bin (merged /usr): the same link
            sources.append((path, os.readlink(path), False))
        else:
            sources.append((path, os.open(path, os.O_PATH), os.path.isdir(path)))
    return sources


@dataclass
class Opened:
    """Everything the new root shows, opened while the host's files are visible and the grader's uid can reach them."""

    binds: list[Source]
    devices: list[Source]
    folder: int  # the socket folder

    @classmethod
    def of(cls, request: Request) -> Opened:
        devices = [(f"/dev/{node}", fd, False) for node, served_by in DEVICES.items()
                   for _, fd, _ in _open_sources([f"/dev/{served_by}"])]
        return cls(_open_sources(request["ro_binds"]), devices, os.open(request["folder"], os.O_PATH | os.O_DIRECTORY))

    def close(self) -> None:
        for _, source, _ in self.binds + self.devices:
            if isinstance(source, int):
                os.close(source)
        os.close(self.folder)


def _dev(root: str, limits: SandboxLimits, devices: list[Source]) -> None:
    """/dev: the harmless device nodes, the usual links, a sized /dev/shm; read-only itself."""
    dev = make_path(root, "/dev", True)
    mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,nr_inodes=64,mode=0755")
    for path, source, _ in devices:
        assert isinstance(source, int)
        _bind(source, root, path, False, readonly=True, extra=MS_NOSUID | MS_NOEXEC)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{dev}/{name}")
    shm = make_path(root, "/dev/shm", True)
    mount(None, dev, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NOEXEC)
    if limits["shm_bytes"] > 0:
        mount("tmpfs", shm, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
              f"size={limits['shm_bytes']},nr_inodes=1024,mode=1777")


def build_root(request: Request, opened: Opened) -> str:
    """In A's new mount namespace: the kernel's root filesystem, on a tmpfs mounted over /tmp."""
    limits = request["limits"]
    mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=4096,mode=0755")
    root = "/tmp/root"
    os.mkdir(root)
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=4096,mode=0755")
    # writable space: sized, and gone with the namespace (first: a bind below /tmp must stay on top of it)
    scratch = make_path(root, "/tmp", True)
    mount("tmpfs", scratch, "tmpfs", MS_NOSUID | MS_NODEV,
          f"size={limits['disk_bytes']},nr_inodes={limits['inodes']},mode=1777")
    for path, source, is_dir in opened.binds:
        if isinstance(source, str):
            os.symlink(source, root + path)
        else:
            _bind(source, root, path, is_dir, readonly=True)
    _dev(root, limits, opened.devices)
    # the socket folder: the only place shared with the grader, read-only once the kernel listens
    inside = make_path(root, request["folder"], True)
    mount(f"/proc/self/fd/{opened.folder}", inside, None, MS_BIND)
    mount(None, inside, None, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV | MS_NOEXEC | _mount_flags(inside))
    opened.close()
    make_path(root, "/proc", True)
    make_path(root, "/oldroot", True)
    return root


def _unshare(to_server: int, from_server: int) -> None:
    """New namespaces of every kind; the server maps the user namespace's ids (it may, A may not)."""
    check(libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWNET | CLONE_NEWUTS | CLONE_NEWPID
                       | CLONE_NEWCGROUP), "unshare")
    prctl(PR_SET_DUMPABLE, 1)  # so that the server, same uid when not root, may write its id maps
    os.write(to_server, Handshake.UNSHARED.value)
    if os.read(from_server, 1) != Handshake.MAPPED.value:
        raise RuntimeError("the fork server did not map the user namespace's ids")
    prctl(PR_SET_DUMPABLE, 0)
    os.close(to_server)
    os.close(from_server)


def run_a(request: Request, report_w: int, to_server: int, from_server: int) -> int:
    """A: cgroups, namespaces, ids, the new root; then B. Returns B's exit status as A's."""
    server = os.getppid()
    die_with_parent(server)
    os.setsid()
    for procs in request["cgroups"]:  # before anything else: every later process inherits them
        with open(procs, "w") as f:
            f.write("0")
    root_grader = os.geteuid() == 0
    if root_grader:
        os.setgroups([])
    _unshare(to_server, from_server)
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    opened = Opened.of(request)
    if root_grader:  # from here on nobody outside the namespace (its capabilities inside stay, for the mounts)
        confine.cap_ipc_limits("/proc/sys/kernel")  # the new IPC namespace's: only the host's root may write them
        os.setresgid(INSIDE_GID, INSIDE_GID, INSIDE_GID)
        os.setresuid(INSIDE_UID, INSIDE_UID, INSIDE_UID)
        die_with_parent(server)  # a change of uid clears the parent-death signal
    root = build_root(request, opened)
    alive_r, alive_w = os.pipe()  # B's way to see A die before it set its parent-death signal

    def become_b() -> int:
        os.close(alive_w)
        return pid1.run_b(request, root, report_w, alive_r)

    pid = fork_child(become_b)
    os.close(alive_r)
    os.close(report_w)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code
