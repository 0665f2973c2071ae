"""Launch real multi-process PyTorch code from a notebook and watch every rank (notebook 07).

A notebook cannot `mp.spawn` a function it defines: spawn starts fresh interpreters, which look the
function up by name in `__main__` and do not find it. Two ways round that, both here:

- `run_ranks(fn, N)` forks N ranks from this very process (a kernel, a test): each child already has
  `fn`, whatever cell defined it, and the data it uses; it joins a process group (`init_rank`: the
  rank's device set before `init_process_group`), calls `fn()`, and its return value comes back in
  `LaunchResult.values`. Forking is only safe while this process has not initialised CUDA: an nccl
  launch refuses then, with a message, and (by default) runs again with gloo on the CPU.
- `run_ranks(script, N)` and `run_torchrun(script, N)` start a script file: `run_torchrun` with
  `torchrun --standalone --nproc_per_node=N`, `run_ranks` the way torchrun starts ranks on one node
  minus its agent, forked from a helper process with torch imported (labkit.rank_server).

Every launch streams each rank's output into the notebook (`[rank R] ` prefixes), stops every rank
when one fails or the time runs out, and raises `LaunchError` (or, for a rank that hit an unfinished
exercise, `NotImplementedError`). `choose_backend` picks gloo or nccl (`TML_BACKEND` overrides).
"""

from __future__ import annotations

import inspect
import io
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import traceback
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from labkit.rank_server import ForkRefused, PolledChild, RankServer

BACKENDS = ("gloo", "nccl")


class LaunchError(RuntimeError):
    """A launch that failed or ran past its time limit; the message ends with the output tail (notebook 07).

    `summary` is one line saying what went wrong (for a test's feedback).
    """

    def __init__(self, message: str, summary: str = "") -> None:
        super().__init__(message)
        self.summary = summary or message.splitlines()[0]


class RankError(LaunchError):
    """A rank's function raised: which rank, the exception's type name and its message (notebook 07)."""

    def __init__(self, message: str, rank: int, error_type: str, error_message: str) -> None:
        first_line = (error_message.strip().splitlines() or [""])[0]
        super().__init__(message, f"{error_type}: {first_line}" if first_line else error_type)
        self.rank, self.error_type, self.error_message = rank, error_type, error_message


@dataclass(frozen=True)
class LaunchResult:
    """What a finished launch left behind: exit status, everything printed, seconds taken (notebook 07).

    `values[r]` is what rank r's function returned (function launches only); `backend` the process
    group's backend the ranks used ("" when a script chose its own).
    """

    returncode: int
    output: str
    seconds: float
    command: tuple[str, ...]
    values: tuple[Any, ...] = ()
    backend: str = ""

    def lines_from_rank(self, rank: int) -> list[str]:
        """What rank `rank` printed, one entry per line, without the `[rank R] ` prefix (notebook 07)."""
        prefix = f"[rank {rank}] "
        return [line[len(prefix):] for line in self.output.splitlines() if line.startswith(prefix)]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now, chosen by the operating system (notebook 07)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def write_script(source: str, directory: str | os.PathLike[str], name: str = "train_ddp.py") -> Path:
    """Write `source` (dedented) to `directory/name` and return the path (notebook 07)."""
    path = Path(directory) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source).strip("\n") + "\n", encoding="utf-8")
    return path


def function_source(*functions: Callable[..., object]) -> str:
    """The source code of functions (e.g. defined in notebook cells), ready to paste into a script (notebook 07)."""
    parts = []
    for fn in functions:
        try:
            parts.append(textwrap.dedent(inspect.getsource(fn)))
        except (OSError, TypeError) as exc:
            name = getattr(fn, "__name__", repr(fn))
            raise LaunchError(
                f"could not read the source of {name}: define it with `def` in a notebook cell or a file ({exc})"
            ) from None
    return "\n\n".join(parts)


