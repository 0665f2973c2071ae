"""The sandbox's and the worker's parts that need no kernel: wire types, the seccomp policy, socket accounting, bounds."""

import errno
import json
import struct
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import nbformat
import pytest

from grader.author.mutants import reference_submission
from grader.batch import worker
from grader.course import assignment_named
from grader.kernel import memwatch, seccomp
from grader.kernel.limits import Limits
from grader.kernel.protocol import SandboxLimits

# What Docker's default profile never allows, or allows only with a capability the kernel does not have
# (CAP_SYS_ADMIN, CAP_SYS_PTRACE, CAP_BPF, CAP_PERFMON, CAP_SYS_MODULE, …), as listed in its profile.
DOCKER_REFUSED = ("keyctl add_key request_key userfaultfd io_uring_setup io_uring_enter io_uring_register pivot_root "  # noqa: SIM905
                  "kexec_load kexec_file_load swapon swapoff nfsservctl vm86 vm86old create_module get_kernel_syms "
                  "query_module uselib ustat sysfs _sysctl move_pages bpf clone3 fanotify_init fsconfig fsmount "
                  "fsopen fspick lookup_dcookie mount mount_setattr move_mount open_tree perf_event_open quotactl "
                  "quotactl_fd setdomainname sethostname setns syslog umount umount2 unshare reboot chroot "
                  "init_module finit_module delete_module acct kcmp pidfd_getfd process_madvise iopl ioperm "
                  "settimeofday stime clock_settime vhangup get_mempolicy mbind set_mempolicy open_by_handle_at "
                  "ptrace process_vm_readv process_vm_writev").split()


def test_the_wire_limits_are_the_limits():
    assert list(SandboxLimits.__annotations__) == [f.name for f in fields(Limits)]


def test_the_seccomp_allow_list_holds_nothing_docker_refuses():
    allowed = set(seccomp.DOCKER_ALLOWED) - set(seccomp.STRICTER)
    for names in seccomp.ARCH_ALLOWED.values():
        allowed |= set(names)
    assert allowed.isdisjoint(DOCKER_REFUSED), sorted(allowed & set(DOCKER_REFUSED))
    assert set(seccomp.KEY_CALLS) <= set(DOCKER_REFUSED) and "prctl" in seccomp.DOCKER_ALLOWED


SOCKETS_IN_A_NEW_NETWORK_NAMESPACE = """
import ctypes, json, socket
from grader.kernel import memwatch
assert ctypes.CDLL(None, use_errno=True).unshare(0x10000000 | 0x40000000) == 0  # CLONE_NEWUSER | CLONE_NEWNET
before = memwatch.socket_bytes()
a, b = socket.socketpair()
a.setblocking(False)
queued = 0
try:
    while True:
        queued += a.send(b"x" * 65536)
except BlockingIOError:
    pass
print(json.dumps([before, queued, memwatch.socket_bytes()]))
"""


