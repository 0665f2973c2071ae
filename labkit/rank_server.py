"""Fork the ranks of a launch from a process that has torch imported already (behind helpers.distributed.run_ranks).

A fresh Python needs seconds to import torch, and DDP's first construction imports torch._dynamo
for seconds more; on a small CPU that is most of a short launch. `RankServer` starts one helper
process per kernel (`python -m labkit.rank_server FD`) that does those imports once and then
forks every rank of every launch: each rank is a new process with its own environment, working
folder, standard output and process group, running the script as `__main__` — only its imports
are already done. Linux only (fork after importing torch is not safe on macOS). A process whose CUDA
driver is initialised cannot hand CUDA on to a forked child; the server never touches CUDA, and should
that ever change, it refuses to fork (`ForkRefused`, found by `cuda_fork_poisoned`) and the launcher
starts fresh interpreters instead.
"""

from __future__ import annotations

import io
import json
import os
import runpy
import signal
import socket
import subprocess
import sys
import time
import traceback
import warnings
from collections.abc import Mapping, Sequence
from typing import IO, cast

# What the ranks of the course's scripts import; DDP pulls in torch._dynamo on first use.
PRELOAD = ("torch", "torch.nn", "torch.distributed", "torch.nn.parallel", "torch._dynamo", "torch.utils.data",
           "torch.distributed.fsdp", "torch.distributed.algorithms.ddp_comm_hooks", "tqdm")


class ForkRefused(RuntimeError):
    """The server will not fork ranks (CUDA is initialised in it); the launcher starts fresh interpreters (notebook 07)."""


def cuda_fork_poisoned() -> bool:
    """True when a process forked from this one now could not use CUDA (notebook 07).

    `torch.cuda.is_initialized()` is not the signal: `torch.cuda.is_available()` (without
    PYTORCH_NVML_BASED_CUDA_CHECK=1) initialises the CUDA driver in the process and leaves that flag False,
    yet torch then refuses CUDA to every child forked afterwards. So ask a child: fork one, let it read
    torch's own verdict (`torch.cuda._is_in_bad_fork()`), and exit. False when torch is not imported here.
    """
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(os, "fork"):
        return False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # Python 3.12+: fork with threads running
        pid = os.fork()
    if pid == 0:  # the child: answer and leave at once, running nothing of the parent's
        os._exit(1 if torch.cuda._is_in_bad_fork() else 0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 1


def fork_refusal() -> str:
    """Why forking ranks from this process would break them ('' when it is safe) (notebook 07)."""
    if cuda_fork_poisoned():
        return "CUDA's driver is initialised in the rank server, and a forked child could not use it"
    return ""


class PolledChild:
    """A process that is not our `subprocess.Popen` child, waited for by polling (notebook 07's forked ranks)."""

    pid: int
    returncode: int | None = None

    def poll(self) -> int | None:
        raise NotImplementedError

    def _pause(self) -> None:
        """Between two polls: wait a little for news of an exit."""
        time.sleep(0.01)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0)
            self._pause()
        return code


class ForkedRank(PolledChild):
    """A rank forked by the server, with the parts of `subprocess.Popen` a launch uses (notebook 07)."""

    def __init__(self, server: RankServer, pid: int, stdout: IO[bytes]) -> None:
        self.server, self.pid, self.stdout = server, pid, stdout
        self.returncode = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.server.collect_exits(block=False)
        return self.returncode

    def _pause(self) -> None:
        self.server.collect_exits(block=True, timeout=0.05)


