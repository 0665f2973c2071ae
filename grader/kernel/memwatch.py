"""The memory limit where no cgroup enforces it: the sandbox's PID 1 adds up what the submission holds.

Standard library only: it runs in the sandbox's PID 1 (grader/kernel/pid1.py).
"""

from __future__ import annotations

import os
import socket
import struct
import sys
import time


def _tasks() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and p != "1"]


def _anon_bytes(pid: int) -> int:
    """Anonymous and shared memory one process has resident (quick, an upper bound of its share)."""
    keys = ("RssAnon:", "RssShmem:")
    total = 0
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(keys):
                    total += int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return total


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


SYSV_EACH = {"nsems": 72, "qnum": 64}  # bytes the kernel keeps for a semaphore, for a message besides its text


def _sysv_bytes() -> int:
    """System V shared memory and message queues: they live in the namespace, not in any process.

    Every segment at the pages it holds (`rss` and `swap`: the segment's own, whether or not a process maps
    them; a segment a process maps counts again in that process: an upper bound). Counted only as mapped, a
    segment would hide behind madvise(MADV_DONTNEED), which drops the pages from the process, not from the
    segment. Semaphores and messages at what the kernel keeps for each (`SYSV_EACH`): 800 sets of 32000 semaphores
    held 1.8 GiB, and an empty message takes its header."""
    total = 0
    for table, columns in (("shm", ("rss", "swap")), ("msg", ("cbytes", "qnum")), ("sem", ("nsems",))):
        try:
            with open(f"/proc/sysvipc/{table}") as f:
                header = f.readline().split()
                for line in f:
                    row = dict(zip(header, line.split()))
                    total += sum(int(row.get(column, 0)) * SYSV_EACH.get(column, 1) for column in columns)
        except (OSError, ValueError):
            pass
    return total



