"""The grading sandbox, built afresh for every submission by a warm process that has torch imported.

`grader.kernel.sandbox.ForkServer` starts this file (an ordinary process of the grader's user) and hands it
a listening Unix socket in a folder only that user can open. The server imports what every kernel
would import, then serves one connection per submission. For each one it forks:

    A  joins the submission's cgroups, unshares user, mount, IPC, network, UTS, PID and cgroup
       namespaces, builds a new root (read-only binds of the system, Python and helpers/; sized
       tmpfs for /tmp and /dev/shm; the submission's socket folder), and takes uid 1000 in its user
       namespace, which is `nobody` outside when the grader is root and the grader's own uid otherwise;
    B  PID 1 of the new PID namespace: mounts /proc, pivots into the new root, brings up loopback,
       reaps orphans, enforces the memory limit when no cgroup does (a watchdog), and says why the
       kernel died; when it exits the kernel kills every process left in the namespace;
    C  the kernel: resource limits, every capability dropped for good (no_new_privs, empty bounding
       set), then ipykernel. Once its sockets are bound, B makes the socket folder read-only.

Nothing a kernel leaves survives it: its files live in tmpfs mounts of its own mount namespace, its
processes in its PID namespace, its IPC objects in its IPC namespace, its keys in a session keyring of
its own, and all of them go when B exits. The server and A are outside the kernel's PID namespace, so it
cannot signal or trace them, and A closes every descriptor it inherited from the server (the listening
socket above all) before anything else. The kernel's own stdout and stderr reach the worker's log
through B, 64 KiB at most.

This file imports nothing from grader/: it also runs on its own (`--single`, one kernel, no preload).
"""

from __future__ import annotations

import ctypes
import fcntl
import gc
import importlib
import json
import os
import pkgutil
import resource
import select
import signal
import socket
import struct
import sys
import time
import traceback

# Imported before forking: together they are most of a notebook kernel's start-up time.
PRELOAD = ("numpy", "torch", "torch.nn", "torch.nn.functional", "matplotlib.pyplot", "ipywidgets",
           "ipykernel.kernelapp", "ipykernel.ipkernel", "ipykernel.debugger", "IPython.core.debugger", "sqlite3",
           "tornado.queues", "faulthandler", "helpers", "labkit")
INSIDE_UID = INSIDE_GID = 1000  # the student's uid in its user namespace
NOBODY = 65534  # who a root grader's kernels are outside their namespace

CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC = 0x20000, 0x2000000, 0x4000000, 0x8000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = (
    1, 2, 4, 8, 32, 4096, 16384, 1 << 18)
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 4, 24, 38
PR_SET_CHILD_SUBREAPER, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 36, 47, 4
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 1
SYS_KEYCTL = {"x86_64": 250, "aarch64": 219, "riscv64": 219, "ppc64le": 271, "s390x": 280}
KEYCTL_JOIN_SESSION_KEYRING = 1

_libc = ctypes.CDLL(None, use_errno=True)


def _call(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def _prctl(option: int, arg: int = 0) -> None:
    _call(_libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), f"prctl({option})")


