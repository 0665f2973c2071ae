"""Attacks on what one hand-in's kernel can take outside its sandbox (issue 36, items 1 and 2).

Memory the watchdog cannot see: where no memory cgroup holds a submission (a non-root grader, COURSE_SANDBOX_CGROUPS
off), the sandbox's PID 1 adds up what it holds (grader/kernel/memwatch.py). Shared memory that lives outside every
file system of the sandbox once dropped from the page tables, or that no process holds, once escaped it. Per-user
quotas: what a kernel's processes take of inotify, queued signals and POSIX message queues is charged to the
grading user, whose every process was refused while a hand-in held them all.

Run as root here, and again with the grader started as `nobody` (tests/test_sandbox.py
`test_attacks_hold_for_an_unprivileged_grader` runs this file too): then the charges go to nobody, and no cgroup
holds the kernels.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import signal
import threading

import pytest
from unix_users import unavailable

from grader.kernel import confine, harness, kernelspec, memwatch, sandbox
from grader.kernel.harness import DIED

pytestmark = pytest.mark.slow
MiB = 2**20
# small: the kernel itself (torch imported) holds about 350 MiB; each attack tries to hold 768 MiB on top
LIMITS = {"memory_bytes": 768 * MiB, "address_space_bytes": 4096 * MiB, "disk_bytes": 32 * MiB, "shm_bytes": 8 * MiB,
          "file_bytes": 128 * MiB, "processes": 64, "cpu_seconds": 30}
HOLD_MIB = 768


def _server(cgroups: bool) -> sandbox.ForkServer:
    problem = sandbox.why_unavailable()
    if problem:
        unavailable(f"the kernel sandbox cannot be built here: {problem}")
    srv = sandbox.ForkServer()
    srv.limits = dataclasses.replace(srv.limits, **LIMITS)
    if not cgroups:
        srv.cgroups = None
    return srv


@pytest.fixture(scope="module")
def watched_server():
    """A server whose kernels' memory only the sandbox's PID 1 counts (no cgroup): what a non-root grader gets."""
    srv = _server(cgroups=False)
    yield srv
    srv.close()


@pytest.fixture
def watched(watched_server):
    """Start kernels from the watched server; each one is stopped at the end of the test."""
    started: list[harness.Kernel] = []
    factory = kernelspec.kernel_factory(watched_server)

    def new() -> harness.Kernel:
        started.append(factory())
        return started[-1]

    yield new
    for kernel in started:
        kernel.stop()


def _text(step) -> str:
    return "".join(o.get("text", "") for o in step.outputs if o["output_type"] == "stream")


# --- 1. memory the watchdog cannot see ------------------------------------------------------------------------

# Each attack holds HOLD_MIB in chunks, each filled with its own byte, and reports what it holds as `held` (bytes
# it filled and can still read back), or the error that stopped it.
PRELUDE = f"""
import ctypes, errno, mmap, os, socket, time
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
libc.shmat.restype = ctypes.c_void_p
CHUNK, CHUNKS = 128 * 2**20, {HOLD_MIB} // 128
held, stopped, maps = 0, "", []
def fill_and_drop(m, i):  # fill a shared mapping, drop it from the page tables, keep it: what it still holds
    for off in range(0, CHUNK, 2**20):
        m[off:off + 2**20] = bytes([i + 1]) * 2**20
    m.madvise(mmap.MADV_DONTNEED)
    maps.append(m)
    return CHUNK * (m[CHUNK // 2] == i + 1)
"""
ATTACKS = {
    # shared anonymous memory dropped from the page tables: the pages stay in the shared object
    "shared anonymous, MADV_DONTNEED": """
for i in range(CHUNKS):
    held += fill_and_drop(mmap.mmap(-1, CHUNK), i)  # MAP_SHARED | MAP_ANONYMOUS
""",
    # the same, unmapped but for one page: the mapping shows 4 KiB, the object holds all of it
    "shared anonymous, unmapped but a page": """
for i in range(CHUNKS):
    p = libc.mmap(None, CHUNK, 3, 0x21, -1, 0)
    if p in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    ctypes.memset(p, i + 1, CHUNK)
    libc.munmap(p + 4096, CHUNK - 4096)
    held += CHUNK * (ctypes.c_ubyte.from_address(p).value == i + 1)
""",
    "/dev/zero mapped shared, MADV_DONTNEED": """
zero = os.open("/dev/zero", os.O_RDWR)
for i in range(CHUNKS):
    held += fill_and_drop(mmap.mmap(zero, CHUNK, mmap.MAP_SHARED), i)
""",
    # memfd files in flight in a unix socket, closed by the sender: no process holds them
    "memfd in flight": """
a, b = socket.socketpair()
for i in range(CHUNKS):
    fd = os.memfd_create(f"hold-{i}")
    for _ in range(CHUNK // 2**20):
        os.write(fd, bytes([i + 1]) * 2**20)
    socket.send_fds(a, [b"m"], [fd])
    os.close(fd)
    held += CHUNK
""",
    # a System V segment still attached, dropped from the page tables
    "System V attached, MADV_DONTNEED": """
for i in range(CHUNKS):
    segment = libc.shmget(0, ctypes.c_size_t(CHUNK), 0o600)
    if segment < 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    p = libc.shmat(segment, None, 0)
    ctypes.memset(p, i + 1, CHUNK)
    libc.madvise(p, CHUNK, 4)
    held += CHUNK * (ctypes.c_ubyte.from_address(p + CHUNK // 2).value == i + 1)
""",
}


@pytest.mark.parametrize("attack", ATTACKS)
def test_shared_memory_the_watchdog_cannot_count_is_refused_or_counted(watched, attack):
    """Each attack held 768 MiB over the kernel's own 350 under a 768 MiB limit, the data intact, status ok. Now
    either the sandbox refuses to make such memory, or the watchdog counts it and stops the submission."""
    code = PRELUDE + "try:\n" + "".join(f"    {line}\n" for line in ATTACKS[attack].strip().splitlines())
    code += "except OSError as exc:\n    stopped = f'{type(exc).__name__}: {exc}'\n"
    code += "time.sleep(1.5)\nprint('RESULT', held, stopped)\n"
    step = watched().run(code, 90)
    if step.failure == DIED:
        assert step.reason == "memory limit: the submission used more than the 768 MiB limit (watchdog)", step.reason
        return
    text = _text(step)
    errors = [f"{o['ename']}: {o['evalue']}" for o in step.outputs if o["output_type"] == "error"]
    assert "RESULT" in text and not errors, (step.failure, text, errors)
    held, _, stopped = text.split("RESULT ", 1)[1].strip().partition(" ")
    assert int(held) == 0 and stopped, f"{attack}: held {int(held) // MiB} MiB unseen ({stopped or 'not stopped'})"


def test_what_libraries_need_still_works(watched):
    """Refused: memfd_create (ENOSYS, which callers take for 'fall back') and anonymous shared mappings. Private
    memory, files mapped shared, /dev/shm, /dev/zero's zeros, and torch's shared tensors all work."""
    step = watched().run(PRELUDE + """
import json, multiprocessing, torch
result = {}
try:
    os.memfd_create("x")
except OSError as exc:
    result["memfd_create"] = exc.errno
m = mmap.mmap(-1, 2**20, flags=mmap.MAP_PRIVATE)
m[:5] = b"hello"
result["private"] = m[:5].decode()
with open("/dev/shm/shared", "w+b") as f:
    f.truncate(2**20)
    result["file shared"] = len(mmap.mmap(f.fileno(), 2**20))
result["zeros"] = open("/dev/zero", "rb").read(4).hex()
t = torch.zeros(1000).share_memory_()
result["torch shared"] = bool(t.is_shared())
value = multiprocessing.get_context("fork").Value("i", 7)
result["multiprocessing"] = value.value
libc.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
queue = libc.mq_open(b"/default", os.O_CREAT | os.O_RDWR, 0o600, None)  # 10 messages of 8 KiB
result["mq_open"] = 0 if queue >= 0 else ctypes.get_errno()
print("RESULT", json.dumps(result))
""", 90)
    text = _text(step)
    assert "RESULT" in text, (step.failure, text, step.outputs)
    assert json.loads(text.split("RESULT ", 1)[1]) == {"memfd_create": 38, "private": "hello", "file shared": 2**20,
                                                        "zeros": "00000000", "torch shared": True,
                                                        "multiprocessing": 7, "mq_open": 0}


# --- 2. per-user quotas -----------------------------------------------------------------------------------------

# In a child (one thread, the real-time signal blocked): take as much as the kernel lets it of each quota, report,
# and hold it all until killed.
HOLD_QUOTAS = """
import ctypes, itertools, json, os, signal, time
r, w = os.pipe()
if os.fork() == 0:
    os.close(r)
    libc = ctypes.CDLL(None, use_errno=True)
    held = {}
    instances = []
    while len(instances) < 100000 and (fd := libc.inotify_init1(0)) >= 0:
        instances.append(fd)
    held["inotify instances"] = len(instances)
    every = (os.path.join(root, name) for root, folders, files in os.walk("/usr") for name in folders + files)
    paths = list(itertools.islice(every, PATHS))
    watches = set()  # (instance, watch): a second path to a watched file (a link) gives the same watch
    for fd in instances:
        for path in paths:
            if (wd := libc.inotify_add_watch(fd, path.encode(), 0x100)) >= 0:
                watches.add((fd, wd))
            elif ctypes.get_errno() == 28:  # ENOSPC: this user's watches are used up
                break
        else:
            continue
        break
    held["inotify watches"] = len(watches)
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])
    queued = 0
    while queued < 10**6 and libc.sigqueue(os.getpid(), signal.SIGRTMIN, ctypes.c_void_p(1)) == 0:
        queued += 1
    held["queued signals"] = queued
    attr = (ctypes.c_long * 8)(0, 2, 4096, 0)  # 2 messages of 4 KiB: about 8 KiB of the quota each
    libc.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    queues = 0
    while queues < 1000 and libc.mq_open(f"/hold-{queues}".encode(), os.O_CREAT | os.O_RDWR, 0o600, attr) >= 0:
        queues += 1
    held["message queues"] = queues
    os.write(w, json.dumps(held).encode())
    os.close(w)
    time.sleep(3600)
    os._exit(0)
os.close(w)
print("RESULT", os.read(r, 10000).decode())
"""


def _grading_user_can_use_each_quota() -> dict[str, int]:
    """0 for each quota this process (the grading user) can still use, or the errno it got."""
    libc = ctypes.CDLL(None, use_errno=True)
    result = {}
    fd = libc.inotify_init1(0)
    result["inotify_init1"] = ctypes.get_errno() if fd < 0 else 0
    if fd >= 0:
        result["inotify_add_watch"] = 0 if libc.inotify_add_watch(fd, b"/usr", 0x100) >= 0 else ctypes.get_errno()
        os.close(fd)
    sig = signal.SIGRTMIN + 1
    old = signal.pthread_sigmask(signal.SIG_BLOCK, [sig])
    try:  # to this thread (tgkill): sent to the process, it may reach a thread that does not block it, and kill all
        try:
            signal.pthread_kill(threading.get_ident(), sig)  # a real-time signal queues, charged as sigqueue's
            queued = 0
        except OSError as exc:
            queued, result["sigqueue"] = -1, exc.errno or -1
        if queued == 0:
            result["sigqueue"] = 0
            signal.sigwaitinfo([sig])
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    libc.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    name = f"/tml-quota-check-{os.getpid()}".encode()
    queue = libc.mq_open(name, os.O_CREAT | os.O_RDWR, 0o600, None)  # the default: 10 messages of 8 KiB
    result["mq_open"] = ctypes.get_errno() if queue < 0 else 0
    if queue >= 0:
        os.close(queue)
        libc.mq_unlink(name)
    return result


def test_kernels_take_at_most_their_share_of_the_grading_users_quotas():
    """Three kernels at once (a batch runs several), each taking all it can of each quota, and the grading user
    still gets each meanwhile. Before, the first kernel took it all: EMFILE from inotify_init1 and mq_open, EAGAIN
    from sigqueue, for every process of the grading user (of root, when grading as root)."""
    assert _grading_user_can_use_each_quota() == {name: 0 for name in ("inotify_init1", "inotify_add_watch", "sigqueue",
                                                                       "mq_open")}
    with open("/proc/sys/user/max_inotify_watches") as f, open("/proc/sys/user/max_inotify_instances") as g:
        paths = int(f.read()) // int(g.read()) + 100  # enough for all of the user's watches, had it all instances
    srv = _server(cgroups=True)
    # alongside one another, as a worker starts the next kernel while one grades (a `background` makes the factory
    # start each beside those running, not after them); stopping runs right here
    start = kernelspec.kernel_factory(srv, background=lambda stop: stop())
    kernels = []
    try:
        for _ in range(3):
            kernels.append(start())
            step = kernels[-1].run(HOLD_QUOTAS.replace("PATHS", str(paths)), 120)
            text = _text(step)
            assert "RESULT" in text, (step.failure, step.reason, text, step.outputs)
            held = json.loads(text.split("RESULT ", 1)[1])
            quotas = confine.USER_NS_QUOTAS
            assert held["inotify instances"] <= quotas["max_inotify_instances"], held
            assert held["inotify watches"] <= quotas["max_inotify_watches"], held
            assert held["queued signals"] <= dict(confine.QUOTA_RLIMITS)["RLIMIT_SIGPENDING"], held
            assert held["message queues"] * 8192 <= dict(confine.QUOTA_RLIMITS)["RLIMIT_MSGQUEUE"], held
            assert _grading_user_can_use_each_quota() == {"inotify_init1": 0, "inotify_add_watch": 0, "sigqueue": 0,
                                                          "mq_open": 0}, (len(kernels), held)
        assert ["alive" in _text(kernel.run("print('alive')", 30)) for kernel in kernels] == [True] * 3  # all at once
    finally:
        for kernel in kernels:
            kernel.stop()
        srv.close()


# --- 3. kernel memory no /proc file shows -----------------------------------------------------------------------

KERNEL_MEMORY_CALLS = """
import ctypes, errno, json, os, socket
libc = ctypes.CDLL(None, use_errno=True)
def attempt(call):
    try:
        call()
        return 0
    except OSError as exc:
        return exc.errno
def raw(call):
    return 0 if call() >= 0 else ctypes.get_errno()
class iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
page = ctypes.create_string_buffer(4096)
r, w = os.pipe()
result = {"vmsplice": raw(lambda: libc.vmsplice(w, ctypes.byref(iovec(ctypes.addressof(page), 4096)), 1, 0)),
          "io_setup": raw(lambda: libc.syscall(206, 16, ctypes.byref(ctypes.c_ulong(0)))),  # x86_64
          "F_SETPIPE_SZ 1 MiB": attempt(lambda: __import__("fcntl").fcntl(w, 1031, 2**20)),
          "F_SETPIPE_SZ 64 KiB": attempt(lambda: __import__("fcntl").fcntl(w, 1031, 65536)),
          "UDP-Lite": attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM, 136)),
          "SCTP": attempt(lambda: socket.socket(socket.AF_INET6, socket.SOCK_SEQPACKET, 0)),
          "MPTCP": attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262)),
          "AF_PACKET": attempt(lambda: socket.socket(17, socket.SOCK_DGRAM, 0))}
