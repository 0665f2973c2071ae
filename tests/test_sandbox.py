"""Attacks on the grading sandbox (grader/kernel/sandbox.py, kernelspec.py, forkserver.py): each test tries to break one promise.

Kernels are started the way a worker starts them (a ForkServer, `kernelspec.kernel_factory`) and driven
cell by cell through grader.kernel.harness. The suite runs as root here; `test_attacks_hold_for_an_unprivileged_grader`
runs this file (and the collection's attacks) again with the grader started as `nobody`. Without a sandbox
(no user namespaces) the tests skip, or fail when CI=true.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from unix_users import as_user, python_for, unavailable

from grader.batch.stopping import descendants
from grader.judge.grading import Graded, run_notes
from grader.kernel import harness, kernelspec, limits, sandbox
from grader.kernel.forkserver import SANDBOX_UID_BASE
from grader.kernel.harness import DIED, KILLED, Step, StepRun
from grader.paths import KERNEL_PACKAGES
from grader.results import Note, NoteKind

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent
UNPRIVILEGED_RUN = "TML_SANDBOX_TESTS_UNPRIVILEGED"  # set in the re-run as nobody
MiB = 2**20
LIMITS = {"memory_bytes": 1024 * MiB, "address_space_bytes": 4096 * MiB, "disk_bytes": 32 * MiB,
          "shm_bytes": 8 * MiB, "file_bytes": 16 * MiB, "processes": 64,
          # enough for the memory tests' writes (over 1 GiB) on a busy machine; the CPU test spins past it
          "cpu_seconds": 8}


@pytest.fixture(scope="module")
def server():
    problem = sandbox.why_unavailable()
    if problem:
        unavailable(f"the kernel sandbox cannot be built here: {problem}")
    srv = sandbox.ForkServer()
    srv.limits = dataclasses.replace(srv.limits, **LIMITS)
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def watched_server(server):
    """A server whose kernels' memory only the sandbox's PID 1 counts (no cgroup): what a non-root grader gets."""
    srv = sandbox.ForkServer()
    srv.limits, srv.cgroups = server.limits, None
    yield srv
    srv.close()


def _starter(server):
    started: list[harness.Kernel] = []
    factory = kernelspec.kernel_factory(server)

    def new() -> harness.Kernel:
        started.append(factory())
        return started[-1]

    return new, started


@pytest.fixture
def start(server):
    """Start kernels from the shared server; every one still running at the end of the test is stopped."""
    new, started = _starter(server)
    yield new
    for kernel in started:
        kernel.stop()


@pytest.fixture(params=["cgroup or watchdog", "watchdog"])
def start_either(request, server):
    """Kernels of the server as this machine enforces memory, then of one where only the watchdog does."""
    new, started = _starter(server if request.param != "watchdog" else request.getfixturevalue("watched_server"))
    yield new
    for kernel in started:
        kernel.stop()


def run(kernel: harness.Kernel, code: str, timeout: float = 30) -> StepRun:
    return kernel.run(code, timeout)


def ask(kernel: harness.Kernel, code: str, timeout: float = 30):
    """Run `code`, which leaves its answer in `result`; the answer, as JSON, back on this side."""
    step = run(kernel, code + "\nimport json\nprint('RESULT' + json.dumps(result))", timeout)
    text = "".join(o.get("text", "") for o in step.outputs if o["output_type"] == "stream")
    errors = [f"{o['ename']}: {o['evalue']}" for o in step.outputs if o["output_type"] == "error"]
    assert not step.failure and not errors, (step.failure, errors, text)
    return json.loads(text.split("RESULT", 1)[1])


def latest_folder(server: sandbox.ForkServer) -> Path:
    """The socket folder of the kernel started last."""
    return server.runtime / f"submission-{server.submissions}"


ATTEMPT = """
import ctypes, errno, json, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
def attempt(call):
    try:
        value = call()
    except OSError as exc:
        return exc.errno
    return 0 if value in (None, 0) or not isinstance(value, int) else (ctypes.get_errno() if value < 0 else 0)
def write(path):
    with open(path, "w") as f:
        f.write("planted")