def _bytes(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    _call(_libc.mount(_bytes(source), _bytes(target), _bytes(fstype), ctypes.c_ulong(flags), _bytes(data)),
          f"mount {target}")


# --- the server ---------------------------------------------------------------------------------------------

def preload() -> None:
    """Import what every kernel would import; a module that fails here fails again, visibly, in the kernel."""
    for name in PRELOAD:
        try:
            module = importlib.import_module(name)
        except Exception:
            continue
        if name in ("helpers", "labkit"):
            for info in pkgutil.iter_modules(module.__path__, f"{name}."):
                try:
                    importlib.import_module(info.name)
                except Exception:
                    pass
    # Objects of the preloaded modules are never collected: a kernel's garbage collector then neither scans
    # them nor copies their pages (fork shares memory until it is written).
    gc.freeze()


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def _write_id_maps(pid: int) -> None:
    """Map uid/gid 1000 inside A's new user namespace: to `nobody` for a root grader, else to the grader's uid.

    Written from here because only a process outside the new namespace may map ids other than its own.
    """
    uid, gid = os.geteuid(), os.getegid()
    outside_uid, outside_gid = (NOBODY, NOBODY) if uid == 0 else (uid, gid)
    if uid != 0:
        with open(f"/proc/{pid}/setgroups", "w") as f:  # required before an unprivileged gid_map
            f.write("deny")
    with open(f"/proc/{pid}/uid_map", "w") as f:
        f.write(f"{INSIDE_UID} {outside_uid} 1\n")
    with open(f"/proc/{pid}/gid_map", "w") as f:
        f.write(f"{INSIDE_GID} {outside_gid} 1\n")


def _reap_all(deadline: float) -> None:
    """Wait until every child of this process has exited (the server is a subreaper: orphans come here)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            if time.monotonic() > deadline:
                print("forkserver: a submission's process would not exit", file=sys.stderr)
                return
            time.sleep(0.005)


def _close_all_but(*keep: int) -> None:
    """Close every inherited descriptor but `keep`: the server's socket must not reach a kernel."""
    for name in os.listdir("/proc/self/fd"):
        if int(name) not in keep:
            try:
                os.close(int(name))
            except OSError:
                pass  # the descriptor of the listing itself, closed already


def start_submission(request: dict, limits: dict) -> tuple[int, int, int]:
    """Fork A for `request`, map its ids; (A's pid, a pidfd for it, the read end of B's report pipe)."""
    report_r, report_w = os.pipe()
    to_a_r, to_a_w = os.pipe()
    from_a_r, from_a_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            _close_all_but(0, 1, 2, report_w, from_a_w, to_a_r)  # the listening socket above all
            code = run_a(request, limits, report_w, from_a_w, to_a_r)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stderr.flush()
            os._exit(code)
    for fd in (report_w, to_a_r, from_a_w):
        os.close(fd)
    pidfd = os.pidfd_open(pid)
    try:
        ready, _, _ = select.select([from_a_r], [], [], 30)
        if ready and os.read(from_a_r, 1) == b"u":
            _write_id_maps(pid)
            os.write(to_a_w, b"m")
    except OSError as exc:  # A dies without its maps: the supervisor sees it at once
        print(f"forkserver: cannot map the ids of the submission's user namespace: {exc}", file=sys.stderr)
    finally:
        os.close(from_a_r)
        os.close(to_a_w)
    return pid, pidfd, report_r


def supervise(conn: socket.socket | None, pidfd: int) -> bool:
    """Wait until A exits (True) or the grader hangs up (False)."""
    watched = [pidfd] + ([conn] if conn is not None else [])
    while True:
        readable, _, _ = select.select(watched, [], [])
        if pidfd in readable:
            return True
        if conn is not None and conn in readable and not conn.recv(1):
            return False


def _read_report(fd: int) -> str:
    os.set_blocking(fd, False)
    chunks = []
    try:
        while chunk := os.read(fd, 4096):
            chunks.append(chunk)
    except BlockingIOError:
        pass
    os.close(fd)
    return b"".join(chunks).decode(errors="replace").strip()[:500]


def finish_submission(pid: int, pidfd: int, report_r: int, hung_up: bool) -> tuple[int, str]:
    """Kill what is left of the submission, wait until all of it is gone; (A's exit status, B's report)."""
    if hung_up:
        try:
            os.kill(pid, signal.SIGKILL)  # B follows (its parent-death signal), and with it the namespace
        except ProcessLookupError:
            pass
    _, status = os.waitpid(pid, 0)
    os.close(pidfd)
    _reap_all(time.monotonic() + 30)
    return os.waitstatus_to_exitcode(status), _read_report(report_r)


def serve(listener: socket.socket) -> None:
    me = os.geteuid()
    while True:
        conn, _ = listener.accept()
        with conn:
            if _peer_uid(conn) not in (me, 0):  # only the grader's user may ask
                continue
            request = json.loads(conn.makefile().readline() or "{}")
            if "connection_file" not in request:  # a sync: answer once the last submission is gone
                conn.sendall(b"idle\n")
                continue
            pid, pidfd, report_r = start_submission(request, request["limits"])
            hung_up = not supervise(conn, pidfd)
            code, report = finish_submission(pid, pidfd, report_r, hung_up)
            if not hung_up:
                try:
                    conn.sendall((json.dumps({"exit": code, "reason": report}) + "\n").encode())
                except OSError:
                    pass


def _die_with_parent(parent: int | None = None) -> None:
    """SIGKILL when the parent dies; exit now if it (`parent`, by default the current one) already has."""
    parent = os.getppid() if parent is None else parent
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)


