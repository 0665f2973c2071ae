"""The seccomp filter on every student process: at least as strict as Docker's default profile.

Docker's default profile (moby/profiles seccomp/default.json, 2026-06-30) refuses every system call it
does not list with EPERM. For a process with no capabilities — the kernel and everything it starts —
this filter allows exactly Docker's unconditional list (`DOCKER_ALLOWED`) and Docker's conditional rules
as they apply without capabilities (clone without namespace flags, clone3 answered ENOSYS so that the C
library falls back to clone, personality with the harmless values, the architecture's own calls), and is
stricter in five places: socket() only for AF_UNIX, AF_NETLINK, and TCP or UDP over AF_INET and AF_INET6 (buffers
the watchdog counts); vmsplice and asynchronous I/O (io_setup …) are answered ENOSYS and fcntl(F_SETPIPE_SZ) refused
above a pipe's default size (`KERNEL_MEMORY`: kernel memory no /proc file shows);
ptrace and process_vm_readv/writev (Docker allows them on kernels ≥ 4.8) and memfd_secret are refused;
prctl(PR_SET_DUMPABLE) can only keep a process dumpable, so every process of a submission stays countable by the
sandbox's PID 1 (grader/kernel/memwatch.py); and no shared memory may be made that nothing of the sandbox can count
(`UNCOUNTABLE`): memfd_create is answered ENOSYS (libraries fall back to a file in /dev/shm or /tmp, the sandbox's
own tmpfs: asmjit in torch, libffi), and mmap(MAP_SHARED | MAP_ANONYMOUS) EPERM (the sandbox's /dev/zero cannot be
mapped either: grader/kernel/newroot.py).
keyctl, add_key and request_key are on no list: a kernel cannot reach any keyring, not even its own.

Built once in the fork server with libseccomp (through pyseccomp; no hand-written BPF) and loaded by each
kernel (grader/kernel/confine.py) after its capabilities are gone.
"""

from __future__ import annotations

import errno
import os