"""


def test_each_submission_gets_fresh_namespaces(start, server):
    code = ("import os, json\n"
            "result = {n: os.stat(f'/proc/self/ns/{n}').st_ino for n in "
            "('user', 'mnt', 'ipc', 'pid', 'net', 'uts', 'cgroup')}\n"
            "result['pids'] = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())")
    first = start()
    one = ask(first, code)
    names = [n for n in one if n != "pids"]
    # hold the first kernel's namespaces open: a freed namespace's inode number would be given out again
    held = []
    for pid in descendants(server.process.pid):
        for name in names:
            try:
                held.append(os.open(f"/proc/{pid}/ns/{name}", os.O_RDONLY))
            except OSError:
                pass
    try:
        assert {os.fstat(fd).st_ino for fd in held} >= {one[n] for n in names}
        first.stop()
        two = ask(start(), code)
    finally:
        for fd in held:
            os.close(fd)
    host = {n: os.stat(f"/proc/self/ns/{n}").st_ino for n in names}
    for name, inode in host.items():
        assert one[name] != inode and two[name] != inode, f"{name} namespace shared with the grader"
        assert one[name] != two[name], f"{name} namespace shared by two submissions"
    assert one["pids"] == two["pids"] == [1, 2], "the kernel should see only itself and the sandbox's PID 1"


def test_no_capabilities_and_no_way_to_gain_them(start):
    result = ask(start(), ATTEMPT + """