def torchrun_command(
    script: str | os.PathLike[str],
    nproc: int,
    *,
    script_args: Sequence[str] = (),
    nnodes: int = 1,
    node_rank: int = 0,
    master_addr: str | None = None,
    master_port: int | None = None,
    python: str | None = None,
    launcher_flags: Sequence[str] = (),
) -> list[str]:
    """The torchrun command line: `--standalone` on one node, or the explicit multi-node form (notebook 07).

    With one node and no address the launch is `--standalone` (torchrun picks a free port itself).
    Otherwise every node runs the same command with its own `--node_rank`, all pointing at the
    address and port of node 0.
    """
    launcher = [python or sys.executable, "-m", "torch.distributed.run"]
    if nnodes == 1 and master_addr is None:
        launcher += ["--standalone", f"--nproc_per_node={nproc}"]
    else:
        port = master_port if master_port is not None else free_port()
        launcher += [f"--nnodes={nnodes}", f"--nproc_per_node={nproc}", f"--node_rank={node_rank}",
                     f"--master_addr={master_addr or '127.0.0.1'}", f"--master_port={port}"]
    return launcher + [*launcher_flags, str(script), *map(str, script_args)]


_ROLE_PREFIX = re.compile(r"^\[default(\d+)\]:", re.M)
_ROLE_PREFIX_MIDLINE = re.compile(r"\[default(\d+)\]:")
_LAUNCHER_REPORT = re.compile(r"^E\d{4} .*torch/distributed/elastic/.*failed \(exitcode", re.M)


def ranks_output(output: str) -> str:
    """What the ranks printed, without the launcher's own failure report that follows it (notebook 07)."""
    match = _LAUNCHER_REPORT.search(output)
    return output[: match.start()] if match else output


def _tail(text: str, lines: int = 30) -> str:
    return "\n".join(ranks_output(text).rstrip().splitlines()[-lines:])


def _descendants(pid: int) -> list[int]:
    """Every process below `pid` (Linux /proc); torchrun starts each rank in a session of its own."""
    found: list[int] = []
    queue = [pid]
    while queue:
        parent = queue.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                children = Path(f"/proc/{parent}/task/{task}/children").read_text().split()
            except OSError:
                continue
            for child in map(int, children):
                if child not in found:
                    found.append(child)
                    queue.append(child)
    return found