@pytest.mark.integration  # a Python process that holds the sockets
def test_socket_buffers_are_read_from_sock_diag():
    """The netlink query PID 1 makes in a sandbox, here in a network namespace of its own (no other sockets)."""
    done = subprocess.run([sys.executable, "-c", SOCKETS_IN_A_NEW_NETWORK_NAMESPACE], capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        pytest.skip(f"no user namespace for the test: {done.stderr[-300:]}")
    before, queued, after = json.loads(done.stdout)
    # before: only the query's own netlink socket, holding its replies
    assert before < 2**20 and after - before >= queued > 0, (before, queued, after)


SOCKETS_UNDER_THE_FILTER_WITHOUT_NETWORK = """
import ctypes, json, socket
from grader.kernel import seccomp
assert ctypes.CDLL(None).prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS: an unprivileged process may load a filter
seccomp.build(network=False).load()
opened = {}
for name, family, kind, protocol in [("unix", socket.AF_UNIX, socket.SOCK_STREAM, 0),
                                     ("route", socket.AF_NETLINK, socket.SOCK_RAW, 0),
                                     ("inet", socket.AF_INET, socket.SOCK_STREAM, 0),
                                     ("udp", socket.AF_INET, socket.SOCK_DGRAM, 0),
                                     ("inet6", socket.AF_INET6, socket.SOCK_STREAM, 0),
                                     ("packet", socket.AF_PACKET, socket.SOCK_DGRAM, 0),
                                     ("sock_diag", socket.AF_NETLINK, socket.SOCK_RAW, 4),
                                     ("usersock", socket.AF_NETLINK, socket.SOCK_RAW, 2)]:
    try:
        socket.socket(family, kind, protocol).close()
        opened[name] = "opened"
    except OSError as exc:
        opened[name] = exc.errno
print(json.dumps(opened))
"""


@pytest.mark.integration  # a Python process that loads the filter
def test_without_network_only_unix_and_route_netlink_sockets_open():
    """Gradescope's `user` isolation (grader/platforms/student_kernel.py) has no network namespace: the filter
    refuses socket() for every family but AF_UNIX and NETLINK_ROUTE (zmq needs it to bind; it reaches no network)."""
    done = subprocess.run([sys.executable, "-c", SOCKETS_UNDER_THE_FILTER_WITHOUT_NETWORK], capture_output=True,
                          text=True, check=True)
    refused = errno.EPERM
    assert json.loads(done.stdout) == {"unix": "opened", "route": "opened", "inet": refused, "udp": refused,
                                       "inet6": refused, "packet": refused, "sock_diag": refused, "usersock": refused}


def test_meminfo_attribute_parsing():
    info = struct.pack("9I", 100, 0, 7, 0, 0, 30, 0, 0, 0)  # rmem 100, wmem_alloc 7, wmem_queued 30
    payload = b"\0" * 16 + struct.pack("HH", 4 + len(info), 5) + info
    assert memwatch._meminfo_bytes(payload, 16, 5) == 130
    assert memwatch._meminfo_bytes(payload, 16, 7) == 0


def _write(tmp_path, data: bytes):
    path = tmp_path / "nb.ipynb"
    path.write_bytes(data)
    return path


def test_the_worker_parses_a_notebook_within_bounds(tmp_path):
    reference = nbformat.writes(reference_submission(assignment_named("01"))).encode()
    assert worker._load(_write(tmp_path, reference)).cells
    empties = b'{"nbformat": 4, "cells": [' + b",".join([b"{}"] * (worker.MAX_JSON_VALUES + 1)) + b"]}"
    with pytest.raises(worker.TooLarge, match="JSON values"):
        worker._load(_write(tmp_path, empties))
    deep = json.dumps({"nbformat": 4, "cells": [], "metadata": {}}).encode()[:-1] + b', "x": ' + \
        b"[" * (worker.MAX_JSON_DEPTH + 1) + b"]" * (worker.MAX_JSON_DEPTH + 1) + b"}"
    with pytest.raises(worker.TooLarge, match="deeper"):
        worker._load(_write(tmp_path, deep))
    brackets_in_sources = json.dumps({"nbformat": 4, "cells": [{"cell_type": "code", "source": "[" * 10_000,
                                                                "metadata": {}}]}).encode()
    assert worker._load(_write(tmp_path, brackets_in_sources)).cells[0].source == "[" * 10_000


def test_a_delegated_cgroup_v2_subtree_is_found(tmp_path, monkeypatch):
    """The cgroup v2 paths cannot run here (v1 only): where submission cgroups go, on a tree of plain files."""
    from grader.kernel import limits

    own = tmp_path / "user.slice" / "run-u7.scope"
    own.mkdir(parents=True)
    (own / "cgroup.subtree_control").write_text("memory pids\n")
    assert limits.delegated_v2_base(own) == own  # switched on already
    leaf = own / "tml-42-leaf"  # a worker born in the leaf its parent made
    leaf.mkdir()
    (leaf / "cgroup.subtree_control").write_text("")
    assert limits.delegated_v2_base(leaf) == own
    (own / "cgroup.subtree_control").write_text("")
    (own / "cgroup.controllers").write_text("memory pids\n")
    assert limits.delegated_v2_base(own) is None  # not the scope autograde made for itself: never claimed
    monkeypatch.setenv(limits.SCOPE_ENV, "1")
    monkeypatch.setattr(limits.os, "geteuid", lambda: own.stat().st_uid + 1)
    assert limits.delegated_v2_base(own) is None  # not this user's subtree
    monkeypatch.delenv(limits.SCOPE_ENV)
    monkeypatch.setattr(limits.shutil, "which", lambda name: None)
    assert limits.systemd_scope(["grade"]) is None  # no systemd-run: the watchdog


def test_a_course_or_class_inside_a_bound_system_folder_is_refused_before_any_kernel(tmp_path, monkeypatch):
    from grader.batch import autograde
    from grader.kernel import sandbox

    system = tmp_path / "usr"
    monkeypatch.setattr(sandbox, "ro_binds", lambda: [str(system), str(tmp_path / "etc")])
    inside, outside = system / "src" / "app" / "submissions", tmp_path / "home" / "submissions"
    assert sandbox.exposed([inside, outside]) == [inside]
    (tmp_path / "linked-usr").symlink_to(system, target_is_directory=True)
    monkeypatch.setattr(sandbox, "ro_binds", lambda: [str(tmp_path / "linked-usr")])
    inside.mkdir(parents=True)
    assert sandbox.exposed([inside, outside]) == [inside]  # the bind's source is a link to the folder that holds it
    monkeypatch.setattr(sandbox, "ro_binds", lambda: [str(system), str(tmp_path / "etc")])
    with pytest.raises(autograde.SandboxUnavailable, match=f"shows {inside} to student code"):
        autograde._check_sandbox(True, [outside, inside])
    monkeypatch.setattr(sandbox, "why_unavailable", lambda: "")
    monkeypatch.setattr(autograde.kernelspec, "install_kernelspec", lambda: None)
    autograde._check_sandbox(True, [outside])  # the course itself is not under tmp_path/usr
    autograde._check_sandbox(False, [inside])  # --unsandboxed binds nothing


def test_a_start_ahead_never_restarts_the_fork_server_under_the_kernel_in_use():
    # the kernels-ahead review: a restart from the start-ahead thread SIGKILLed the server and with it the kernel
    # of the hand-in being graded
    import threading

    from grader.kernel.sandbox import ForkServer

    server = object.__new__(ForkServer)
    server._lock, server.process = threading.Lock(), None  # the server died (or hangs: _ask fails alike)
    restarts: list[int] = []
    server._start = lambda: restarts.append(1)  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="not restarted now"):
        server.next_runtime(alongside=True, restart=False)
    assert restarts == []