def main() -> None:
    if sys.argv[1] == "--single":  # one kernel, no fork server: `python forkserver.py --single REQUEST`
        request = json.loads(sys.argv[2])
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
        pid, pidfd, report_r = start_submission(request, request["limits"])
        supervise(None, pidfd)
        code, report = finish_submission(pid, pidfd, report_r, False)
        if report:
            print(f"sandbox: {report}", file=sys.stderr)
        sys.exit(code)
    listen_fd = int(sys.argv[1])
    _die_with_parent()
    _prctl(PR_SET_DUMPABLE, 0)  # no process of the grader's user can read this one's memory
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    preload()
    serve(socket.socket(fileno=listen_fd))


# --- A: namespaces and the new root -------------------------------------------------------------------------

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


def _make_path(root: str, path: str, is_dir: bool) -> str:
    """Create `path` (and its parents) inside `root`; returns the full path."""
    full = root + path
    os.makedirs(full if is_dir else os.path.dirname(full), exist_ok=True)
    if not is_dir and not os.path.exists(full):
        open(full, "w").close()
    return full


def _bind(source_fd: int, root: str, target: str, is_dir: bool, readonly: bool,
          extra: int = MS_NOSUID | MS_NODEV) -> None:
    """Bind the file or folder open as `source_fd` at `target` in `root`, recursively; read-only all the way down."""
    full = _make_path(root, target, is_dir)
    _mount(f"/proc/self/fd/{source_fd}", full, None, MS_BIND | MS_REC)
    if readonly:
        for point in _mounts_under(full):
            _mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | extra | _mount_flags(point))


def _open_sources(paths: list[str]) -> list[tuple[str, int | str, bool]]:
    """(path, O_PATH descriptor or symlink target, is a folder) for each path, opened while the host is visible."""
    sources: list[tuple[str, int | str, bool]] = []
    for path in paths:
        if not os.path.lexists(path):
            continue
        if os.path.islink(path) and os.path.dirname(path) == "/":  # /bin -> usr/bin (merged /usr): the same link
            sources.append((path, os.readlink(path), False))
        else:
            sources.append((path, os.open(path, os.O_PATH), os.path.isdir(path)))
    return sources


def open_sources(request: dict) -> dict:
    """Everything the new root shows, opened while the host's files are visible and the grader's uid can reach them."""
    return {"binds": _open_sources(request["ro_binds"]),
            "devices": _open_sources([f"/dev/{node}" for node in ("null", "zero", "full", "random", "urandom")]),
            "folder": os.open(request["folder"], os.O_PATH | os.O_DIRECTORY)}


def build_root(request: dict, limits: dict, opened: dict) -> str:
    """In A's new mount namespace: the kernel's root filesystem, on a tmpfs mounted over /tmp."""
    sources, devices, folder_fd = opened["binds"], opened["devices"], opened["folder"]
    _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=4096,mode=0755")
    root = "/tmp/root"
    os.mkdir(root)
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=4096,mode=0755")
    # writable space: sized, and gone with the namespace (first: a bind below /tmp must stay on top of it)
    scratch = _make_path(root, "/tmp", True)
    _mount("tmpfs", scratch, "tmpfs", MS_NOSUID | MS_NODEV,
           f"size={limits['disk_bytes']},nr_inodes={limits['inodes']},mode=1777")
    for path, source, is_dir in sources:
        if isinstance(source, str):
            os.symlink(source, root + path)
        else:
            _bind(source, root, path, is_dir, readonly=True)
    dev = _make_path(root, "/dev", True)
    _mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,nr_inodes=64,mode=0755")
    for path, source, _ in devices:
        _bind(source, root, path, False, readonly=True, extra=MS_NOSUID | MS_NOEXEC)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{dev}/{name}")
    shm = _make_path(root, "/dev/shm", True)
    _mount(None, dev, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NOEXEC)
    if limits["shm_bytes"] > 0:
        _mount("tmpfs", shm, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
               f"size={limits['shm_bytes']},nr_inodes=1024,mode=1777")
    # the socket folder: the only place shared with the grader, read-only once the kernel listens
    inside = _make_path(root, request["folder"], True)
    _mount(f"/proc/self/fd/{folder_fd}", inside, None, MS_BIND)
    _mount(None, inside, None, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV | MS_NOEXEC | _mount_flags(inside))
    for _, source, _ in sources + devices:
        if isinstance(source, int):
            os.close(source)
    os.close(folder_fd)
    _make_path(root, "/proc", True)
    _make_path(root, "/oldroot", True)
    return root