def _signal_groups(pids: list[int], signum: int) -> None:
    for pid in pids:
        try:
            os.killpg(pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


class _Output(Protocol):
    def fileno(self) -> int: ...

    def close(self) -> None: ...


class _Process(Protocol):
    """What a launch uses of a process: a subprocess.Popen, a rank server's child or a _ForkedRank."""

    @property
    def pid(self) -> int: ...

    @property
    def stdout(self) -> _Output | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


def _stop_launch(processes: Sequence[_Process], grace: float = 5.0) -> None:
    """Ask every launched process to stop (SIGTERM; torchrun passes it on to its ranks), then kill what is left."""
    tree = [pid for p in processes for pid in (p.pid, *_descendants(p.pid))]
    _signal_groups(tree, signal.SIGTERM)
    deadline = time.perf_counter() + grace
    for process in processes:
        try:
            process.wait(timeout=max(0.0, deadline - time.perf_counter()))
        except subprocess.TimeoutExpired:
            pass
    _signal_groups(tree + [pid for p in processes for pid in _descendants(p.pid)], signal.SIGKILL)


def rank_environment(rank: int, nproc: int, master_port: int, master_addr: str = "127.0.0.1") -> dict[str, str]:
    """The variables torchrun --standalone gives rank `rank` of `nproc` on one node,
    minus its agent's TORCHELASTIC_* ones (notebook 07)."""
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0", "ROLE_RANK": str(rank),
            "WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc), "ROLE_WORLD_SIZE": str(nproc),
            "GROUP_WORLD_SIZE": "1", "ROLE_NAME": "default", "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port),
            # torchrun's default too: a failed or stuck nccl collective ends the process instead of hanging
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")}


def _child_env(threads_per_process: int, env: Mapping[str, str] | None) -> dict[str, str]:
    full = dict(os.environ)
    full.update({"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(threads_per_process)})
    full.update(env or {})
    return full


def _stream(processes: Sequence[_Process], label: Callable[[int, str], str], timeout: float,
            echo: bool, stop_on_failure: bool) -> tuple[str, bool, list[int]]:
    """Collect the processes' output line by line, each line passed through `label(index, line)`.

    Returns everything printed, whether the time ran out, and the processes' indices in the order
    their output closed (the order they exited in). With `stop_on_failure`, the first
    process to exit non-zero stops the others, as torchrun's agent does: a rank left waiting in
    a collective for a dead peer would otherwise hang until the timeout.
    """
    start = time.perf_counter()
    readers = {p.stdout.fileno(): i for i, p in enumerate(processes) if p.stdout is not None}
    pending = {fd: "" for fd in readers}
    lines: list[str] = []
    closed: list[int] = []
    timed_out = False

    def emit(text: str) -> None:
        lines.append(text)
        if echo:
            sys.stdout.write(text)
            sys.stdout.flush()

    try:
        while readers:
            left = timeout - (time.perf_counter() - start)
            if left <= 0:
                timed_out = True
                break
            if stop_on_failure and any(p.poll() not in (None, 0) for p in processes):
                _stop_launch([p for p in processes if p.poll() is None], grace=1.0)
            ready, _, _ = select.select(list(readers), [], [], min(left, 0.5))
            for fd in ready:
                data = os.read(fd, 65536)
                if not data:
                    if pending[fd]:
                        emit(label(readers[fd], pending[fd]) + "\n")
                    closed.append(readers.pop(fd))
                    continue
                pending[fd] += data.decode("utf-8", errors="replace")
                *complete, pending[fd] = pending[fd].split("\n")
                if complete:
                    emit("".join(label(readers[fd], line) + "\n" for line in complete))
    except KeyboardInterrupt:  # Jupyter's interrupt reaches this kernel only: stop the ranks too
        _stop_launch(processes, grace=1.0)
        raise
    try:  # every output closed; a process may still be running
        for process in processes:
            process.wait(timeout=0 if timed_out else max(0.0, timeout - (time.perf_counter() - start)))
    except subprocess.TimeoutExpired:
        timed_out = True
        _stop_launch(processes)
    for process in processes:
        process.wait()
        if process.stdout is not None:
            process.stdout.close()
    return "".join(lines), timed_out, closed


def _finish(what: str, returncode: int, output: str, timed_out: bool, seconds: float, command: list[str],
            check: bool, timeout: float, tail_of: str | None = None, backend: str = "") -> LaunchResult:
    """The result, or with `check` a LaunchError ending with the last lines of `tail_of` (default: all output)."""
    tail = _tail(output if tail_of is None else tail_of)
    if check and timed_out:
        raise LaunchError(f"{what} ran past {timeout:.0f} s and was stopped; last output:\n{tail}",
                          f"{what} ran past {timeout:.0f} s and was stopped")
    if check and returncode != 0:
        raise LaunchError(f"{what} exited with status {returncode}; last output:\n{tail}",
                          f"{what} exited with status {returncode}")
    return LaunchResult(returncode, output, seconds, tuple(command), backend=backend)


def run_torchrun(
    script: str | os.PathLike[str],
    nproc: int = 2,
    *,
    script_args: Sequence[str] = (),
    timeout: float = 60.0,
    env: Mapping[str, str] | None = None,
    echo: bool = True,
    check: bool = True,
    threads_per_process: int = 1,
) -> LaunchResult:
    """Run `script` on `nproc` local processes with torchrun, streaming their output as it arrives (notebook 07).

    torchrun tees each rank's stdout and stderr line by line (`--tee 3`), so lines of two ranks
    never mix; each line is shown with the prefix `[rank R] `. The launcher starts in a session of
    its own, so on timeout it and all its ranks are stopped together. With `check` a non-zero exit
    or a timeout raises `LaunchError` whose message ends with the last lines printed.
    """
    logs = tempfile.TemporaryDirectory(prefix="torchrun-logs-")
    command = torchrun_command(script, nproc, script_args=script_args,
                               launcher_flags=["--tee", "3", "--log-dir", logs.name])
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               env=_child_env(threads_per_process, env),
                               cwd=str(Path(script).resolve().parent), start_new_session=True)

    def label(_: int, line: str) -> str:
        # A line a rank left unfinished (a progress bar's carriage returns) ends where the next prefix starts.
        return _ROLE_PREFIX_MIDLINE.sub(r"\n[rank \1] ", _ROLE_PREFIX.sub(r"[rank \1] ", line)).lstrip("\n")

    output, timed_out, _ = _stream([process], label, timeout, echo, stop_on_failure=False)
    logs.cleanup()
    return _finish("torchrun", process.returncode, output, timed_out, time.perf_counter() - start, command,
                   check, timeout)



# --- which backend, and the per-rank set-up --------------------------------------------------------------

def choose_backend(nproc: int = 2) -> str:
    """gloo or nccl for `nproc` ranks on this machine; the environment variable TML_BACKEND overrides (notebook 07).

    nccl needs a GPU per rank: it is chosen when nccl is built in and at least `nproc` GPUs are visible.
    `torch.cuda.device_count()` asks NVML, so choosing does not initialise CUDA in this process.
    """
    forced = os.environ.get("TML_BACKEND", "").strip().lower()
    if forced:
        if forced not in BACKENDS:
            raise ValueError(f"TML_BACKEND must be one of {', '.join(BACKENDS)}, not {forced!r}")
        return forced
    import torch
    import torch.distributed as dist

    return "nccl" if dist.is_nccl_available() and torch.cuda.device_count() >= nproc else "gloo"


def init_rank(backend: str | None = None, timeout_s: float = 60.0):
    """Inside a rank: choose its device, set it BEFORE joining, join the process group; returns the device (notebook 07).

    The backend is `backend`, else the TML_BACKEND the launcher passed, else gloo. Under nccl the rank
    uses `cuda:LOCAL_RANK`, made current with `torch.cuda.set_device` and bound with `device_id=` so
    that nccl never guesses the GPU; under gloo the CPU. Collectives give up after `timeout_s` seconds
    instead of torch's default of many minutes.
    """
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    backend = backend or os.environ.get("TML_BACKEND") or "gloo"
    timeout = timedelta(seconds=timeout_s)
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", timeout=timeout, device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group(backend, timeout=timeout)
    return device


def rank_device():
    """This rank's device: `cuda:LOCAL_RANK` when its process group runs nccl, else the CPU (notebook 07)."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


# --- launching ranks ---------------------------------------------------------------------------------------

_RANK_SERVER: RankServer | None = None


def start_rank_server() -> RankServer:
    """Start this kernel's rank server (it imports torch in the background) unless it runs already (notebook 07)."""
    global _RANK_SERVER
    if _RANK_SERVER is None or not _RANK_SERVER.alive():
        _RANK_SERVER = RankServer()
    return _RANK_SERVER


def run_ranks(
    target: Callable[..., Any] | str | os.PathLike[str],
    nproc: int = 2,
    *,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    script_args: Sequence[str] = (),
    backend: str | None = None,
    fallback: str | None = "gloo",
    init: bool = True,
    timeout: float = 60.0,
    env: Mapping[str, str] | None = None,
    echo: bool = True,
    check: bool = True,
    threads_per_process: int = 1,
    fork: bool | None = None,
) -> LaunchResult:
    """Run `target` as ranks 0..nproc-1 on this machine, as torchrun --standalone would, and stream their output (notebook 07).

    `target` is a function or a script file. A function runs in `nproc` processes forked from this one
    (os.fork: Linux, macOS), each already in a process group of `backend` (default: `choose_backend(nproc)`)
    with its device set (`init_rank`; with `init=False` the function joins a group itself); it is called
    as `target(*args, **kwargs)` and what each rank returns comes back in the result's `values`. A script
    runs as `python script *script_args` with the variables torchrun sets and `TML_BACKEND`; it joins
    the group itself (`init_rank()`). On Linux (`fork` None or True) a script's ranks are forked from
    the kernel's rank server, whose torch is imported already; with `fork=False`, or elsewhere, each is
    a fresh interpreter.

    When one rank fails the others are stopped; on timeout every rank is. A rank that stops at an
    unfinished exercise raises NotImplementedError here; any other failure raises LaunchError (RankError
    when a function raised), unless `check` is False. An nccl launch that fails is tried again with
    `fallback` (gloo on the CPU) after saying why; `fallback=None` raises instead.
    """
    backend = backend or choose_backend(nproc)
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
    options: dict[str, Any] = dict(timeout=timeout, env=env, echo=echo, check=check, threads_per_process=threads_per_process)
    launch: Callable[[str], LaunchResult]
    if callable(target):
        launch = lambda chosen: _run_function(target, nproc, tuple(args), dict(kwargs or {}), chosen, init,  # noqa: E731
                                              **options)
    else:
        launch = lambda chosen: _run_script(target, nproc, script_args, chosen, fork=fork, **options)  # noqa: E731
    if backend != "nccl" or not fallback or fallback == backend:
        return launch(backend)
    try:
        return launch(backend)
    except LaunchError as failure:
        print(f"The nccl launch failed ({failure.summary}); running it again with {fallback} on the CPU.", flush=True)
        return launch(fallback)


def _run_script(script: str | os.PathLike[str], nproc: int, script_args: Sequence[str], backend: str, *,
                timeout: float, env: Mapping[str, str] | None, echo: bool, check: bool, threads_per_process: int,
                fork: bool | None) -> LaunchResult:
    port = free_port()
    command = [sys.executable, str(script), *map(str, script_args)]
    envs = [_child_env(threads_per_process, {**rank_environment(rank, nproc, port), "TML_BACKEND": backend,
                                             **(env or {})})
            for rank in range(nproc)]
    cwd = str(Path(script).resolve().parent)
    start = time.perf_counter()
    processes: list = []
    if fork or (fork is None and sys.platform == "linux"):
        try:
            processes = start_rank_server().start(command[1:], envs, cwd)
        except ForkRefused as refusal:
            print(f"Starting the ranks as fresh interpreters instead: {refusal}", flush=True)
    if not processes:
        processes = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=rank_env, cwd=cwd,
                                      start_new_session=True) for rank_env in envs]
    output, timed_out, closed = _stream(processes, _rank_label, timeout, echo, stop_on_failure=True)
    seconds = time.perf_counter() - start
    codes = [p.returncode for p in processes]
    culprit = _culprit(codes, closed)
    if timed_out or culprit is None:
        return _finish("the ranks", codes[culprit] if culprit is not None else 0, output, timed_out, seconds, command,
                       check, timeout, backend=backend)
    own = "\n".join(line for line in output.splitlines() if line.startswith(f"[rank {culprit}] "))
    if check and _ends_in_not_implemented(own):
        raise NotImplementedError(f"rank {culprit} stopped at an unfinished exercise:\n{_tail(own)}")
    return _finish(f"rank {culprit}", codes[culprit], output, timed_out, seconds, command, check, timeout,
                   tail_of=own, backend=backend)