def size_text(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def _proportional_bytes(pid: int) -> int:
    """A process's share of anonymous and shared memory; its resident size where smaps cannot be read.

    smaps needs ptrace access, which a process that made itself undumpable denies even to PID 1 (the seccomp
    filter refuses that prctl, but a process forked before it loaded is forked from the server): such a
    process is counted in full, never as nothing.
    """
    keys = ("Pss_Anon:", "Pss_Shmem:")
    total, seen = 0, False
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith(keys):
                    total += int(line.split()[1]) * 1024
                    seen = True
    except (OSError, ValueError, IndexError):
        pass
    return total if seen else _anon_bytes(pid)


def _tmpfs_bytes(mounts: tuple[str, ...] = ("/tmp", "/dev/shm")) -> int:
    """What the files in the sandbox's own tmpfs mounts take: memory, though no process holds it."""
    total = 0
    for mount in mounts:
        try:
            info = os.statvfs(mount)
        except OSError:
            continue
        total += (info.f_blocks - info.f_bfree) * info.f_frsize
    return total


class Usage(int):
    """Bytes held, with what they are made of (for the status)."""

    parts: dict[str, int]

    def __new__(cls, parts: dict[str, int]) -> Usage:
        usage = super().__new__(cls, sum(parts.values()))
        usage.parts = parts
        return usage

    @property
    def what(self) -> str:
        return "watchdog: " + ", ".join(f"{name} {size_text(n)}" for name, n in self.parts.items() if n)


class MemoryWatch:
    """What the namespace's processes hold together, checked against the limit.

    Counted: anonymous and shared memory of every process of the PID namespace (pages shared with the fork
    server, torch imported once, in proportion: their resident size first, cheap and never less, and only
    above the limit the proportional size; an undumpable process at its resident size), System V segments
    and message queues, memfd files, files in the sandbox's /tmp and /dev/shm (tmpfs: memory), and the
    buffers of every socket of its network namespace. Descriptors and sockets are looked at every half
    second, the rest every poll.
    """

    SCAN_S = 0.5

    def __init__(self, limit: int) -> None:
        self.limit, self.memfd, self.sockets, self.scanned = limit, 0, 0, 0.0

    def _scan(self, pids: list[int]) -> None:
        if time.monotonic() - self.scanned > self.SCAN_S:
            self.memfd, self.sockets, self.scanned = _memfd_bytes(pids), socket_bytes(), time.monotonic()

    def reason(self, used: Usage) -> str:
        """The status when the watchdog killed the submission: the course's limit only. What it held is the
        student's to choose (a channel out of a hidden scenario, grader/judge/outflow.py): the figures go to
        the grader's log only."""
        print(f"grader: memory limit: the submission held {size_text(used)} ({used.what})", file=sys.stderr)
        return f"memory limit: the submission used more than the {size_text(self.limit)} limit (watchdog)"

    def over(self) -> Usage | None:
        """None, or what the submission holds when that is above the limit."""
        pids = _tasks()
        self._scan(pids)
        fixed = {"System V IPC": _sysv_bytes(), "memfd": self.memfd, "tmpfs": _tmpfs_bytes(),
                 "socket buffers": self.sockets}
        if sum(fixed.values()) + sum(_anon_bytes(p) for p in pids) <= self.limit:
            return None
        used = Usage({"processes": sum(_proportional_bytes(p) for p in pids), **fixed})
        return used if used > self.limit else None


OPEN_FILES_TOTAL = 65536  # open files a namespace's processes hold together (RLIMIT_NOFILE is per process)
SOCKET_BYTES_TOTAL = 128 * 2**20  # TCP and UDP buffers: the host's net.ipv4.tcp_mem is a few percent of its memory


def _open_files(pids: list[int]) -> int:
    """Open files `pids` hold: their descriptors, and their file-backed mappings (a file mapped and then closed
    stays open: in review 50,000 per process, none in /proc/<pid>/fd). A mapping shared with a forked child or
    one file mapped in several pieces counts each time: an upper bound (a process with torch imported maps about
    400)."""
    total = 0
    for pid in pids:
        try:
            total += len(os.listdir(f"/proc/{pid}/fd"))
            with open(f"/proc/{pid}/maps", "rb") as maps:
                total += sum(1 for line in maps if line.split(maxsplit=5)[4:5] not in ([b"0"], []))
        except OSError:
            continue
    return total


class HostWatch:
    """What the host shares among all its users however the sandbox is confined, checked five times a second: its
    file table (`fs.file-max`: 256 processes of 4096 descriptors each held a third of it in review), and TCP and
    UDP buffers (`net.ipv4.tcp_mem` is the host's, its hard limit 2.2 GiB on a 23 GB host; a cgroup v1 does not
    charge them: in review 240 loopback connections held 917 MiB while the cgroup showed 39 MB; each socket's buffers
    are capped as well, grader/kernel/confine.py TCP_BUFFERS, so that no burst outruns the scan by much)."""

    SCAN_S = 0.2

    def __init__(self, socket_limit: int = SOCKET_BYTES_TOTAL) -> None:
        self.socket_limit, self.scanned = socket_limit, 0.0

    def over(self) -> str:
        """'' or, when the submission holds more than it may, the status saying which limit (fixed words only)."""
        if time.monotonic() - self.scanned < self.SCAN_S:
            return ""
        self.scanned = time.monotonic()
        files = _open_files(_tasks())
        if files > OPEN_FILES_TOTAL:
            print(f"grader: open files limit: the submission held {files} open files", file=sys.stderr)
            return f"open files limit: the submission held more than {OPEN_FILES_TOTAL} open files (watchdog)"
        if (held := socket_bytes(families=INET_NAMES)) > self.socket_limit:
            print(f"grader: socket buffer limit: the submission's sockets held {size_text(held)}", file=sys.stderr)
            return (f"socket buffer limit: the submission's TCP and UDP buffers held more than "
                    f"{size_text(self.socket_limit)} (watchdog)")
        return ""


# --- socket buffers, through sock_diag (netlink) ------------------------------------------------------------

NETLINK_SOCK_DIAG, SOCK_DIAG_BY_FAMILY = 4, 20
NLM_F_REQUEST, NLM_F_DUMP, NLMSG_ERROR, NLMSG_DONE = 1, 0x300, 2, 3
DIAG_NAMES = ("unix", "TCP", "UDP", "TCPv6", "UDPv6", "netlink")  # in the order of _diag_requests
INET_NAMES = ("TCP", "UDP", "TCPv6", "UDPv6")  # what the host's net.ipv4.tcp_mem and udp_mem hold
MEMINFO_VARS = 9  # SK_MEMINFO_*: rmem_alloc, rcvbuf, wmem_alloc, sndbuf, fwd_alloc, wmem_queued, optmem, backlog, drops


def _diag_requests() -> list[tuple[bytes, int, int]]:
    """(request body, size of the reply's fixed part, meminfo attribute type) for unix, TCP, UDP and netlink."""
    unix = struct.pack("BBHIIIII", socket.AF_UNIX, 0, 0, 0xFFFFFFFF, 0, 0x20, 0, 0)  # UDIAG_SHOW_MEMINFO
    requests = [(unix, 16, 5)]  # unix_diag_msg, UNIX_DIAG_MEMINFO
    for family in (socket.AF_INET, socket.AF_INET6):
        for protocol in (socket.IPPROTO_TCP, socket.IPPROTO_UDP):
            # inet_diag_req_v2 asking for INET_DIAG_SKMEMINFO (7) in every state; inet_diag_msg is 72 bytes
            requests.append((struct.pack("BBBxI48x", family, protocol, 1 << 6, 0xFFFFFFFF), 72, 7))
    netlink = struct.pack("BBHIIII", socket.AF_NETLINK, 255, 0, 0, 1, 0, 0)  # NDIAG_PROTO_ALL, NDIAG_SHOW_MEMINFO
    requests.append((netlink, 28, 0))  # netlink_diag_msg, NETLINK_DIAG_MEMINFO
    return requests


def _meminfo_bytes(payload: bytes, fixed: int, kind: int) -> int:
    """The buffer memory one socket holds: what it received plus what it sent that is still queued."""
    offset = fixed
    while offset + 4 <= len(payload):
        length, attr = struct.unpack_from("HH", payload, offset)
        if length < 4:
            break
        if attr == kind and length >= 4 + 4 * MEMINFO_VARS:
            info = struct.unpack_from(f"{MEMINFO_VARS}I", payload, offset + 4)
            return info[0] + max(info[2], info[5])
        offset += (length + 3) & ~3
    return 0


def _dump(channel: socket.socket, body: bytes, fixed: int, kind: int) -> int:
    channel.send(struct.pack("IHHII", 16 + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, 1, 0) + body)
    total = 0
    while True:
        data = channel.recv(1 << 16)
        offset = 0
        while offset + 16 <= len(data):
            length, kind_of_message = struct.unpack_from("IH", data, offset)
            if kind_of_message == NLMSG_ERROR and length >= 20 and (error := struct.unpack_from("i", data, offset + 16)[0]):
                raise OSError(-error, os.strerror(-error))
            if kind_of_message in (NLMSG_DONE, NLMSG_ERROR) or length < 16:
                return total
            total += _meminfo_bytes(data[offset + 16:offset + length], fixed, kind)
            offset += (length + 3) & ~3
        if not data:
            return total


def socket_bytes(missing: list[str] | None = None, families: tuple[str, ...] = DIAG_NAMES) -> int:
    """Memory queued in every socket of this network namespace (the submission's own) of `families` (default all:
    unix, TCP, UDP, netlink).

    Socket buffers belong to no process's resident memory; the kernel charges them to the socket. The families
    this kernel cannot report (no sock_diag module for them) are added to `missing`.
    """
    total = 0
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as channel:
        channel.settimeout(1)
        for (body, fixed, kind), name in zip(_diag_requests(), DIAG_NAMES):
            if name not in families:
                continue
            try:
                total += _dump(channel, body, fixed, kind)
            except OSError:
                if missing is not None:
                    missing.append(name)  # that family's diag module is missing: nothing of it is counted
    return total
