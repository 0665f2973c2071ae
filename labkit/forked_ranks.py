"""Ranks forked from this very process, each running a function (behind helpers.distributed.run_ranks) (notebook 07).

`torch.multiprocessing.spawn` starts fresh interpreters, which look a function up by name and cannot find
one a notebook cell defined. A fork is a copy of this process: the function, and the data it uses, are
already there. Each child gets its environment, joins the process group (the caller's `join`), runs the
function, and leaves a record — {"value"} or {"error", "message"} — that comes back in the result. A rank that
fails prints one line (what it raised, and where); its full traceback only with `tracebacks=True`.
"""

from __future__ import annotations

import io
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from labkit.launch import (
    LaunchResult,
    RankError,
    culprit,
    finish,
    own_lines,
    rank_label,
    stop_launch,
    stream,
    tail,
)
from labkit.rank_server import PolledChild

# The launcher's own frames are not the rank's code: a rank's traceback starts below them.
_LAUNCHER_FILES = {__file__}


class ForkedRank(PolledChild):
    """A child of os.fork with the parts of `subprocess.Popen` a launch uses (notebook 07)."""

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


def preload() -> None:
    """Import, once, what every rank would otherwise import on its own (DDP's first use imports torch._dynamo) (notebook 07)."""
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


def launch_function(fn: Callable[..., Any], args: tuple, kwargs: dict, envs: Sequence[dict[str, str]],
                    join: Callable[[], object] | None, *, backend: str, timeout: float, echo: bool, check: bool,
                    threads: int, tracebacks: bool = False) -> LaunchResult:
    """Fork one rank per environment in `envs`; each calls `join()` (when given), then `fn(*args, **kwargs)` (notebook 07).

    What each rank returned comes back in `values`. When one rank fails the others are stopped; on
    timeout every rank is. With `check`, a rank at an unfinished exercise raises NotImplementedError,
    a rank whose function raised raises RankError, any other failure LaunchError. A failing rank prints a
    one-line summary, or with `tracebacks` its traceback.
    """
    preload()
    nproc = len(envs)
    folder = Path(tempfile.mkdtemp(prefix="tml-ranks-"))
    name = getattr(fn, "__qualname__", repr(fn))
    command = [f"{name}()", f"on {nproc} ranks forked from process {os.getpid()}", backend]
    start = time.perf_counter()
    ranks: list[ForkedRank] = []
    try:
        for rank, env in enumerate(envs):
            ranks.append(_fork_rank(fn, args, kwargs, join, env, threads, folder / f"rank{rank}.pt", timeout,
                                    [r.stdout.fileno() for r in ranks], tracebacks))
        output, timed_out, closed = stream(ranks, rank_label, timeout, echo, stop_on_failure=True)
        seconds = time.perf_counter() - start
        records = [_read_record(folder / f"rank{rank}.pt") for rank in range(nproc)]
    finally:
        if any(rank_process.poll() is None for rank_process in ranks):
            stop_launch(ranks, grace=1.0)
        for rank_process in ranks:
            rank_process.stdout.close()
        shutil.rmtree(folder, ignore_errors=True)
    codes = [r.returncode for r in ranks]
    values = tuple(r.get("value") if r else None for r in records)
    failed = culprit(codes, closed)
    if timed_out or failed is None:
        return finish("the ranks", 0 if failed is None else codes[failed] or 0, output, timed_out, seconds, command,
                      check, timeout, backend=backend, values=values)
    record = records[failed] or {}
    if check and record.get("error") == "NotImplementedError":
        raise NotImplementedError(f"rank {failed}: {record.get('message') or 'an unfinished exercise'}") from None
    own = own_lines(output, failed)
    if check and record.get("error"):
        raise RankError(f"rank {failed} raised {record['error']}: {record.get('message', '')}\nlast output:\n{tail(own)}",
                        failed, record["error"], record.get("message", ""))
    return finish(f"rank {failed}", codes[failed] or 0, output, timed_out, seconds, command, check, timeout,
                  tail_of=own, backend=backend, values=values)


def _read_record(path: Path) -> dict | None:
    import torch

    try:
        # A rank may return CUDA tensors: bring them back on the CPU. Making a CUDA tensor here would initialise the
        # driver in this process, after which no rank forked from it could use a GPU.
        return torch.load(path, weights_only=False, map_location="cpu")
    except Exception:
        return None