def _rank_label(rank: int, line: str) -> str:
    # A progress bar redraws with carriage returns: show each state on its own line.
    return "\n".join(f"[rank {rank}] {part}" for part in line.split("\r") if part.strip()) or f"[rank {rank}] "


def _culprit(codes: list[int | None], closed: list[int]) -> int | None:
    """The rank whose failure explains the launch's: its peers then fail too (a broken connection) or are
    stopped (negative codes). Ranks are taken in the order they exited."""
    order = closed + [i for i in range(len(codes)) if i not in closed]
    failed = [i for i in order if (codes[i] or 0) > 0] or [i for i in order if codes[i] != 0]
    return failed[0] if failed else None


_NOT_IMPLEMENTED_LINE = re.compile(r"^\[rank \d+\] NotImplementedError(?::.*)?\s*$", re.M)


def _ends_in_not_implemented(rank_output: str) -> bool:
    return bool(_NOT_IMPLEMENTED_LINE.search(rank_output))


# --- function launches: ranks forked from this process -----------------------------------------------------

class _ForkedRank(PolledChild):
    """A child of os.fork with the parts of `subprocess.Popen` a launch uses."""

    def __init__(self, pid: int, stdout: io.RawIOBase) -> None:
        self.pid, self.stdout = pid, stdout
        self.returncode = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: its exit status is lost
                self.returncode = -1
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


