"""Launch real multi-process PyTorch code from a notebook and watch every rank (notebook 07).

A notebook cannot `mp.spawn` a function it defines: spawn starts fresh interpreters, which look the
function up by name in `__main__` and do not find it. Two ways round that, both here:

- `run_ranks(fn, N)` forks N ranks from this very process (a kernel, a test): each child already has
  `fn`, whatever cell defined it, and the data it uses; it joins a process group (`init_rank`: the
  rank's device set before `init_process_group`), calls `fn()`, and its return value comes back in
  `LaunchResult.values` (labkit.forked_ranks does the forking). Forking is only safe while this process's
  CUDA driver is uninitialised (`cuda_fork_poisoned` asks a forked child): an nccl launch refuses
  otherwise, with a message, and (by default) runs again with gloo on the CPU.
- `run_ranks(script, N)` and `run_torchrun(script, N)` start a script file: `run_torchrun` with
  `torchrun --standalone --nproc_per_node=N`, `run_ranks` the way torchrun starts ranks on one node
  minus its agent, forked from a helper process with torch imported (labkit.rank_server).

Every launch streams each rank's output into the notebook (`[rank R] ` prefixes), stops every rank
when one fails or the time runs out, and raises `LaunchError` (or, for a rank that hit an unfinished
exercise, `NotImplementedError`) — labkit.launch holds that shared plumbing; a rank of a function launch that
fails prints one line, its traceback only with `tracebacks=True` (or TML_TRACEBACKS=1). `choose_backend` picks gloo
or nccl (`TML_BACKEND` overrides): nccl only where it passed `nccl_probe`, one all-reduce forked from this process,
once per process — a kernel whose nccl hangs or fails loses one short probe, not every launch's time limit.
"""

from __future__ import annotations

import inspect
import os
import re
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from labkit.forked_ranks import launch_function
from labkit.launch import (
    LaunchError,
    LaunchResult,
    RankError,
    child_env,
    culprit,
    ends_in_not_implemented,
    finish,
    own_lines,
    rank_label,
    ranks_output,
    stream,
    tail,
)
from labkit.rank_server import ForkRefused, RankServer, cuda_fork_poisoned

__all__ = ["BACKENDS", "LaunchError", "LaunchResult", "RankError", "choose_backend", "cuda_fork_poisoned", "free_port",
           "function_source", "init_rank", "nccl_probe", "rank_device", "rank_environment", "ranks_output", "run_ranks",
           "run_torchrun", "start_rank_server", "start_torchrun", "torchrun_command", "write_script"]

BACKENDS = ("gloo", "nccl")
COLLECTIVE_GRACE_S = 10.0  # a function launch's collectives give up this long after the launch's time limit
NCCL_PROBE_TIMEOUT_S = 15.0  # the probe's launch: CUDA contexts and nccl's set-up take seconds; a hang is cut here

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


def rank_environment(rank: int, nproc: int, master_port: int, master_addr: str = "127.0.0.1") -> dict[str, str]:
    """The variables torchrun --standalone gives rank `rank` of `nproc` on one node,
    minus its agent's TORCHELASTIC_* ones (notebook 07)."""
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0", "ROLE_RANK": str(rank),
            "WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc), "ROLE_WORLD_SIZE": str(nproc),
            "GROUP_WORLD_SIZE": "1", "ROLE_NAME": "default", "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port),
            # torchrun's default too: a failed or stuck nccl collective ends the process instead of hanging
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")}


def run_torchrun(script: str | os.PathLike[str], nproc: int = 2, *, check: bool = True, **options: Any) -> LaunchResult:
    """Run `script` on `nproc` local processes with torchrun, streaming their output as it arrives (notebook 07).

    torchrun tees each rank's stdout and stderr line by line (`--tee 3`), so lines of two ranks
    never mix; each line is shown with the prefix `[rank R] `. The launcher starts in a session of
    its own, so on timeout it and all its ranks are stopped together. With `check` a non-zero exit
    or a timeout raises `LaunchError` whose message ends with the last lines printed. The `options` are
    `start_torchrun`'s: script_args, timeout, env, echo, threads_per_process.
    """
    return start_torchrun(script, nproc, live=True, **options).result(check=check)