status = dict(line.split(":\\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\\t" in line)
MS_REMOUNT, MS_BIND = 32, 4096
result = {
    "caps": {k: status[k].strip() for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")},
    "no_new_privs": status["NoNewPrivs"].strip(),
    "uid_map": open("/proc/self/uid_map").read().split(),
    "mount": attempt(lambda: libc.mount(b"none", b"/tmp", b"tmpfs", 0, None)),
    "remount": attempt(lambda: libc.mount(None, b"/usr", None, MS_REMOUNT | MS_BIND, None)),
    "unshare user": attempt(lambda: libc.unshare(0x10000000)),
    "setuid 0": attempt(lambda: os.setuid(0)),
    "ptrace pid 1": attempt(lambda: libc.ptrace(16, 1, None, None)),  # PTRACE_ATTACH
    "pid 1 memory": attempt(lambda: open("/proc/1/mem", "rb").read(1)),
    "pid 1 environ": attempt(lambda: open("/proc/1/environ", "rb").read(1)),
}
for sig in (signal.SIGTERM, signal.SIGKILL, signal.SIGSTOP):
    os.kill(1, sig)  # PID 1 of the namespace ignores signals from inside it
result["pid 1 state"] = open("/proc/1/stat").read().rsplit(")", 1)[1].split()[0]
""")
    assert set(result["caps"].values()) == {"0000000000000000"}, result["caps"]
    assert result["no_new_privs"] == "1"
    inside, outside, count = result["uid_map"]
    if os.geteuid() == 0:  # a root grader gives each sandbox a host uid of its own (grader/kernel/forkserver.py)
        assert int(outside) >= SANDBOX_UID_BASE and count == "1", result["uid_map"]
    else:
        assert (int(outside), count) == (os.geteuid(), "1"), result["uid_map"]
    assert int(inside) != 0
    for action in ("mount", "remount", "unshare user", "setuid 0", "ptrace pid 1", "pid 1 memory", "pid 1 environ"):
        assert result[action] != 0, f"{action} succeeded inside the sandbox"
    assert result["pid 1 state"] in ("S", "R"), result["pid 1 state"]


def test_the_kernel_holds_none_of_the_servers_descriptors(start, server):
    result = ask(start(), """
import os, socket
result = []
for fd in map(int, os.listdir("/proc/self/fd")):
    try:
        with socket.socket(fileno=os.dup(fd)) as s:
            result.append(str(s.getsockname()))
    except OSError:
        pass
""")
    assert str(server.control) not in result, "the kernel can answer the fork server's socket"


def test_read_only_everywhere_but_its_scratch_space(start, server):
    kernel = start()
    targets = ["/usr", "/etc", sys.prefix, *map(str, KERNEL_PACKAGES), "/", "/dev", str(latest_folder(server))]
    result = ask(kernel, ATTEMPT + f"""
targets = {targets!r}
result = {{t: attempt(lambda: write(os.path.join(t, "planted"))) for t in targets}}
result["shadow"] = attempt(lambda: open("/etc/shadow").read(1)) if os.path.exists("/etc/shadow") else "absent"
result["home"] = attempt(lambda: write(os.path.expanduser("~/planted")))
result["tmp"] = attempt(lambda: write("/tmp/planted"))
result["cwd"] = os.getcwd()
result["seen"] = [p for p in {[str(REPO / "solutions"), str(REPO / "grader"), str(REPO / "tests")]!r} if os.path.exists(p)]
""")
    for target in targets:
        assert result[target] in (30, 13), f"{target}: writing there gave errno {result[target]}"  # EROFS, EACCES
        assert not os.path.exists(os.path.join(target, "planted")), target
    assert result["shadow"] in (13, "absent"), "read /etc/shadow"
    assert result["home"] == result["tmp"] == 0, "its home and /tmp must be writable"
    assert result["seen"] == [], "the sandbox shows parts of the repository it must hide"
    assert not Path("/tmp/planted").exists(), "a file written to the sandbox's /tmp reached the host's"


@pytest.fixture(params=["one after another", "started ahead"])
def start_next(request, server):
    """Kernels as a worker gets them: started when asked, or each started while the one before is in use
    (kernelspec.KernelsAhead); yields (start, finish), finish stopping what was started ahead."""
    if request.param == "one after another":
        new, started = _starter(server)
        yield new, lambda: None
        for kernel in started:
            kernel.stop()
    else:
        ahead = kernelspec.KernelsAhead(server)
        yield ahead, ahead.close
        ahead.close()


def test_nothing_a_kernel_leaves_reaches_the_next_submission(start_next, server):
    start, finish = start_next
    before = set(server.runtime.iterdir())
    first = start()
    planted = ask(first, ATTEMPT + """
import subprocess, time
startup = os.path.expanduser("~/.ipython/profile_default/startup")
os.makedirs(startup, exist_ok=True)
open(os.path.join(startup, "00-trap.py"), "w").write("TRAPPED = True\\n")
for folder in (startup, os.path.dirname(startup), os.path.expanduser("~/.ipython")):
    os.chmod(folder, 0o555)  # the old sweep could not delete it
write("/tmp/leftover")
write("/dev/shm/leftover")
libc.shmget.restype = ctypes.c_int
libc.shmat.restype = ctypes.c_void_p
shm = libc.shmget(0x7A11, 4096, 0o1666)  # IPC_CREAT | 0666
ctypes.memmove(libc.shmat(shm, None, 0), b"secret", 6)
SYS_add_key = {"x86_64": 248, "aarch64": 217}.get(os.uname().machine)
keys = [libc.syscall(SYS_add_key, b"user", f"tml-{name}".encode(), b"secret", 6, ring) if SYS_add_key else 1
        for name, ring in (("session", -3), ("user", -4))]  # KEY_SPEC_SESSION_KEYRING, KEY_SPEC_USER_KEYRING
daemon = subprocess.Popen([sys.executable, "-c", "import os, time\\nif os.fork(): os._exit(0)\\ntime.sleep(600)"],
                          start_new_session=True)
daemon.wait()
time.sleep(0.2)
result = {"shm": shm, "keys": keys, "processes": sorted(int(p) for p in os.listdir("/proc") if p.isdigit())}
""")
    # keys cannot even be added (the seccomp filter refuses every keyring call; tested below)
    assert planted["shm"] >= 0 and planted["keys"] == [-1, -1] and len(planted["processes"]) >= 3, planted
    first.stop()
    second = start()
    found = ask(second, ATTEMPT + """
libc.shmget.restype = ctypes.c_int
result = {
    "trapped": "TRAPPED" in globals(),
    "startup": os.path.exists(os.path.expanduser("~/.ipython/profile_default/startup/00-trap.py")),
    "files": [p for p in ("/tmp/leftover", "/dev/shm/leftover") if os.path.exists(p)],
    "shm": libc.shmget(0x7A11, 0, 0),
    "processes": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    "keys": [name for name, ring in (("session", -3), ("user", -4))  # KEYCTL_SEARCH
             if libc.syscall({"x86_64": 250, "aarch64": 219}.get(os.uname().machine, -1), 10, ring, b"user",
                             f"tml-{name}".encode(), 0) > 0],
}
""")
    assert found == {"trapped": False, "startup": False, "files": [], "shm": -1, "processes": [1, 2], "keys": []}, found
    second.stop()
    finish()
    if isinstance(start, kernelspec.KernelsAhead):  # each cleaned up after as it stops (else by the next start)
        assert set(server.runtime.iterdir()) <= before, "a stopped kernel left its socket folder"
    server.next_runtime()  # waits until the server has cleaned up after the last kernel
    assert descendants(server.process.pid) == [], "processes of earlier submissions are still running on the host"


SYSCALLS = {"x86_64": {"keyctl": 250, "add_key": 248, "request_key": 249, "bpf": 321, "userfaultfd": 323,
                       "io_uring_setup": 425, "perf_event_open": 298, "fsopen": 430, "open_tree": 428,
                       "kexec_load": 246, "mount": 165, "unshare": 272, "setns": 308, "ptrace": 101,
                       "process_vm_readv": 310, "pivot_root": 155, "swapon": 167, "init_module": 175,
                       "clone3": 435, "syslog": 103, "open_by_handle_at": 304, "memfd_secret": 447},
            "aarch64": {"keyctl": 219, "add_key": 217, "request_key": 218, "bpf": 280, "userfaultfd": 282,
                        "io_uring_setup": 425, "perf_event_open": 241, "fsopen": 430, "open_tree": 428,
                        "kexec_load": 104, "mount": 40, "unshare": 97, "setns": 268, "ptrace": 117,
                        "process_vm_readv": 270, "pivot_root": 41, "swapon": 224, "init_module": 105,
                        "clone3": 435, "syslog": 116, "open_by_handle_at": 265, "memfd_secret": 447}}


def test_the_seccomp_filter_refuses_what_dockers_default_refuses(start):
    """Each call Docker's default profile refuses to a process without capabilities, and the keyring calls,
    fail with EPERM (clone3 with ENOSYS, as Docker answers it); so do the socket families and personalities
    Docker refuses, and making a process undumpable (it would hide its memory from the watchdog)."""
    numbers = SYSCALLS.get(os.uname().machine)
    if numbers is None:
        pytest.skip(f"no syscall numbers for {os.uname().machine} in this test")
    result = ask(start(), ATTEMPT + f"""
import socket
numbers = {numbers!r}
result = {{}}
for name, number in numbers.items():
    value = libc.syscall(number, 0, 0, 0, 0, 0)
    result[name] = ctypes.get_errno() if value == -1 else 0
result["socket AF_ALG"] = attempt(lambda: socket.socket(38, socket.SOCK_SEQPACKET, 0))
result["socket AF_VSOCK"] = attempt(lambda: socket.socket(40, socket.SOCK_STREAM, 0))
result["personality READ_IMPLIES_EXEC"] = attempt(lambda: libc.personality(0x0400000))
result["undumpable"] = attempt(lambda: libc.prctl(4, 0, 0, 0, 0))
result["dumpable"] = attempt(lambda: libc.prctl(4, 1, 0, 0, 0))
result["unix socket"] = attempt(lambda: socket.socket(socket.AF_UNIX).close())
result["thread"] = attempt(lambda: __import__("threading").Thread(target=lambda: None).start())
result["fork"] = attempt(lambda: __import__("subprocess").run(["true"], check=True))
result["status"] = [line for line in open("/proc/self/status").read().splitlines() if line.startswith("Seccomp")]
""")
    status = result.pop("status")
    assert "Seccomp:\t2" in status, status
    expected = {name: 1 for name in numbers} | {"clone3": 38, "socket AF_ALG": 1, "socket AF_VSOCK": 1,
                                                   "personality READ_IMPLIES_EXEC": 1, "undumpable": 1,
                                                   "dumpable": 0, "unix socket": 0, "thread": 0, "fork": 0}
    assert result == expected


def test_memory_of_several_processes_together_is_capped(start, server):
    kernel = start()
    folder = latest_folder(server)
    # three processes of 400 MB each: any one is allowed, all three together (1.2 GB) are over the 1 GiB limit
    step = run(kernel, """
import subprocess, sys, time
hold = "import sys, time\\nb = b'x' * (400 * 2**20)\\nprint('held', flush=True)\\ntime.sleep(60)"
children = [subprocess.Popen([sys.executable, "-c", hold], stdout=subprocess.PIPE, text=True) for _ in range(3)]
held = [c.stdout.readline().strip() == "held" for c in children]
time.sleep(1)
print("RESULT", sum(h and c.poll() is None for h, c in zip(held, children)))
""", timeout=60)
    if step.failure == DIED:  # the whole submission was stopped (watchdog, cgroup v2 memory.oom.group, or the
        # cgroup v1 OOM killer chose the kernel)
        assert step.reason.startswith("memory limit"), step.reason
        return
    text = "".join(o.get("text", "") for o in step.outputs if o["output_type"] == "stream")
    holding = int(text.split("RESULT")[1])
    assert holding < 3, "three processes held 1.2 GB together under a 1 GiB limit"
    # a cgroup killed one of them: the kernel lives on, and the cgroup counted it
    assert server.cgroups is not None and server.cgroups.oom_kills(folder.name.removeprefix("submission-")) > 0


def test_a_kernel_over_the_memory_limit_dies_and_the_status_says_why(start):
    kernel = start()
    step = run(kernel, "hog = b'x' * (1200 * 2**20)  # under its address-space limit, over the memory limit", timeout=60)
    assert step.failure == DIED and step.reason.startswith("memory limit"), (step.failure, step.reason)


# What a kernel killed at the memory limit is noted with: the limit only (review F1: the watchdog once named the
# sizes of five parts the hand-in chose, a channel out of the hidden tests).
MEMORY_NOTES = ("memory limit: the submission used more than the 1.00 GiB limit (watchdog)",
                "memory limit: its processes together reached 1.00 GiB (cgroup)")


def test_memory_in_files_no_process_maps_counts_too(start_either):
    """System V segments no process maps belong to no process's resident memory. memfd files, which can leave every
    process (sent over a unix socket and closed), cannot be made at all (tests/test_hardening_quotas.py)."""
    step = run(start_either(), """
import ctypes, os, time
try:
    os.memfd_create("hold")
except OSError as exc:
    assert exc.errno == 38, exc  # ENOSYS
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.shmdt.argtypes = [ctypes.c_void_p]
for i in range(80):  # 80 x 15 MiB = 1.2 GB, together over 1 GiB, each filled and then detached
    segment = libc.shmget(0, ctypes.c_size_t(15 * 2**20), 0o600)
    address = libc.shmat(segment, None, 0)
    ctypes.memset(address, 1, 15 * 2**20)
    libc.shmdt(address)
time.sleep(3)
""", timeout=60)
    assert step.failure == DIED and step.reason in MEMORY_NOTES, (step.failure, step.reason)


HOLDER = "import sys, time\nb = b'x' * (400 * 2**20)\nprint('held', flush=True)\ntime.sleep(60)"


def test_memory_of_undumpable_processes_counts_too(start_either):
    """Processes that make themselves undumpable (smaps unreadable) once hid their memory from the watchdog:
    the seccomp filter refuses the prctl, and a process undumpable by exec'ing an unreadable program still counts."""
    step = run(start_either(), ATTEMPT + f"""
import shutil, stat, subprocess, time
hide = "import ctypes\\nprint(ctypes.CDLL(None).prctl(4, 0, 0, 0, 0), flush=True)\\n" + {HOLDER!r}
secret = "/tmp/python-x"  # execute-only: exec'ing it leaves the process undumpable
shutil.copy(sys.executable, secret)
os.chmod(secret, stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
children = [subprocess.Popen([sys.executable, "-c", hide], stdout=subprocess.PIPE, text=True),
            subprocess.Popen([secret, "-c", {HOLDER!r}], stdout=subprocess.PIPE, text=True),
            subprocess.Popen([secret, "-c", {HOLDER!r}], stdout=subprocess.PIPE, text=True)]
print("PRCTL", children[0].stdout.readline().strip())
held = [c.stdout.readline().strip() == "held" for c in children]
time.sleep(2)
print("RESULT", sum(h and c.poll() is None for h, c in zip(held, children)))
""", timeout=60)
    if step.failure == DIED:
        assert step.reason.startswith("memory limit"), step.reason
        return
    text = "".join(o.get("text", "") for o in step.outputs if o["output_type"] == "stream")
    assert "PRCTL -1" in text, text  # refused by the seccomp filter
    assert int(text.split("RESULT")[1]) < 3, "three processes held 1.2 GB together under a 1 GiB limit"


def test_memory_queued_in_socket_buffers_counts_too(start_either):
    """Bytes written to sockets nobody reads belong to no process; the kernel charges them to the sockets."""
    step = run(start_either(), """
import resource, socket
resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)
pairs, queued = [], 0
try:
    while queued < 1200 * 2**20 and len(pairs) < 20000:
        a, b = socket.socketpair()
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 2**24)
        a.setblocking(False)
        pairs.append((a, b))
        try:
            while True:
                queued += a.send(b"x" * 65536)
        except BlockingIOError:
            pass
except OSError as exc:
    print("STOPPED", exc)
import time
time.sleep(2)
print("RESULT", queued)
""", timeout=120)
    if step.failure == DIED:
        assert step.reason.startswith("memory limit"), step.reason
        return
    text = "".join(o.get("text", "") for o in step.outputs if o["output_type"] == "stream")
    assert int(text.split("RESULT")[1]) < LIMITS["memory_bytes"], "socket buffers held more than the limit: " + text


def test_a_fork_bomb_is_capped(start, server):
    kernel = start()
    result = ask(kernel, """
import os, time
forked = 0
try:
    while forked < 1000:
        if os.fork() == 0:
            time.sleep(600)
            os._exit(0)
        forked += 1
except BlockingIOError:
    pass
result = forked
""")
    assert 0 < result < LIMITS["processes"], f"{result} processes forked under a limit of {LIMITS['processes']}"
    assert ask(kernel, "result = 'alive'") == "alive"
    kernel.stop()
    server.next_runtime()
    assert descendants(server.process.pid) == []


def test_writable_space_is_capped(start):
    result = ask(start(), ATTEMPT + """
chunk = b"x" * 2**20
def fill(folder, files, mib):
    for i in range(files):
        with open(os.path.join(folder, f"fill-{i}"), "wb") as f:
            for _ in range(mib):
                f.write(chunk)
result = {
    "one file": attempt(lambda: fill("/tmp", 1, 20)),  # 16 MiB per file
    "tmp": attempt(lambda: fill("/tmp", 4, 12)),  # 32 MiB of /tmp
    "shm": attempt(lambda: fill("/dev/shm", 2, 6)),  # 8 MiB of /dev/shm
}
""")
    assert result == {"one file": 27, "tmp": 28, "shm": 28}, result  # EFBIG, ENOSPC, ENOSPC


def test_cpu_time_is_capped_and_named(start, server):
    step = run(start(), "while True:\n    pass", timeout=60)
    exit_report = latest_folder(server).with_suffix(".exit.json")  # the sandbox's report: exit status 128 + signal
    assert step.failure == DIED and step.reason.startswith("CPU time limit"), (
        step.failure, step.reason, exit_report.read_text() if exit_report.exists() else "no exit report")


def test_a_timeout_kill_leaves_nothing_on_the_host(start, server, monkeypatch):
    monkeypatch.setattr(harness, "INTERRUPT_GRACE_S", 1.0)
    kernel = start()
    folder = latest_folder(server)
    step = run(kernel, ATTEMPT + f"""
import subprocess, time
for target in ("/tmp/junk", {str(folder / "junk")!r}, {str(server.folder / "junk")!r}):
    attempt(lambda: open(target, "wb").write(b"x" * 2**20))
subprocess.Popen([sys.executable, "-c", "import time\\ntime.sleep(600)"], start_new_session=True)
signal.signal(signal.SIGINT, signal.SIG_IGN)
time.sleep(600)
""", timeout=2)
    assert step.failure == KILLED
    kernel.stop()
    server.next_runtime()
    assert descendants(server.process.pid) == []
    assert not folder.exists(), "the killed kernel's socket folder is still on the host"
    leftovers = [p for p in server.folder.rglob("*") if "junk" in p.name]
    assert leftovers == [] and not Path("/tmp/junk").exists()
    if server.cgroups is not None:
        assert not server.cgroups.path(folder.name.removeprefix("submission-")).exists()


def test_the_status_names_the_limit_that_killed_the_kernel():
    steps = [Step("setup", "x = 1", by_student=False)]
    runs = [StepRun(failure=DIED, reason="memory limit: its processes held 1.10 GiB together")]
    assert run_notes(Graded(steps, runs, {})) == [
        Note(NoteKind.KERNEL_DIED, "kernel died in cell setup (memory limit: its processes held 1.10 GiB together)")]


def test_cgroup_v2_files(tmp_path):
    """The cgroup v2 path cannot run on this machine (v1 only): at least the files it writes and reads."""
    cgroups = limits.MemoryCgroups(2, tmp_path, "t")
    procs = cgroups.create("1", 123 * MiB)
    folder = cgroups.path("1")
    assert procs == [str(folder / "cgroup.procs")] and (folder / "memory.max").read_text() == str(123 * MiB)
    (folder / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\n")
    assert cgroups.oom_kills("1") == 2
    for name in ("memory.max", "memory.events"):
        (folder / name).unlink()
    cgroups.remove("1")
    assert not folder.exists()


# --- the same attacks with the grader started by an unprivileged user -----------------------------------------

def _nobody(*argv: str) -> list[str]:
    return as_user(65534, *argv)


def test_attacks_hold_for_an_unprivileged_grader():
    if os.environ.get(UNPRIVILEGED_RUN):
        pytest.skip("this is the unprivileged run")
    if os.geteuid() != 0:
        pytest.skip("the suite already runs unprivileged")
    if shutil.which("setpriv") is None:
        unavailable("setpriv (util-linux) is needed to start the grader as nobody")
    folder = Path(tempfile.mkdtemp(prefix="sandbox-nobody-"))  # in /tmp: nobody cannot reach pytest's tmp_path
    try:
        shutil.chown(folder, 65534, 65534)
        python = python_for(65534, folder)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(folder), "TMPDIR": str(folder),
               "PYTHONDONTWRITEBYTECODE": "1", UNPRIVILEGED_RUN: "1", "LANG": os.environ.get("LANG", "C.UTF-8")}
        if "CI" in os.environ:
            env["CI"] = os.environ["CI"]
        install = "from grader.kernel import kernelspec; kernelspec.install_kernelspec()"
        # the sandbox's attacks (its quota ones too), and the collection's and export's (those that need no nbgrader
        # build folder: nobody cannot write reference records under build/, which grading an assignment first does)
        files = " ".join(str(Path(__file__).parent / name) for name in
                         ("test_sandbox.py", "test_sandbox_parts.py", "test_collection.py", "test_hardening_quotas.py"))
        script = (f'"$0" -c "{install}" && exec "$0" -m pytest -p no:cacheprovider -q -x '
                  f'--basetemp={folder / "pytest"} -k "not bounded_memory and not graded_without_assignment" {files}')
        done = subprocess.run(_nobody("/bin/sh", "-c", script, python), cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=600, check=False)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    passed = int(re.search(r"(\d+) passed", summary).group(1))
    assert passed >= 25 and "failed" not in summary, summary


def _prints_four(kernel: harness.Kernel) -> StepRun:
    try:
        return kernel.run("print(2 + 2)", 60)
    finally:
        kernel.stop()


def test_trusted_kernels_outlive_the_threads_that_asked_for_them(server):
    """servers_for_threads (the reference run and known mistakes, recorded by autograde's threads): after the pool
    thread that asked a server for a kernel has exited, the server's kernel in use runs on and it starts another
    (a server dies with the thread that started it; the asking threads never restart one, a dead one fails)."""
    from concurrent.futures import ThreadPoolExecutor

    with kernelspec.servers_for_threads(1, "1") as start:
        with ThreadPoolExecutor(max_workers=1) as pool:
            pool.submit(lambda: start().stop()).result()
            in_use = start()  # the same server, asked from this thread
        runs = [_prints_four(in_use), _prints_four(start())]  # the pool's thread has exited
    for run in runs:
        assert not run.failure and "4" in "".join(o.get("text", "") for o in run.outputs), (run.failure, run.outputs)