_PRELOADED = False


def _preload() -> None:
    """Import, once, what every rank would otherwise import on its own (DDP's first use imports torch._dynamo)."""
    global _PRELOADED
    if not _PRELOADED:
        # Should an import ask torch.cuda.is_available(), let it ask NVML: the CUDA runtime's own check initialises
        # the driver in this process, after which forked ranks could not use the GPU.
        saved = os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK")
        os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
        try:
            import torch._dynamo
            import torch.distributed
            import torch.nn.parallel  # noqa: F401
        finally:
            if saved is None:
                os.environ.pop("PYTORCH_NVML_BASED_CUDA_CHECK", None)
            else:
                os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = saved
        _PRELOADED = True


def _run_function(fn: Callable[..., Any], nproc: int, args: tuple, kwargs: dict, backend: str, init: bool, *,
                  timeout: float, env: Mapping[str, str] | None, echo: bool, check: bool,
                  threads_per_process: int) -> LaunchResult:
    import torch

    if not hasattr(os, "fork"):
        raise LaunchError("run_ranks(function) forks the ranks from this process, which this platform cannot do: "
                          "use Linux (or WSL) or macOS", "this platform cannot fork")
    why_not = _nccl_impossible(nproc) if backend == "nccl" else ""
    if why_not:
        raise LaunchError(why_not, why_not)
    if backend == "nccl" and torch.cuda.is_initialized():
        raise LaunchError(
            "CUDA is already initialised in this process, and a process forked from it cannot use CUDA, so the "
            "nccl ranks cannot start. Restart the kernel and run the notebook from the top without touching the "
            "GPU before this cell (or set TML_BACKEND=gloo).", "CUDA was initialised in this process before the fork")
    _preload()
    port = free_port()
    folder = Path(tempfile.mkdtemp(prefix="tml-ranks-"))
    name = getattr(fn, "__qualname__", repr(fn))
    command = [f"{name}()", f"on {nproc} ranks forked from process {os.getpid()}", backend]
    start = time.perf_counter()
    ranks: list[_ForkedRank] = []
    try:
        for rank in range(nproc):
            rank_env = {**rank_environment(rank, nproc, port), "TML_BACKEND": backend, "PYTHONUNBUFFERED": "1",
                        "OMP_NUM_THREADS": str(threads_per_process), **(env or {})}
            ranks.append(_fork_rank(fn, args, kwargs, backend if init else "", rank_env, threads_per_process,
                                    folder / f"rank{rank}.pt", timeout, [r.stdout.fileno() for r in ranks]))
        output, timed_out, closed = _stream(ranks, _rank_label, timeout, echo, stop_on_failure=True)
        seconds = time.perf_counter() - start
        records = [_read_record(folder / f"rank{rank}.pt") for rank in range(nproc)]
    finally:
        for rank_process in ranks:
            if rank_process.poll() is None:
                _stop_launch(ranks, grace=1.0)
                break
        for rank_process in ranks:
            rank_process.stdout.close()
        shutil.rmtree(folder, ignore_errors=True)
    codes = [r.returncode for r in ranks]
    culprit = _culprit(codes, closed)
    if timed_out or culprit is None:
        result = _finish("the ranks", 0 if culprit is None else codes[culprit], output, timed_out, seconds,  # type: ignore[arg-type]
                         command, check, timeout, backend=backend)
        return LaunchResult(result.returncode, output, seconds, tuple(command),
                            tuple(r.get("value") if r else None for r in records), backend)
    record = records[culprit] or {}
    own = "\n".join(line for line in output.splitlines() if line.startswith(f"[rank {culprit}] "))
    if check and record.get("error") == "NotImplementedError":
        raise NotImplementedError(f"rank {culprit}: {record.get('message') or 'an unfinished exercise'}") from None
    if check and record.get("error"):
        raise RankError(f"rank {culprit} raised {record['error']}: {record.get('message', '')}\nlast output:\n{_tail(own)}",
                        culprit, record["error"], record.get("message", ""))
    result = _finish(f"rank {culprit}", codes[culprit], output, timed_out, seconds, command, check, timeout,  # type: ignore[arg-type]
                     tail_of=own, backend=backend)
    return LaunchResult(result.returncode, output, seconds, tuple(command),
                        tuple(r.get("value") if r else None for r in records), backend)