for name, family, kind, proto in (("TCP", 2, 1, 0), ("TCP6", 10, 1, 6), ("UDP", 2, 2, 17), ("UDP6", 10, 2, 0),
                                  ("unix", 1, 1, 0), ("netlink", 16, 3, 0)):
    result[name] = attempt(lambda: socket.socket(family, kind | socket.SOCK_NONBLOCK, proto).close())
print("RESULT", json.dumps(result))
"""


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="io_setup's number is x86_64's")
def test_kernel_memory_no_proc_file_shows_is_refused(watched):
    """vmsplice pinned a whole 2 MiB huge page for each 4 KiB spliced (48 pipes: 1.5 GiB unseen), io_setup took the
    host's aio-nr, and UDP-Lite's buffers are unknown to sock_diag: refused now, and TCP, UDP, unix and netlink
    sockets still open."""
    step = watched().run(KERNEL_MEMORY_CALLS, 90)
    text = _text(step)
    assert "RESULT" in text, (step.failure, text, step.outputs)
    assert json.loads(text.split("RESULT ", 1)[1]) == {
        "vmsplice": 38, "io_setup": 38, "F_SETPIPE_SZ 1 MiB": 1, "F_SETPIPE_SZ 64 KiB": 0, "UDP-Lite": 1, "SCTP": 1,
        "MPTCP": 1, "AF_PACKET": 1, "TCP": 0, "TCP6": 0, "UDP": 0, "UDP6": 0, "unix": 0, "netlink": 0}


SYSV_IPC = """
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
result = {name: open(f"/proc/sys/kernel/{name}").read().split() for name in ("sem", "msgmni", "msgmnb")}
result["semget 32000"] = 0 if libc.semget(0, 32000, 0o1600) >= 0 else ctypes.get_errno()
sets = 0
while sets < 1000 and libc.semget(0, 250, 0o1600) >= 0:
    sets += 1