HUGE_PAGES_CHILD = """
import json, os, numpy
from grader.kernel.syscalls import collapse_into_huge_pages
held = numpy.ones(16 << 20, dtype=numpy.uint8)  # memory to collapse, as a warm server holds
asked = collapse_into_huge_pages()
huge = sum(int(line.split()[1]) for line in open("/proc/self/smaps") if line.startswith("AnonHugePages:"))
pid = os.fork()
if pid == 0:  # a fork of it still reads and writes its memory
    numpy.frombuffer(bytearray(b"x" * 4096), dtype=numpy.uint8).sum()
    os._exit(0)
print(json.dumps({"asked": asked, "huge_kib": huge, "child": os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])}))
"""


@pytest.mark.integration  # a Python process whose memory is collapsed
def test_the_warm_servers_memory_goes_into_huge_pages_where_the_kernel_allows():
    thp = Path("/sys/kernel/mm/transparent_hugepage")
    if not (thp / "hpage_pmd_size").exists() or "[never]" in (thp / "enabled").read_text():
        pytest.skip("no transparent huge pages on this machine: nothing to collapse into")
    done = subprocess.run([sys.executable, "-c", HUGE_PAGES_CHILD], capture_output=True, text=True, check=True)
    result = json.loads(done.stdout)
    assert result["asked"] >= 8 << 20 and result["huge_kib"] >= 8 << 10, result
    assert result["child"] == 0, result
