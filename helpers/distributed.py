"""Launch real multi-process PyTorch code from a notebook and watch every rank (notebook 07).

A notebook cannot `mp.spawn` a function it defines (the child processes cannot unpickle it from
`__main__`), so the course writes the training code to a script and starts it as separate
processes: `run_torchrun` with `torchrun --standalone --nproc_per_node=N script.py`, and
`run_ranks` the way torchrun starts them on one node, minus its agent (no elastic restarts, and
none of the seconds torchrun spends importing torch before it starts a rank). Both stream the
output of every rank into the notebook while it runs, stop every process after a timeout, and hand
back what was printed. `function_source` copies functions defined in the notebook into a script.
"""

from __future__ import annotations

import inspect
import re
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from helpers.rank_server import RankServer


class LaunchError(RuntimeError):
    """A launch that failed or ran past its time limit; the message ends with the output tail (notebook 07)."""


@dataclass(frozen=True)
class LaunchResult:
    """What a finished launch left behind: exit status, everything printed, seconds taken (notebook 07)."""

    returncode: int
    output: str
    seconds: float
    command: tuple[str, ...]

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


def _stop_launch(processes: list[subprocess.Popen[bytes]], grace: float = 5.0) -> None:
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
    """The variables torchrun --standalone gives rank `rank` of `nproc` on one node, minus its agent's TORCHELASTIC_* ones (notebook 07)."""
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0", "ROLE_RANK": str(rank),
            "WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc), "ROLE_WORLD_SIZE": str(nproc),
            "GROUP_WORLD_SIZE": "1", "ROLE_NAME": "default", "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port)}


def _child_env(threads_per_process: int, env: Mapping[str, str] | None) -> dict[str, str]:
    full = dict(os.environ)
    full.update({"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(threads_per_process)})
    full.update(env or {})
    return full


def _stream(processes: list[subprocess.Popen[bytes]], label: Callable[[int, str], str], timeout: float,
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
            check: bool, timeout: float, tail_of: str | None = None) -> LaunchResult:
    """The result, or with `check` a LaunchError ending with the last lines of `tail_of` (default: all output)."""
    tail = _tail(output if tail_of is None else tail_of)
    if check and timed_out:
        raise LaunchError(f"{what} ran past {timeout:.0f} s and was stopped; last output:\n{tail}")
    if check and returncode != 0:
        raise LaunchError(f"{what} exited with status {returncode}; last output:\n{tail}")
    return LaunchResult(returncode, output, seconds, tuple(command))


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


_RANK_SERVER: RankServer | None = None


def start_rank_server() -> RankServer:
    """Start this kernel's rank server (it imports torch in the background) unless it runs already (notebook 07)."""
    global _RANK_SERVER
    if _RANK_SERVER is None or not _RANK_SERVER.alive():
        _RANK_SERVER = RankServer()
    return _RANK_SERVER


def run_ranks(
    script: str | os.PathLike[str],
    nproc: int = 2,
    *,
    script_args: Sequence[str] = (),
    timeout: float = 60.0,
    env: Mapping[str, str] | None = None,
    echo: bool = True,
    check: bool = True,
    threads_per_process: int = 1,
    fork: bool | None = None,
) -> LaunchResult:
    """Start `script` as ranks 0..nproc-1 on this machine, as torchrun --standalone would, and stream their output (notebook 07).

    Each rank runs `python script` with `rank_environment`'s variables; rank 0 hosts the rendezvous
    store at MASTER_PORT (`init_process_group`'s default env:// method). On Linux (`fork` None or
    True) the ranks are forked from the kernel's rank server, whose torch is imported already (see
    helpers.rank_server); with `fork=False`, or elsewhere, each is a fresh interpreter. Lines are
    shown as `[rank R] …`. When one rank fails the others are stopped; on timeout every rank is.
    The other arguments and the result are those of `run_torchrun`.
    """
    port = free_port()
    command = [sys.executable, str(script), *map(str, script_args)]
    envs = [_child_env(threads_per_process, {**rank_environment(rank, nproc, port), **(env or {})})
            for rank in range(nproc)]
    cwd = str(Path(script).resolve().parent)
    start = time.perf_counter()
    processes: list = (
        start_rank_server().start(command[1:], envs, cwd) if fork or (fork is None and sys.platform == "linux")
        else [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=rank_env, cwd=cwd,
                               start_new_session=True) for rank_env in envs]
    )

    def label(rank: int, line: str) -> str:
        # A progress bar redraws with carriage returns: show each state on its own line.
        return "\n".join(f"[rank {rank}] {part}" for part in line.split("\r") if part.strip()) or f"[rank {rank}] "

    output, timed_out, closed = _stream(processes, label, timeout, echo, stop_on_failure=True)
    seconds = time.perf_counter() - start
    codes = [p.returncode for p in processes]
    # The rank that failed first explains the failure: its peers then fail too (a broken connection) or are
    # stopped (negative codes). Ranks are taken in the order they exited.
    order = closed + [i for i in range(len(processes)) if i not in closed]
    failed = [i for i in order if codes[i] > 0] or [i for i in order if codes[i] != 0]
    if timed_out or not failed:
        return _finish("the ranks", codes[failed[0]] if failed else 0, output, timed_out, seconds, command, check,
                       timeout)
    culprit = failed[0]
    # The failing rank's own lines explain the failure; its peers only report the broken connection.
    own = "\n".join(line for line in output.splitlines() if line.startswith(f"[rank {culprit}] "))
    return _finish(f"rank {culprit}", codes[culprit], output, timed_out, seconds, command, check, timeout,
                   tail_of=own)