def _fork_rank(fn: Callable[..., Any], args: tuple, kwargs: dict, join: Callable[[], object] | None,
               env: dict[str, str], threads: int, record_path: Path, timeout: float, inherited: list[int],
               tracebacks: bool) -> ForkedRank:
    """Fork one rank: it joins the group (`join`), runs `fn`, saves {"value"} or {"error", "message"}, and exits."""
    read_end, write_end = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # Python 3.12+: fork with threads (the kernel's) running
        pid = os.fork()
    if pid == 0:  # the rank; it never returns from here
        _become_rank(fn, args, kwargs, join, env, threads, record_path, timeout, [read_end, *inherited], write_end,
                     tracebacks)
    os.close(write_end)
    return ForkedRank(pid, os.fdopen(read_end, "rb", buffering=0))


JOINED, LEFT = "tml/joined", "tml/left"  # counters on the group's store
_counted: list[object] = []  # in a rank (a fresh fork each): the store it added itself to JOINED on


def _count_joined() -> None:
    """Say on the group's store, once per group, that this rank's `init_process_group` has returned (a function
    may destroy the group it was given and join a new one)."""
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _get_default_store

    if dist.is_initialized() and not any(store is _get_default_store() for store in _counted):
        _counted.append(_get_default_store())  # held: a store gone could hand its id to a new one
        _counted[-1].add(JOINED, 1)  # type: ignore[attr-defined]


def _leave_together(timeout: float) -> None:
    """Leave the process group once every rank has joined it; rank 0, which hosts the group's store, waits until
    every other rank has left.

    No rank may leave while another is still joining: gloo's connections of a rank that left close under a peer
    still connecting to it ("Connection closed by peer" in init_process_group, seen on a loaded machine). Once
    all have joined, a rank whose function has returned leaves at once, and a peer still waiting in a collective
    for it fails then (notebook 07's claim 2), not at the launch's time limit. A rank whose function ends
    without a last collective may still need rank 0's store to leave: rank 0 must not exit before it.
    """
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    from torch.distributed.distributed_c10d import _get_default_store

    _count_joined()  # a function that joined the group itself
    store, rank, world = _get_default_store(), dist.get_rank(), dist.get_world_size()
    deadline = time.monotonic() + timeout
    while store.add(JOINED, 0) < world and time.monotonic() < deadline:
        time.sleep(0.005)
    dist.destroy_process_group()
    if rank != 0:
        store.add(LEFT, 1)
        return
    while store.add(LEFT, 0) < world - 1 and time.monotonic() < deadline:
        time.sleep(0.005)


def _own_output(close: list[int], output: int) -> None:
    """In the child: its own session and signals; stdout and stderr go to `output` only."""
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


def _failure_record(exc: BaseException, tracebacks: bool) -> dict:
    """Print one line — what the rank raised, and where in its own code — or with `tracebacks` its traceback (its own
    frames only); say what it raised."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename in _LAUNCHER_FILES:
        tb = tb.tb_next
    message = str(exc)[:2000]
    last = traceback.extract_tb(tb)[-1] if tb is not None else None
    if isinstance(exc, NotImplementedError) and last is not None and not tracebacks:
        # a stub: its name says enough, and the launcher raises it in the kernel, where the exercise's test names it
        message = message or f"{last.name}() is not written yet"
    elif tracebacks:
        traceback.print_exception(type(exc), exc, tb or exc.__traceback__)
    else:
        where = f" (in {last.name}, line {last.lineno})" if last is not None else ""
        first = (message.strip().splitlines() or [""])[0]
        print(f"{type(exc).__name__}: {first}{where} — for the traceback: TML_TRACEBACKS=1 or "
              "run_ranks(..., tracebacks=True)", file=sys.stderr)
    return {"error": type(exc).__name__, "message": message}


def _become_rank(fn: Callable[..., Any], args: tuple, kwargs: dict, join: Callable[[], object] | None,
                 env: dict[str, str], threads: int, record_path: Path, timeout: float, close: list[int],
                 output: int, tracebacks: bool) -> None:
    code, record = 1, {"error": "SystemExit", "message": "the rank stopped before it finished"}
    try:
        _own_output(close, output)
        os.environ.update(env)
        import torch

        torch.set_num_threads(threads)
        if join is not None:
            join()
            _count_joined()
        value = fn(*args, **kwargs)
        _leave_together(timeout)
        record, code = {"value": value}, 0  # only now: a rank that failed to leave has not succeeded
    except BaseException as exc:
        record = _failure_record(exc, tracebacks)
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
