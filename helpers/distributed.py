"""Launch real multi-process PyTorch code from a notebook with torchrun, and watch every rank (notebook 07).

A notebook cannot `mp.spawn` a function it defines (the child processes cannot unpickle it from
`__main__`), so the course writes the training code to a script and starts it with
`torchrun --standalone --nproc_per_node=N script.py`. `run_torchrun` streams the output of every
rank into the notebook while it runs, stops the whole process group after a timeout, and hands back
what was printed. `function_source` copies functions defined in the notebook into such a script.
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


class TorchrunError(RuntimeError):
    """A torchrun launch that failed or ran past its time limit; the message ends with the output tail (notebook 07)."""


@dataclass(frozen=True)
class TorchrunResult:
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
            raise TorchrunError(
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


def _stop_launch(process: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    """Ask torchrun to stop its ranks (SIGTERM), then kill whatever is left of this launch."""
    ranks = _descendants(process.pid)
    for pid in [process.pid, *ranks]:
        try:
            os.killpg(pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    for pid in [process.pid, *ranks, *_descendants(process.pid)]:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


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
) -> TorchrunResult:
    """Run `script` on `nproc` local processes with torchrun, streaming their output as it arrives (notebook 07).

    torchrun tees each rank's stdout and stderr line by line (`--tee 3`), so lines of two ranks
    never mix; each line is shown with the prefix `[rank R] `. Every process is started in a session of its own, so on timeout the launcher and all ranks are
    stopped together. With `check` a non-zero exit or a timeout raises `TorchrunError` whose
    message ends with the last lines printed.
    """
    logs = tempfile.TemporaryDirectory(prefix="torchrun-logs-")
    command = torchrun_command(script, nproc, script_args=script_args,
                               launcher_flags=["--tee", "3", "--log-dir", logs.name])
    full_env = dict(os.environ)
    full_env.update({"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(threads_per_process)})
    full_env.update(env or {})
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=full_env,
                               cwd=str(Path(script).resolve().parent), start_new_session=True)
    assert process.stdout is not None
    lines: list[str] = []
    pending = ""
    timed_out = False
    fd = process.stdout.fileno()

    def emit(text: str) -> None:
        # A line a rank left unfinished (a progress bar's carriage returns) ends where the next prefix starts.
        text = _ROLE_PREFIX_MIDLINE.sub(r"\n[rank \1] ", _ROLE_PREFIX.sub(r"[rank \1] ", text))
        lines.append(text)
        if echo:
            sys.stdout.write(text)
            sys.stdout.flush()

    while True:
        left = timeout - (time.perf_counter() - start)
        if left <= 0:
            timed_out = True
            break
        ready, _, _ = select.select([fd], [], [], min(left, 0.5))
        if not ready:
            if process.poll() is not None:
                break
            continue
        data = os.read(fd, 65536)
        if not data:
            break
        pending += data.decode("utf-8", errors="replace")
        *complete, pending = pending.split("\n")
        if complete:
            emit("\n".join(complete) + "\n")
    if timed_out:
        _stop_launch(process)
    returncode = process.wait()
    process.stdout.close()
    logs.cleanup()
    if pending:
        emit(pending + "\n")
    output = "".join(lines)
    result = TorchrunResult(returncode, output, time.perf_counter() - start, tuple(command))
    if check and timed_out:
        raise TorchrunError(f"torchrun ran past {timeout:.0f} s and was stopped; last output:\n{_tail(output)}")
    if check and returncode != 0:
        raise TorchrunError(f"torchrun exited with status {returncode}; last output:\n{_tail(output)}")
    return result