def _nccl_impossible(nproc: int) -> str:
    """Why nccl cannot run `nproc` ranks here ('' when it can): it needs nccl built in and a GPU per rank."""
    import torch
    import torch.distributed as dist

    if not dist.is_nccl_available():
        return "this torch build has no nccl"
    gpus = torch.cuda.device_count()
    return "" if gpus >= nproc else f"nccl needs a GPU per rank: {nproc} ranks, {gpus} GPU(s) visible"


def _read_record(path: Path) -> dict | None:
    import torch

    try:
        return torch.load(path, weights_only=False)
    except Exception:
        return None


def _fork_rank(fn: Callable[..., Any], args: tuple, kwargs: dict, backend: str, env: dict[str, str], threads: int,
               record_path: Path, timeout: float, inherited: list[int]) -> _ForkedRank:
    """Fork one rank: it joins a `backend` process group (none when ''), runs `fn`, saves {"value"} or
    {"error", "message"}, and exits."""
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # Python 3.12+: fork with threads (the kernel's) running
        pid = os.fork()
    if pid == 0:  # the rank; it never returns from here
        _become_forked_rank(fn, args, kwargs, backend, env, threads, record_path, timeout,
                            [read_end, *inherited], write_end)
    os.close(write_end)
    return _ForkedRank(pid, os.fdopen(read_end, "rb", buffering=0))