def run_a(request: dict, limits: dict, report_w: int, to_server: int, from_server: int) -> int:
    """A: cgroups, namespaces, ids, the new root; then B. Returns B's exit status as A's."""
    server = os.getppid()
    _die_with_parent(server)
    os.setsid()
    for procs in request.get("cgroups", []):  # before anything else: every later process inherits them
        with open(procs, "w") as f:
            f.write("0")
    root_grader = os.geteuid() == 0
    if root_grader:
        os.setgroups([])
    _call(_libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWNET | CLONE_NEWUTS | CLONE_NEWPID
                        | CLONE_NEWCGROUP), "unshare")
    _prctl(PR_SET_DUMPABLE, 1)  # so that the server, same uid when not root, may write its id maps
    os.write(to_server, b"u")
    if os.read(from_server, 1) != b"m":
        raise RuntimeError("the fork server did not map the user namespace's ids")
    _prctl(PR_SET_DUMPABLE, 0)
    os.close(to_server)
    os.close(from_server)
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    opened = open_sources(request)
    if root_grader:  # from here on nobody outside the namespace (its capabilities inside stay, for the mounts)
        os.setresgid(INSIDE_GID, INSIDE_GID, INSIDE_GID)
        os.setresuid(INSIDE_UID, INSIDE_UID, INSIDE_UID)
        _die_with_parent(server)  # a change of uid clears the parent-death signal
    root = build_root(request, limits, opened)
    alive_r, alive_w = os.pipe()  # B's way to see A die before it set its parent-death signal
    pid = os.fork()
    if pid == 0:
        os.close(alive_w)
        code = 1
        try:
            code = run_b(request, limits, root, report_w, alive_r)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stderr.flush()
            os._exit(code)
    os.close(alive_r)
    os.close(report_w)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code


# --- B: PID 1 of the submission -----------------------------------------------------------------------------

def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifreq = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s, SIOCGIFFLAGS, ifreq))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


def _write(path: str, value: object) -> None:
    with open(path, "w") as f:
        f.write(f"{value}\n")


def enter_root(root: str, limits: dict) -> None:
    """B: a /proc of the new PID namespace, then pivot into `root` and drop the old one."""
    _mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    try:  # no user namespace below this one: nothing to mount, nothing to unlock (hardening: best effort)
        _write(f"{root}/proc/sys/user/max_user_namespaces", 0)
    except OSError:
        pass
    for covered in ("sys", "sysrq-trigger", "irq", "bus"):  # as bubblewrap does: kernel knobs stay read-only
        path = f"{root}/proc/{covered}"
        if os.path.exists(path):
            _mount(path, path, None, MS_BIND | MS_REC)
            _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _call(_libc.syscall(SYS_PIVOT_ROOT[os.uname().machine], root.encode(), (root + "/oldroot").encode()),
          "pivot_root")
    os.chdir("/")
    _call(_libc.umount2(b"/oldroot", MNT_DETACH), "umount /oldroot")
    os.rmdir("/oldroot")
    _mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)  # the skeleton itself


def _tasks() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and p != "1"]


def _anon_bytes(pid: int, source: str = "status") -> int:
    """Anonymous and shared memory of one process: resident (quick, an upper bound) or proportional (smaps)."""
    keys = ("RssAnon:", "RssShmem:") if source == "status" else ("Pss_Anon:", "Pss_Shmem:")
    total = 0
    try:
        with open(f"/proc/{pid}/{source}") as f:
            for line in f:
                if line.startswith(keys):
                    total += int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return total