result["semaphores"] = sets * 250
libc.msgsnd.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
message = ctypes.create_string_buffer(16)
ctypes.c_long.from_buffer(message).value = 1
queues = messages = 0
while queues < 1000 and (queue := libc.msgget(0, 0o1600)) >= 0:
    queues += 1
    while messages < 10**7 and libc.msgsnd(queue, message, 0, 0o4000) == 0:  # empty, IPC_NOWAIT
        messages += 1
result["queues"], result["messages"] = queues, messages
print("RESULT", json.dumps(result))
"""


def test_system_v_semaphores_and_messages_are_bounded(watched):
    """800 sets of 32000 semaphores held 1.8 GiB, and empty messages (64 bytes each, none of it `cbytes`) went
    uncounted: the sandbox's IPC namespace now has small limits (confine.IPC_NS_LIMITS). Only the host's root may
    write them; under a non-root grader the watchdog's count alone holds them (the next test)."""
    if os.geteuid() != 0:
        pytest.skip("only a root grader's sandbox can write its IPC namespace's limits")
    step = watched().run(SYSV_IPC, 90)
    text = _text(step)
    assert "RESULT" in text, (step.failure, text, step.outputs)
    result = json.loads(text.split("RESULT ", 1)[1])
    assert {name: result[name] for name in ("sem", "msgmni", "msgmnb")} == {
        name: value.split() for name, value in confine.IPC_NS_LIMITS.items()}, result
    assert result["semget 32000"] == 22 and result["semaphores"] <= 8192, result  # EINVAL: more than semmsl
    assert result["queues"] <= 32 and result["messages"] <= 32 * 16384, result