class TorchrunLaunch:
    """A torchrun launch under way; `result()` waits for it (notebook 07).

    torchrun imports torch before it starts any rank: seconds in which this process can do other work. Its output
    is collected by a thread; with `echo` it is shown when `result()` is called (all of it, prefixed `[rank R] `),
    or with `live` as it arrives (for a caller that waits at once: a cell running meanwhile would show it).
    `seconds` in the result is the launch's own duration, from its start to its exit, not to `result()`.
    """

    def __init__(self, script: str | os.PathLike[str], nproc: int, *, script_args: Sequence[str], timeout: float,
                 env: Mapping[str, str] | None, echo: bool, threads_per_process: int, live: bool = False) -> None:
        import threading

        self._logs = tempfile.TemporaryDirectory(prefix="torchrun-logs-")
        self.command = torchrun_command(script, nproc, script_args=script_args,
                                        launcher_flags=["--tee", "3", "--log-dir", self._logs.name])
        self.timeout, self.echo, self.live = timeout, echo, live
        start = time.perf_counter()
        self._process = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                         env=child_env(threads_per_process, env),
                                         cwd=str(Path(script).resolve().parent), start_new_session=True)
        self._outcome: tuple[str, bool, float] = ("", False, 0.0)

        def collect() -> None:
            output, timed_out, _ = stream([self._process], self._label, timeout, echo and live, stop_on_failure=False)
            self._outcome = (output, timed_out, time.perf_counter() - start)

        self._thread = threading.Thread(target=collect, name="torchrun-output", daemon=True)
        self._thread.start()

    @staticmethod
    def _label(_: int, line: str) -> str:
        # A line a rank left unfinished (a progress bar's carriage returns) ends where the next prefix starts.
        return _ROLE_PREFIX_MIDLINE.sub(r"\n[rank \1] ", _ROLE_PREFIX.sub(r"[rank \1] ", line)).lstrip("\n")

    def result(self, check: bool = True) -> LaunchResult:
        """Wait for the launch; with `check` a non-zero exit or a timeout raises LaunchError (notebook 07)."""
        self._thread.join()
        self._logs.cleanup()
        output, timed_out, seconds = self._outcome
        if self.echo and not self.live:
            sys.stdout.write(output)
            sys.stdout.flush()
        return finish("torchrun", self._process.returncode, output, timed_out, seconds, self.command, check,
                      self.timeout)


def start_torchrun(
    script: str | os.PathLike[str],
    nproc: int = 2,
    *,
    script_args: Sequence[str] = (),
    timeout: float = 60.0,
    env: Mapping[str, str] | None = None,
    echo: bool = True,
    threads_per_process: int = 1,
    live: bool = False,
) -> TorchrunLaunch:
    """Start `script` on `nproc` local processes with torchrun and return at once; `.result()` waits (notebook 07).

    With `echo` the output is shown when `result()` is called, or, with `live`, as it arrives.
    """
    return TorchrunLaunch(script, nproc, script_args=script_args, timeout=timeout, env=env, echo=echo,
                          threads_per_process=threads_per_process, live=live)


# --- which backend, and the per-rank set-up --------------------------------------------------------------

def choose_backend(nproc: int = 2) -> str:
    """gloo or nccl for `nproc` ranks on this machine; the environment variable TML_BACKEND overrides (notebook 07).

    nccl needs a GPU per rank: it is chosen when nccl is built in, at least `nproc` GPUs are visible and
    `nccl_probe(nproc)` passed in this process. `torch.cuda.device_count()` asks NVML when it can load it, and then
    choosing leaves this process's CUDA driver alone; without NVML it asks the CUDA runtime, which initialises the
    driver — after which ranks forked from this process cannot use CUDA (`cuda_fork_poisoned()` says whether that
    happened, and the probe then fails at once).
    """
    forced = os.environ.get("TML_BACKEND", "").strip().lower()
    if forced:
        if forced not in BACKENDS:
            raise ValueError(f"TML_BACKEND must be one of {', '.join(BACKENDS)}, not {forced!r}")
        return forced
    return "gloo" if _nccl_impossible(nproc) or nccl_probe(nproc) else "nccl"


_NCCL_PROBES: dict[int, str] = {}  # ranks → why nccl failed its probe in this process ("" when it passed)


def nccl_probe(nproc: int = 2, timeout_s: float = NCCL_PROBE_TIMEOUT_S) -> str:
    """Why nccl cannot run `nproc` ranks forked from this process, "" when it can; asked once per process (notebook 07).

    The probe forks `nproc` ranks that join an nccl group and all-reduce one number, within `timeout_s`, with nothing
    echoed; the first call prints one line with the outcome and the backend launches will use, later calls repeat
    the answer without printing.
    """
    if nproc not in _NCCL_PROBES:
        why = _nccl_impossible(nproc)
        start = time.perf_counter()
        if not why:
            try:
                total = _run_function(_one_all_reduce, nproc, (), {}, "nccl", True, timeout=timeout_s, env=None,
                                      echo=False, check=True, threads_per_process=1, tracebacks=False).values[0]
                why = "" if total == nproc else f"the all-reduce of 1 over {nproc} ranks gave {total}"
            except (LaunchError, NotImplementedError) as failure:
                why = (f"rank {failure.rank}: " if isinstance(failure, RankError) else "") + str(
                    getattr(failure, "summary", failure))
        _NCCL_PROBES[nproc] = why
        print(f"nccl probe, one all-reduce on {nproc} ranks ({time.perf_counter() - start:.1f} s): "
              + (f"failed — {why}; launches from this process use gloo" if why else
                 "passed; launches from this process use nccl"), flush=True)
    return _NCCL_PROBES[nproc]