# Docker's unconditional allow list (the first rule of its default profile), verbatim.
DOCKER_ALLOWED = """
    accept accept4 access adjtimex alarm bind brk cachestat capget capset chdir chmod chown chown32 clock_adjtime
    clock_adjtime64 clock_getres clock_getres_time64 clock_gettime clock_gettime64 clock_nanosleep
    clock_nanosleep_time64 close close_range connect copy_file_range creat dup dup2 dup3 epoll_create epoll_create1
    epoll_ctl epoll_ctl_old epoll_pwait epoll_pwait2 epoll_wait epoll_wait_old eventfd eventfd2 execve execveat exit
    exit_group faccessat faccessat2 fadvise64 fadvise64_64 fallocate fanotify_mark fchdir fchmod fchmodat fchmodat2
    fchown fchown32 fchownat fcntl fcntl64 fdatasync fgetxattr flistxattr flock fork fremovexattr fsetxattr fstat
    fstat64 fstatat64 fstatfs fstatfs64 fsync ftruncate ftruncate64 futex futex_requeue futex_time64 futex_wait
    futex_waitv futex_wake futimesat getcpu getcwd getdents getdents64 getegid getegid32 geteuid geteuid32 getgid
    getgid32 getgroups getgroups32 getitimer getpeername getpgid getpgrp getpid getppid getpriority getrandom
    getresgid getresgid32 getresuid getresuid32 getrlimit get_robust_list getrusage getsid getsockname getsockopt
    get_thread_area gettid gettimeofday getuid getuid32 getxattr getxattrat inotify_add_watch inotify_init
    inotify_init1 inotify_rm_watch io_cancel ioctl io_destroy io_getevents io_pgetevents io_pgetevents_time64
    ioprio_get ioprio_set io_setup io_submit ipc kill landlock_add_rule landlock_create_ruleset
    landlock_restrict_self lchown lchown32 lgetxattr link linkat listen listmount listxattr listxattrat llistxattr
    _llseek lremovexattr lseek lsetxattr lstat lstat64 madvise map_shadow_stack membarrier memfd_create memfd_secret
    mincore mkdir mkdirat mknod mknodat mlock mlock2 mlockall mmap mmap2 mprotect mq_getsetattr mq_notify mq_open
    mq_timedreceive mq_timedreceive_time64 mq_timedsend mq_timedsend_time64 mq_unlink mremap mseal msgctl msgget
    msgrcv msgsnd msync munlock munlockall munmap name_to_handle_at nanosleep newfstatat _newselect open openat
    openat2 pause pidfd_open pidfd_send_signal pipe pipe2 pkey_alloc pkey_free pkey_mprotect poll ppoll ppoll_time64
    prctl pread64 preadv preadv2 prlimit64 process_mrelease pselect6 pselect6_time64 pwrite64 pwritev pwritev2 read
    readahead readlink readlinkat readv recv recvfrom recvmmsg recvmmsg_time64 recvmsg remap_file_pages removexattr
    removexattrat rename renameat renameat2 restart_syscall riscv_hwprobe rmdir rseq rt_sigaction rt_sigpending
    rt_sigprocmask rt_sigqueueinfo rt_sigreturn rt_sigsuspend rt_sigtimedwait rt_sigtimedwait_time64
    rt_tgsigqueueinfo sched_getaffinity sched_getattr sched_getparam sched_get_priority_max sched_get_priority_min
    sched_getscheduler sched_rr_get_interval sched_rr_get_interval_time64 sched_setaffinity sched_setattr
    sched_setparam sched_setscheduler sched_yield seccomp select semctl semget semop semtimedop semtimedop_time64
    send sendfile sendfile64 sendmmsg sendmsg sendto setfsgid setfsgid32 setfsuid setfsuid32 setgid setgid32
    setgroups setgroups32 setitimer setpgid setpriority setregid setregid32 setresgid setresgid32 setresuid
    setresuid32 setreuid setreuid32 setrlimit set_robust_list setsid setsockopt set_thread_area set_tid_address
    setuid setuid32 setxattr setxattrat shmat shmctl shmdt shmget shutdown sigaltstack signalfd signalfd4
    sigprocmask sigreturn socketcall socketpair splice stat stat64 statfs statfs64 statmount statx symlink symlinkat
    sync sync_file_range syncfs sysinfo tee tgkill time timer_create timer_delete timer_getoverrun timer_gettime
    timer_gettime64 timer_settime timer_settime64 timerfd_create timerfd_gettime timerfd_gettime64 timerfd_settime
    timerfd_settime64 times tkill truncate truncate64 ugetrlimit umask uname unlink unlinkat uretprobe utime
    utimensat utimensat_time64 utimes vfork vmsplice wait4 waitid waitpid write writev
""".split()  # noqa: SIM905 (the list as a block of names, like the profile)
# Refused although Docker allows them: reading or tracing another process (on kernels >= 4.8), and memory
# that no /proc file of a process shows (secret memory: the watchdog could not count it).
STRICTER = ("ptrace", "process_vm_readv", "process_vm_writev", "memfd_secret")
# Shared memory that lives in no file system of the sandbox and whose pages no /proc file shows once the
# process lets go of them: a memfd sent over a unix socket (SCM_RIGHTS) and closed is in no process's descriptor
# table; an anonymous shared mapping's pages leave the process's resident set on madvise(MADV_DONTNEED) or a
# partial munmap and stay allocated (2.4 GiB held over a 1.5 GiB limit). The watchdog could not see either.
UNCOUNTABLE = ("memfd_create", "mmap", "mmap2")
# Kernel memory a submission could take that no /proc file of the sandbox shows: vmsplice pins the user pages it
# splices, and 4 KiB from each 2 MiB transparent huge page pinned the whole page (48 pipes held 1.5 GiB unseen);
# asynchronous I/O contexts take from the host-wide fs.aio-max-nr (io_setup(30000) took it all). Answered ENOSYS,
# which callers take for "fall back" (Python, torch, ipykernel and multiprocessing use neither).
KERNEL_MEMORY = ("vmsplice", "io_setup", "io_submit", "io_cancel", "io_destroy", "io_getevents", "io_pgetevents",
                 "io_pgetevents_time64")
# fcntl(F_SETPIPE_SZ) only up to a pipe's default size: a pipe's buffer is kernel memory the watchdog cannot count.
F_SETPIPE_SZ, PIPE_DEFAULT_BYTES = 1031, 65536
# socket() for the internet families only as TCP or UDP, whose buffers the watchdog counts through sock_diag
# (grader/kernel/memwatch.py): UDP-Lite, SCTP, MPTCP and the rest have buffers it cannot see.
AF_INET, AF_INET6, SOCK_STREAM, SOCK_DGRAM, SOCK_TYPE_MASK = 2, 10, 1, 2, 0xF
IPPROTO_IP, IPPROTO_TCP, IPPROTO_UDP = 0, 6, 17  # with SOCK_STREAM, protocol 0 is TCP; with SOCK_DGRAM, UDP
MAP_SHARED, MAP_ANONYMOUS = 0x01, 0x20  # MAP_SHARED_VALIDATE (0x03) has MAP_SHARED's bit
ARCH_ALLOWED = {  # Docker's per-architecture rules
    "x86_64": ("arch_prctl", "modify_ldt"), "aarch64": ("arm_fadvise64_64", "arm_sync_file_range", "sync_file_range2",
                                                       "breakpoint", "cacheflush", "set_tls"),
    "ppc64le": ("sync_file_range2", "swapcontext"), "s390x": ("s390_pci_mmio_read", "s390_pci_mmio_write",
                                                              "s390_runtime_instr"),
    "riscv64": ("riscv_flush_icache",),
}
CLONE_NAMESPACE_FLAGS = 0x7E020000  # CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
PERSONALITIES = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)  # PER_LINUX, UNAME26, ADDR_NO_RANDOMIZE …, query
AF_UNIX, AF_NETLINK, AF_ALG, AF_VSOCK = 1, 16, 38, 40
NETLINK_ROUTE = 0
PR_SET_DUMPABLE = 4
KEY_CALLS = ("keyctl", "add_key", "request_key")  # never allowed (tested)