COUNT_SYSV = """
import ctypes, json
from grader.kernel import memwatch
libc = ctypes.CDLL(None, use_errno=True)
assert libc.unshare(0x10000000 | 0x08000000) == 0  # CLONE_NEWUSER | CLONE_NEWIPC: a namespace of its own
before = memwatch._sysv_bytes()
assert libc.semget(0, 1000, 0o1600) >= 0
libc.msgsnd.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
message = ctypes.create_string_buffer(16)
ctypes.c_long.from_buffer(message).value = 1
queue = libc.msgget(0, 0o1600)
for _ in range(100):
    assert libc.msgsnd(queue, message, 0, 0o4000) == 0
print(json.dumps([before, memwatch._sysv_bytes()]))
"""


def test_the_watchdog_counts_semaphores_and_empty_messages():
    """Before, /proc/sysvipc/sem went unread and an empty message counted nothing."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", COUNT_SYSV], capture_output=True, text=True, timeout=60,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [0, 1000 * memwatch.SYSV_EACH["nsems"] + 100 * memwatch.SYSV_EACH["qnum"]]


# --- 4. what Linux counts per host uid ----------------------------------------------------------------------------

IN_FLIGHT = """
import json, os, socket
pairs, result = [], {"sent": 0, "errno": 0}
r, w = os.pipe()
try:
    while result["sent"] < 10**6:
        if result["sent"] % 25000 == 0:
            pairs.append(socket.socketpair())
            pairs[-1][0].setblocking(False)
        socket.send_fds(pairs[-1][0], [b"x"], [r] * FDS)
        result["sent"] += FDS