def _one_all_reduce() -> float:
    """In a probe's rank: all-reduce a 1 on this rank's GPU; returns the sum (the number of ranks)."""
    import torch
    import torch.distributed as dist

    one = torch.ones(1, device=rank_device())
    dist.all_reduce(one)
    return float(one.item())


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
    tracebacks: bool | None = None,
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
    when a function raised), unless `check` is False. A function's rank that raised prints one line (what and
    where); with `tracebacks` (default: the variable TML_TRACEBACKS=1) its traceback. With a `fallback`, nccl
    is used only where `nccl_probe` passed in this process (it probes on first use; else the launch runs with
    `fallback`, gloo on the CPU, after one line saying so), and an nccl launch that fails all the same is tried
    again with `fallback` after saying why; `fallback=None` launches nccl without a probe and raises instead.
    """
    backend = backend or choose_backend(nproc)
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
    options: dict[str, Any] = dict(timeout=timeout, env=env, echo=echo, check=check, threads_per_process=threads_per_process)
    launch: Callable[[str], LaunchResult]
    if callable(target):
        shown = os.environ.get("TML_TRACEBACKS", "") == "1" if tracebacks is None else tracebacks
        launch = lambda chosen: _run_function(target, nproc, tuple(args), dict(kwargs or {}), chosen, init,  # noqa: E731
                                              tracebacks=shown, **options)
    else:
        launch = lambda chosen: _run_script(target, nproc, script_args, chosen, fork=fork, **options)  # noqa: E731
    if backend != "nccl" or not fallback or fallback == backend:
        return launch(backend)
    probed = nproc in _NCCL_PROBES  # else the probe runs now and its own line says what it found
    failed_probe = nccl_probe(nproc)
    if failed_probe:
        if probed:
            print(f"nccl failed its probe in this process ({failed_probe}): this launch runs with {fallback} on the "
                  "CPU.", flush=True)
        return launch(fallback)
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
    envs = [child_env(threads_per_process, {**rank_environment(rank, nproc, port), "TML_BACKEND": backend, **(env or {})})
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
    output, timed_out, closed = stream(processes, rank_label, timeout, echo, stop_on_failure=True)
    seconds = time.perf_counter() - start
    codes = [p.returncode for p in processes]
    failed = culprit(codes, closed)
    if timed_out or failed is None:
        return finish("the ranks", codes[failed] if failed is not None else 0, output, timed_out, seconds, command,
                      check, timeout, backend=backend)
    own = own_lines(output, failed)
    if check and ends_in_not_implemented(own):
        raise NotImplementedError(f"rank {failed} stopped at an unfinished exercise:\n{tail(own)}")
    return finish(f"rank {failed}", codes[failed], output, timed_out, seconds, command, check, timeout,
                  tail_of=own, backend=backend)


def _run_function(fn: Callable[..., Any], nproc: int, args: tuple, kwargs: dict, backend: str, init: bool, *,
                  timeout: float, env: Mapping[str, str] | None, echo: bool, check: bool,
                  threads_per_process: int, tracebacks: bool) -> LaunchResult:
    if not hasattr(os, "fork"):
        raise LaunchError("run_ranks(function) forks the ranks from this process, which this platform cannot do: "
                          "use Linux (or WSL) or macOS", "this platform cannot fork")
    why_not = _nccl_impossible(nproc) if backend == "nccl" else ""
    if why_not:
        raise LaunchError(why_not, why_not)
    if backend == "nccl" and cuda_fork_poisoned():
        raise LaunchError(
            "CUDA's driver is already initialised in this process (a CUDA tensor, or torch.cuda.is_available() "
            "without PYTORCH_NVML_BASED_CUDA_CHECK=1), and torch refuses CUDA to a process forked after that, so the "
            "nccl ranks cannot start. Restart the kernel and run the notebook from the top without touching the GPU "
            "before this cell (or set TML_BACKEND=gloo).", "CUDA's driver was initialised in this process before the fork")
    port = free_port()
    envs = [{**rank_environment(rank, nproc, port), "TML_BACKEND": backend, "PYTHONUNBUFFERED": "1",
             "OMP_NUM_THREADS": str(threads_per_process), **(env or {})} for rank in range(nproc)]
    # Collectives wait longer than the launch: a hung one is ended by the launch's own limit, named as such
    # (LaunchError "ran past", and the launch counted as timed out), never by a gloo error racing it.
    join = (lambda: init_rank(backend, timeout_s=timeout + COLLECTIVE_GRACE_S)) if init else None
    return launch_function(fn, args, kwargs, envs, join, backend=backend, timeout=timeout, echo=echo, check=check,
                           threads=threads_per_process, tracebacks=tracebacks)


def _nccl_impossible(nproc: int) -> str:
    """Why nccl cannot run `nproc` ranks here ('' when it can): it needs nccl built in and a GPU per rank."""
    import torch
    import torch.distributed as dist

    if not dist.is_nccl_available():
        return "this torch build has no nccl"
    gpus = torch.cuda.device_count()
    return "" if gpus >= nproc else f"nccl needs a GPU per rank: {nproc} ranks, {gpus} GPU(s) visible"