class MemoryWatch:
    """The memory limit where no cgroup enforces it: PID 1 adds up what the namespace's processes hold.

    Counted: anonymous and shared memory of every process (pages shared with the fork server, torch
    imported once, in proportion: their resident size first, cheap and never less, and only above the
    limit the proportional size), System V segments and message queues, and memfd files (their
    descriptors are looked at every half second). Files in /tmp and /dev/shm are bounded by those
    mounts' sizes instead.
    """

    FD_SCAN_S = 0.5

    def __init__(self, limit: int) -> None:
        self.limit, self.memfd, self.scanned = limit, 0, 0.0

    def over(self) -> int:
        """0, or the bytes held together when that is above the limit."""
        pids = _tasks()
        if time.monotonic() - self.scanned > self.FD_SCAN_S:
            self.memfd, self.scanned = _memfd_bytes(pids), time.monotonic()
        fixed = _sysv_bytes() + self.memfd
        if fixed + sum(_anon_bytes(p) for p in pids) <= self.limit:
            return 0
        used = fixed + sum(_anon_bytes(p, "smaps_rollup") for p in pids)
        return used if used > self.limit else 0


def _memfd_bytes(pids: list[int]) -> int:
    """Memory in memfd files any of `pids` holds open (each file once): it belongs to no process's resident set."""
    seen: dict[tuple[int, int], int] = {}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            path = f"/proc/{pid}/fd/{fd}"
            try:
                if os.readlink(path).startswith("/memfd:"):
                    info = os.stat(path)
                    seen[(info.st_dev, info.st_ino)] = info.st_blocks * 512
            except OSError:
                continue
    return sum(seen.values())


def _sysv_bytes() -> int:
    """System V shared memory no process has attached (attached segments count as the processes' memory),
    and message queues: they live in the namespace, not in any process."""
    total = 0
    for table, column, attached in (("shm", "rss", "nattch"), ("msg", "cbytes", None)):
        try:
            with open(f"/proc/sysvipc/{table}") as f:
                header = f.readline().split()
                for line in f:
                    row = dict(zip(header, line.split()))
                    if attached is None or row.get(attached) == "0":
                        total += int(row.get(column, 0))
        except (OSError, ValueError):
            pass
    return total