except OSError as exc:
    result["errno"] = exc.errno
print("RESULT", json.dumps(result))
"""


def test_each_root_graded_sandbox_is_a_host_uid_of_its_own():
    """Linux counts descriptors in flight in unix sockets (and epoll watches, pipe pages) per host uid. One kernel
    held them all, and while it did, a kernel beside it could pass none (ETOOMANYREFS: an honest DataLoader's
    workers broke) when every sandbox was `nobody` on the host. Now each has a uid of its own."""
    if os.geteuid() != 0:
        pytest.skip("only a root grader can give each sandbox a host uid of its own")
    srv = _server(cgroups=False)
    start = kernelspec.kernel_factory(srv, background=lambda stop: stop())
    kernels = []
    try:
        results = []
        for fds in (250, 1):
            kernels.append(start())
            step = kernels[-1].run(IN_FLIGHT.replace("FDS", str(fds)).replace("10**6", "10**6" if fds > 1 else "1"),
                                   60)
            text = _text(step)
            assert "RESULT" in text, (step.failure, step.reason, text, step.outputs)
            results.append(json.loads(text.split("RESULT ", 1)[1]))
        assert results[0]["errno"] == 109 and results[1] == {"sent": 1, "errno": 0}, results  # 109: ETOOMANYREFS
        uids = [kernel.run("print('UID', open('/proc/self/uid_map').read().split()[1])", 30) for kernel in kernels]
        outside = {int(_text(step).split("UID ", 1)[1]) for step in uids}
        assert len(outside) == 2 and min(outside) >= 2**20, outside
    finally:
        for kernel in kernels:
            kernel.stop()
        srv.close()


# --- 4. what the host shares: its file table, and TCP memory a cgroup v1 does not charge ------------------------

HOLD_FILES = """
import ctypes, mmap, os, time
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
with open("/tmp/page", "wb") as f:
    f.write(b"x" * 4096)
