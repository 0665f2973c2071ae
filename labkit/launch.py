"""What every launch of ranks shares: stream their output, stop them together, report the outcome (notebook 07).

Behind `helpers.distributed.run_ranks` and `run_torchrun`: whatever started the processes (torchrun, the
rank server, a fork of this process), `stream` collects their output line by line into the notebook,
`stop_launch` ends a process and everything it started, and `finish` turns the outcome into a
`LaunchResult` or a `LaunchError` whose message ends with the last lines printed.
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

# Launches in this process stopped at their time limit so far: the grader reads it around each hidden scenario
# (grader/kernel/probe.py), so that a known mistake recorded on a busy machine is recorded again, not kept.
launches_timed_out = 0


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

    `values[r]` is what rank r's function returned, its tensors on the CPU (function launches only); `backend` the process
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


_LAUNCHER_REPORT = re.compile(r"^E\d{4} .*torch/distributed/elastic/.*failed \(exitcode", re.M)
_NOT_IMPLEMENTED_LINE = re.compile(r"^\[rank \d+\] NotImplementedError(?::.*)?\s*$", re.M)


def ranks_output(output: str) -> str:
    """What the ranks printed, without torchrun's own failure report that follows it (notebook 07)."""
    match = _LAUNCHER_REPORT.search(output)
    return output[: match.start()] if match else output


def tail(text: str, lines: int = 30) -> str:
    """The last `lines` lines the ranks printed (notebook 07)."""
    return "\n".join(ranks_output(text).rstrip().splitlines()[-lines:])


def rank_label(rank: int, line: str) -> str:
    """A line of rank `rank`'s output as the notebook shows it: `[rank R] ` first (notebook 07).

    A progress bar redraws with carriage returns: each state gets its own line.
    """
    return "\n".join(f"[rank {rank}] {part}" for part in line.split("\r") if part.strip()) or f"[rank {rank}] "


def own_lines(output: str, rank: int) -> str:
    """The lines of `output` that rank `rank` printed, prefixes kept (notebook 07)."""
    return "\n".join(line for line in output.splitlines() if line.startswith(f"[rank {rank}] "))


def ends_in_not_implemented(rank_output: str) -> bool:
    """True when a rank stopped at an exercise stub: its output names a NotImplementedError (notebook 07)."""
    return bool(_NOT_IMPLEMENTED_LINE.search(rank_output))


def child_env(threads_per_process: int, env: Mapping[str, str] | None) -> dict[str, str]:
    """This process's environment for a launched process: unbuffered output, `threads_per_process` threads (notebook 07)."""
    full = dict(os.environ)
    full.update({"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(threads_per_process)})
    full.update(env or {})
    return full


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


class Output(Protocol):
    def fileno(self) -> int: ...

    def close(self) -> None: ...


class Process(Protocol):
    """What a launch uses of a process: a subprocess.Popen, a rank server's child or a forked rank."""

    @property
    def pid(self) -> int: ...

    @property
    def stdout(self) -> Output | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


def stop_launch(processes: Sequence[Process], grace: float = 5.0) -> None:
    """Ask every launched process to stop (SIGTERM; torchrun passes it on to its ranks), then kill what is left (notebook 07)."""
    tree = [pid for p in processes for pid in (p.pid, *_descendants(p.pid))]
    _signal_groups(tree, signal.SIGTERM)
    deadline = time.perf_counter() + grace
    for process in processes:
        try:
            process.wait(timeout=max(0.0, deadline - time.perf_counter()))
        except subprocess.TimeoutExpired:
            pass
    _signal_groups(tree + [pid for p in processes for pid in _descendants(p.pid)], signal.SIGKILL)


def stream(processes: Sequence[Process], label: Callable[[int, str], str], timeout: float,
           echo: bool, stop_on_failure: bool) -> tuple[str, bool, list[int]]:
    """Collect the processes' output line by line, each line passed through `label(index, line)` (notebook 07).

    Returns everything printed, whether the time ran out, and the processes' indices in the order
    their output closed (the order they exited in), those that failed before the others were stopped first.
    With `stop_on_failure`, the first
    process to exit non-zero stops the others, as torchrun's agent does: a rank left waiting in
    a collective for a dead peer would otherwise hang until the timeout.
    """
    start = time.perf_counter()
    readers = {p.stdout.fileno(): i for i, p in enumerate(processes) if p.stdout is not None}
    pending = {fd: "" for fd in readers}
    lines: list[str] = []
    closed: list[int] = []
    failed_first: list[int] = []
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
            if stop_on_failure and not failed_first and any(p.poll() not in (None, 0) for p in processes):
                # those that failed on their own come first: the peers stopped here may close their output sooner
                failed = {i for i, p in enumerate(processes) if p.poll() not in (None, 0)}
                failed_first = [i for i in closed if i in failed] + sorted(failed - set(closed))
                stop_launch([p for p in processes if p.poll() is None], grace=1.0)
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
        stop_launch(processes, grace=1.0)
        raise
    try:  # every output closed; a process may still be running
        for process in processes:
            process.wait(timeout=0 if timed_out else max(0.0, timeout - (time.perf_counter() - start)))
    except subprocess.TimeoutExpired:
        timed_out = True
        stop_launch(processes)
    for process in processes:
        process.wait()
        if process.stdout is not None:
            process.stdout.close()
    return "".join(lines), timed_out, failed_first + [i for i in closed if i not in failed_first]


def culprit(codes: Sequence[int | None], closed: list[int]) -> int | None:
    """The rank whose failure explains the launch's (notebook 07): its peers then fail too (a broken
    connection) or are stopped (negative codes). Ranks are taken in the order they exited."""
    order = closed + [i for i in range(len(codes)) if i not in closed]
    failed = [i for i in order if (codes[i] or 0) > 0] or [i for i in order if codes[i] != 0]
    return failed[0] if failed else None


def finish(what: str, returncode: int, output: str, timed_out: bool, seconds: float, command: Sequence[str],
           check: bool, timeout: float, tail_of: str | None = None, backend: str = "",
           values: tuple[Any, ...] = ()) -> LaunchResult:
    """The result, or with `check` a LaunchError ending with the last lines of `tail_of` (default: all output) (notebook 07)."""
    global launches_timed_out
    launches_timed_out += timed_out
    last = tail(output if tail_of is None else tail_of)
    if check and timed_out:
        stopped = f"{what} ran past {timeout:.0f} s and {'were' if what == 'the ranks' else 'was'} stopped"
        raise LaunchError(f"{stopped}; last output:\n{last}", stopped)
    if check and returncode != 0:
        raise LaunchError(f"{what} exited with status {returncode}; last output:\n{last}",
                          f"{what} exited with status {returncode}")
    return LaunchResult(returncode, output, seconds, tuple(command), values, backend)