def _size(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


class _Output:
    """The kernel's own stdout and stderr (not what cells print: that goes to the grader as messages).

    Passed on to the worker's log up to a limit, then dropped, so a submission cannot fill the disk with it.
    """

    LIMIT = 64 * 1024

    def __init__(self, fd: int) -> None:
        self.fd, self.passed = fd, 0
        os.set_blocking(fd, False)

    def drain(self) -> bool:
        """Pass on what is there; False once no process of the sandbox can write to it any more."""
        try:
            while chunk := os.read(self.fd, 65536):
                if self.passed < self.LIMIT:
                    keep = chunk[:self.LIMIT - self.passed]
                    self.passed += len(keep)
                    os.write(2, keep + (b"\n[sandbox: the kernel's further output is dropped]\n"
                                        if self.passed >= self.LIMIT else b""))
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            return False
        return False


def run_b(request: dict, limits: dict, root: str, report_w: int, alive_r: int) -> int:
    """B: PID 1. Finish the sandbox, start the kernel, then reap and watch until the kernel exits."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if select.select([alive_r], [], [], 0)[0]:  # A is already gone
        return 1
    _prctl(PR_SET_DUMPABLE, 0)  # the kernel has the same uid: it must not read or trace PID 1
    enter_root(root, limits)
    socket.sethostname("sandbox")
    _loopback_up()
    ready_r, ready_w = os.pipe()
    ack_r, ack_w = os.pipe()
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            for fd in (report_w, alive_r, ready_r, ack_w, out_r):
                os.close(fd)
            os.dup2(out_w, 1)
            os.dup2(out_w, 2)
            os.close(out_w)
            run_c(request, limits, ready_w, ack_r)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    for fd in (ready_w, ack_r, out_w):
        os.close(fd)
    kernel = os.pidfd_open(pid)
    output = _Output(out_r)
    watch = MemoryWatch(limits["memory_bytes"]) if request.get("watchdog", True) else None
    waiting = [kernel, ready_r, out_r]
    reason = ""
    while True:
        readable, _, _ = select.select(waiting, [], [], 0.05 if watch else 0.2)
        if out_r in readable and not output.drain():
            waiting.remove(out_r)  # closed by every writer: select would report it forever
        if ready_r in readable:  # the kernel listens: from now on nothing may be written to the socket folder
            message = os.read(ready_r, 1)
            waiting.remove(ready_r)
            os.close(ready_r)
            if message == b"r":
                _mount(None, request["folder"], None,
                       MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
                os.write(ack_w, b"a")
            os.close(ack_w)
        if kernel in readable:
            break
        _reap_orphans(pid)
        if watch and (used := watch.over()):
            reason = (f"memory limit: its processes held {_size(used)} together, more than {_size(watch.limit)} "
                      f"(watchdog)")
            break
    _kill_all()
    _, status, usage = os.wait4(pid, 0)
    output.drain()
    code = os.waitstatus_to_exitcode(status)
    if not reason and code < 0:
        cpu = usage.ru_utime + usage.ru_stime
        if -code in (signal.SIGXCPU, signal.SIGKILL) and cpu >= limits["cpu_seconds"] - 0.5:
            reason = f"CPU time limit: {limits['cpu_seconds']} s"
    if reason:
        os.write(report_w, reason.encode())
    os.close(report_w)
    return code if code >= 0 else 128 - code


def _reap_orphans(kernel: int) -> None:
    """Collect every exited process that was left to PID 1, never the kernel (its status is read last)."""
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None or info.si_pid == kernel:
            return
        os.waitpid(info.si_pid, 0)


def _kill_all() -> None:
    try:
        os.kill(-1, signal.SIGKILL)  # from PID 1: every other process of the namespace
    except ProcessLookupError:
        pass


# --- C: the kernel ------------------------------------------------------------------------------------------

def drop_privileges() -> None:
    """No capability, now or after any exec (empty bounding set, no_new_privs)."""
    _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    for cap in range(last + 1):
        _prctl(PR_CAPBSET_DROP, cap)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    data = (ctypes.c_uint32 * 6)()
    _call(_libc.capset(header, data), "capset")
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
    _prctl(PR_SET_DUMPABLE, 1)  # its own /proc files belong to it again


def _new_session_keyring() -> None:
    """A kernel keyring session of its own: keys it adds die with it instead of waiting for the next kernel."""
    number = SYS_KEYCTL.get(os.uname().machine)
    if number is not None:
        _libc.syscall(number, KEYCTL_JOIN_SESSION_KEYRING, None)  # fails only where keys are not built in


def _set_limit(kind: int, soft: int, hard: int | None = None) -> None:
    resource.setrlimit(kind, (soft, soft if hard is None else hard))


def run_c(request: dict, limits: dict, ready_w: int, ack_r: int) -> None:
    """C: the kernel. Limits and privileges first; then ipykernel, which binds its sockets; then student code."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.setsid()
    os.umask(0o022)
    work = "/tmp/work"
    os.environ.clear()
    os.environ.update(request.get("env", {}), HOME=work, MPLCONFIGDIR=f"{work}/.matplotlib", USER="student",
                      LOGNAME="student")
    _set_limit(resource.RLIMIT_AS, limits["address_space_bytes"])
    _set_limit(resource.RLIMIT_FSIZE, limits["file_bytes"])
    _set_limit(resource.RLIMIT_NPROC, limits["processes"])
    _set_limit(resource.RLIMIT_CPU, limits["cpu_seconds"], limits["cpu_seconds"] + 5)
    _set_limit(resource.RLIMIT_CORE, 0)
    _new_session_keyring()
    drop_privileges()
    os.makedirs(work, exist_ok=True)
    os.chdir(work)
    if request.get("probe"):  # grader.kernel.sandbox.why_unavailable: the sandbox stands and holds no privilege
        with open("/proc/self/status") as f:
            if "CapEff:\t0000000000000000" not in f.read():
                raise SystemExit("capabilities left after dropping them")
        raise SystemExit(0)
    # the history database in memory: one file less to create, nothing kept
    sys.argv = ["ipykernel_launcher", "-f", request["connection_file"], "--HistoryManager.hist_file=:memory:"]
    from ipykernel.kernelapp import IPKernelApp

    app = IPKernelApp.instance()
    app.initialize(sys.argv[1:])
    os.write(ready_w, b"r")
    os.close(ready_w)
    if os.read(ack_r, 1) != b"a":
        raise RuntimeError("the sandbox did not seal the socket folder")
    os.close(ack_r)
    app.start()


if __name__ == "__main__":
    main()