def descriptors():
    return [os.eventfd(0) for _ in range(3000)]
def mapped():  # each file mapped, then its descriptor closed: the file stays open, behind no descriptor
    for _ in range(30000):
        fd = os.open("/tmp/page", os.O_RDONLY)
        libc.mmap(None, 4096, mmap.PROT_READ, mmap.MAP_PRIVATE, fd, 0)
        os.close(fd)
r, w = os.pipe()
for _ in range(CHILDREN):
    if os.fork() == 0:
        held = HOW()
        os.write(w, b"x")
        time.sleep(60)
        os._exit(0)
for _ in range(CHILDREN):
    os.read(r, 1)
time.sleep(2)
print("RESULT all held")
"""

HOLD_TCP = """
import socket, time
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen(1200)
pairs = []
for _ in range(1000):
    sender = socket.create_connection(server.getsockname())
    pairs.append((sender, server.accept()[0]))
    sender.setblocking(False)
    try:
        while True:
            sender.send(b"x" * 65536)
    except BlockingIOError:
        pass
time.sleep(2)
print("RESULT all held")
"""


@pytest.fixture(params=[False, True], ids=["watchdog", "cgroup"])
def either_server(request):
    """A server whose kernels' memory only the watchdog counts, then one whose kernels a cgroup holds (skipped for
    a grader that has none: an unprivileged one)."""
    srv = _server(cgroups=request.param)
    if request.param and srv.cgroups is None:
        srv.close()
        pytest.skip("no memory cgroup for this grader here (an unprivileged one): the watchdog case holds for it")
    yield srv
    srv.close()


@pytest.mark.parametrize("how, children", [("descriptors", memwatch.OPEN_FILES_TOTAL // 3000 + 2), ("mapped", 3)])
def test_files_held_together_are_bounded_however_memory_is_held(either_server, how, children):
    """Review round 3: 200 processes of about 4090 eventfds each held 809,100 of the host's 2,466,320 files
    (fs.file-max; when it is full every unprivileged process on the host gets ENFILE) with status ok; then, with
    descriptors counted, files mapped and closed held 100,000 more, none of them a descriptor. Now the sandbox's
    PID 1 stops a submission whose processes hold more than memwatch.OPEN_FILES_TOTAL files, descriptors and
    mappings together; one process may still hold its RLIMIT_NOFILE."""
    kernel = kernelspec.kernel_factory(either_server)()
    try:
        step = kernel.run(HOLD_FILES.replace("CHILDREN", str(children)).replace("HOW", how), 90)
        assert step.failure == DIED, (step.failure, _text(step))
        assert step.reason == (f"open files limit: the submission held more than {memwatch.OPEN_FILES_TOTAL} "
                               "open files (watchdog)"), step.reason
        ok = kernelspec.kernel_factory(either_server)()
        try:
            step = ok.run("import os\nheld = [os.eventfd(0) for _ in range(3000)]\nprint('RESULT', len(held))", 60)
            assert "RESULT 3000" in _text(step) and not step.failure, (step.failure, step.reason, _text(step))
        finally:
            ok.stop()
    finally:
        kernel.stop()


def test_loopback_tcp_buffers_are_bounded_below_the_hosts_tcp_memory(either_server):
    """Review round 3: under a cgroup v1 memory limit (no kmem.tcp limit is set) 240 loopback connections held
    917 MiB of the host's TCP memory (net.ipv4.tcp_mem, shared by every socket of the host) while the cgroup
    showed 39 MB; status ok; then, counted against the memory limit on their own, 1.2 GiB beside 3 GiB of
    process memory. Now the sandbox's PID 1 stops TCP and UDP buffers at memwatch.SOCKET_BYTES_TOTAL however the
    memory is held."""
    kernel = kernelspec.kernel_factory(either_server)()
    try:
        caps = kernel.run("print(open('/proc/sys/net/ipv4/tcp_rmem').read(), open('/proc/sys/net/ipv4/tcp_wmem').read())", 30)
        assert _text(caps).split() == [*confine.TCP_BUFFERS["tcp_rmem"].split(), *confine.TCP_BUFFERS["tcp_wmem"].split()]
        step = kernel.run(HOLD_TCP, 90)
        assert step.failure == DIED and step.reason == (
            f"socket buffer limit: the submission's TCP and UDP buffers held more than "
            f"{memwatch.size_text(memwatch.SOCKET_BYTES_TOTAL)} (watchdog)"), (step.failure, step.reason, _text(step))
    finally:
        kernel.stop()