_prepared = None


def prepare() -> None:
    """Build the filter now (the fork server, once: about a quarter of a second), for every later `load`."""
    global _prepared
    if _prepared is None:
        _prepared = build()


def load() -> None:
    """Confine this process and every process it starts from now on, for good (about a millisecond)."""
    prepare()
    assert _prepared is not None
    _prepared.load()


def build(network: bool = True):
    """The filter as a pyseccomp.SyscallFilter, ready to `load()` in the process it should confine.

    network=False, for a process that no network namespace confines (grader/platforms/student_kernel.py): socket()
    only for AF_UNIX (the kernel's own sockets are ipc ones) and for NETLINK_ROUTE, which talks to this machine's
    kernel only (zmq lists the network interfaces through it before it binds anything; without it, it aborts).
    """
    import pyseccomp as sc

    flt = sc.SyscallFilter(defaction=sc.ERRNO(errno.EPERM))
    try:  # a binary tree of system call numbers, not a list: a few comparisons per call, not hundreds
        flt.set_attr(sc.Attr.CTL_OPTIMIZE, 2)
    except OSError:
        pass  # libseccomp before 2.5: the list
    refused = (STRICTER + UNCOUNTABLE + KERNEL_MEMORY + ("prctl", "fcntl", "fcntl64")
               + (() if network else ("socketcall",)))  # socketcall: 32-bit x86
    allowed = [name for name in DOCKER_ALLOWED if name not in refused]
    allowed += ARCH_ALLOWED.get(os.uname().machine, ())
    for name in allowed:
        if sc.resolve_syscall(sc.Arch.NATIVE, name) != -1:  # unknown to this libseccomp: stays refused
            flt.add_rule(sc.ALLOW, name)
    flt.add_rule(sc.ALLOW, "clone", sc.Arg(1 if os.uname().machine == "s390x" else 0, sc.MASKED_EQ,
                                           CLONE_NAMESPACE_FLAGS, 0))
    flt.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    flt.add_rule(sc.ERRNO(errno.ENOSYS), "memfd_create")  # ENOSYS: what callers take for "fall back"
    for name in KERNEL_MEMORY:
        if sc.resolve_syscall(sc.Arch.NATIVE, name) != -1:
            flt.add_rule(sc.ERRNO(errno.ENOSYS), name)
    for fcntl in ("fcntl", "fcntl64"):
        if sc.resolve_syscall(sc.Arch.NATIVE, fcntl) != -1:
            flt.add_rule(sc.ALLOW, fcntl, sc.Arg(1, sc.NE, F_SETPIPE_SZ))
            flt.add_rule(sc.ALLOW, fcntl, sc.Arg(1, sc.EQ, F_SETPIPE_SZ), sc.Arg(2, sc.LE, PIPE_DEFAULT_BYTES))
    for mmap in ("mmap", "mmap2"):  # every mapping but an anonymous shared one (flags, the fourth argument)
        if sc.resolve_syscall(sc.Arch.NATIVE, mmap) != -1:
            flt.add_rule(sc.ALLOW, mmap, sc.Arg(3, sc.MASKED_EQ, MAP_ANONYMOUS, 0))
            flt.add_rule(sc.ALLOW, mmap, sc.Arg(3, sc.MASKED_EQ, MAP_SHARED, 0))
    if network:  # AF_UNIX, AF_NETLINK as they were; TCP and UDP over AF_INET and AF_INET6; nothing else
        flt.add_rule(sc.ALLOW, "socket", sc.Arg(0, sc.EQ, AF_UNIX))
        flt.add_rule(sc.ALLOW, "socket", sc.Arg(0, sc.EQ, AF_NETLINK))
        for family in (AF_INET, AF_INET6):
            for kind, protocol in ((SOCK_STREAM, IPPROTO_IP), (SOCK_STREAM, IPPROTO_TCP), (SOCK_DGRAM, IPPROTO_IP),
                                   (SOCK_DGRAM, IPPROTO_UDP)):
                flt.add_rule(sc.ALLOW, "socket", sc.Arg(0, sc.EQ, family),
                             sc.Arg(1, sc.MASKED_EQ, SOCK_TYPE_MASK, kind), sc.Arg(2, sc.EQ, protocol))
    else:
        flt.add_rule(sc.ALLOW, "socket", sc.Arg(0, sc.EQ, AF_UNIX))
        flt.add_rule(sc.ALLOW, "socket", sc.Arg(0, sc.EQ, AF_NETLINK), sc.Arg(2, sc.EQ, NETLINK_ROUTE))
    for value in PERSONALITIES:
        flt.add_rule(sc.ALLOW, "personality", sc.Arg(0, sc.EQ, value))
    flt.add_rule(sc.ALLOW, "prctl", sc.Arg(0, sc.NE, PR_SET_DUMPABLE))
    flt.add_rule(sc.ALLOW, "prctl", sc.Arg(0, sc.EQ, PR_SET_DUMPABLE), sc.Arg(1, sc.EQ, 1))
    return flt