class RankServer:
    """The kernel's side of the helper process: start it, ask it for ranks, hear when they exit (notebook 07).

    The helper exits when the kernel does: its end of the socket pair closes.
    """

    def __init__(self) -> None:
        self.channel, theirs = socket.socketpair()
        self.process = subprocess.Popen([sys.executable, "-m", "labkit.rank_server", str(theirs.fileno())],
                                        pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                                        env={**os.environ, "OMP_NUM_THREADS": "1"})
        theirs.close()
        self.ranks: dict[int, ForkedRank] = {}
        self.buffer = b""

    def alive(self) -> bool:
        return self.process.poll() is None

    def start(self, argv: Sequence[str], envs: Sequence[Mapping[str, str]], cwd: str) -> list[ForkedRank]:
        """Fork one rank per environment in `envs`, each running `argv` (script and arguments) in `cwd`."""
        pipes = [os.pipe() for _ in envs]
        request = json.dumps({"argv": list(argv), "envs": [dict(e) for e in envs], "cwd": cwd}).encode() + b"\n"
        socket.send_fds(self.channel, [request], [w for _, w in pipes])
        for _, w in pipes:
            os.close(w)
        answer = json.loads(self._line())
        if "refused" in answer:
            for r, _ in pipes:
                os.close(r)
            raise ForkRefused(answer["refused"])
        pids = answer["pids"]
        started = [ForkedRank(self, pid, os.fdopen(r, "rb", buffering=0)) for pid, (r, _) in zip(pids, pipes)]
        self.ranks.update({rank.pid: rank for rank in started})
        return started

    def _line(self, timeout: float | None = None) -> bytes:
        """The server's next message (waits for it up to `timeout`; b'' when none came)."""
        self.channel.settimeout(timeout)
        try:
            while b"\n" not in self.buffer:
                data = self.channel.recv(65536)
                if not data:
                    raise ConnectionError("the rank server stopped")
                self.buffer += data
        except (TimeoutError, BlockingIOError):
            return b""
        finally:
            self.channel.settimeout(None)
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line

    def collect_exits(self, block: bool, timeout: float = 0.0) -> None:
        """Record the exit codes the server has reported."""
        while line := self._line(timeout if block else 0.0):
            message = json.loads(line)
            rank = self.ranks.pop(message["exit"], None)
            if rank is not None:
                rank.returncode = message["code"]
            block = False


def _become_rank(argv: list[str], env: dict[str, str], cwd: str, output: int) -> None:
    """In the forked child: own session, environment, folder and output, then the script as __main__."""
    code = 1
    try:
        os.setsid()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.dup2(output, 1)
        os.dup2(output, 2)
        os.close(output)
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        if "torch" in sys.modules:  # OpenMP read OMP_NUM_THREADS when the server loaded torch
            sys.modules["torch"].set_num_threads(int(env.get("OMP_NUM_THREADS", "1")))
        # typeshed's TextIO has no reconfigure; an interpreter's own stdout and stderr are TextIOWrappers
        cast(io.TextIOWrapper, sys.stdout).reconfigure(line_buffering=True, write_through=True)
        cast(io.TextIOWrapper, sys.stderr).reconfigure(line_buffering=True, write_through=True)
        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        runpy.run_path(argv[0], run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException as exc:
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != argv[0]:
            tb = tb.tb_next  # this module's and runpy's frames are not the script's
        traceback.print_exception(type(exc), exc, tb or exc.__traceback__)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve(channel: socket.socket) -> None:
    """Fork the ranks of each request; report their PIDs, then each exit code."""
    running: set[int] = set()
    while True:
        message, fds, _, _ = socket.recv_fds(channel, 1 << 20, 64)
        if not message:
            return
        request = json.loads(message)
        refusal = fork_refusal()
        if refusal:
            for fd in fds:
                os.close(fd)
            channel.sendall(json.dumps({"refused": refusal}).encode() + b"\n")
            continue
        pids = []
        for env, output in zip(request["envs"], fds):
            pid = os.fork()
            if pid == 0:
                channel.close()
                for other in fds:
                    if other != output:
                        os.close(other)
                _become_rank(request["argv"], env, request["cwd"], output)
            pids.append(pid)
        for fd in fds:
            os.close(fd)
        running.update(pids)
        channel.sendall(json.dumps({"pids": pids}).encode() + b"\n")
        while running:  # one launch at a time: run_ranks waits for every rank
            pid, status = os.wait()
            if pid in running:
                running.discard(pid)
                channel.sendall(json.dumps({"exit": pid, "code": os.waitstatus_to_exitcode(status)}).encode() + b"\n")


def main() -> None:
    channel = socket.socket(fileno=int(sys.argv[1]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Jupyter's interrupt is for the ranks, not for the server
    # An import that asks torch.cuda.is_available() must ask NVML: the CUDA runtime's own check would initialise
    # the driver here, and no forked rank could use a GPU after that. Each rank gets its own environment.
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    for name in PRELOAD:
        try:
            __import__(name)
        except ImportError:
            pass
    serve(channel)


if __name__ == "__main__":
    main()