def _leave_together(timeout: float) -> None:
    """Leave the process group; rank 0, which hosts the group's store, waits until every other rank has left.

    A rank whose function ends without a last collective may still need rank 0's store (to join or to
    leave the group) after rank 0's function has returned: rank 0 must not exit before it.
    """
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    from torch.distributed.distributed_c10d import _get_default_store

    store, rank, world = _get_default_store(), dist.get_rank(), dist.get_world_size()
    dist.destroy_process_group()
    if rank != 0:
        store.add("tml/left", 1)
        return
    deadline = time.monotonic() + timeout
    while store.add("tml/left", 0) < world - 1 and time.monotonic() < deadline:
        time.sleep(0.005)


def _become_forked_rank(fn: Callable[..., Any], args: tuple, kwargs: dict, backend: str, env: dict[str, str],
                        threads: int, record_path: Path, timeout: float, close: list[int], output: int) -> None:
    code, record = 1, {"error": "SystemExit", "message": "the rank stopped before it finished"}
    try:
        os.setsid()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        for fd in close:
            os.close(fd)
        os.dup2(output, 1)
        os.dup2(output, 2)
        os.close(output)
        # A kernel's sys.stdout sends to Jupyter through threads this child does not have: write to the pipe.
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True, write_through=True)
        sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True, write_through=True)
        os.environ.update(env)
        import torch

        torch.set_num_threads(threads)
        if backend:
            init_rank(backend, timeout_s=max(5.0, timeout))
        value = fn(*args, **kwargs)
        record, code = {"value": value}, 0
        _leave_together(timeout)
    except BaseException as exc:
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
            tb = tb.tb_next  # the launcher's own frames are not the rank's code
        message = str(exc)[:2000]
        if isinstance(exc, NotImplementedError) and tb is not None:
            where = traceback.extract_tb(tb)[-1].name  # a stub: its name says enough
            message = message or f"{where}() is not written yet"
            print(f"NotImplementedError: {message}", file=sys.stderr)
        else:
            traceback.print_exception(type(exc), exc, tb or exc.__traceback__)
        record = {"error": type(exc).__name__, "message": message}
    finally:
        try:
            import torch

            torch.save(record, record_path)
        except Exception:
            traceback.print_exc()
            code = code or 1
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
