"""Tests for helpers.distributed: script writing, torchrun command lines, launches, failures and timeouts."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.distributed import (
    LaunchError,
    free_port,
    function_source,
    run_ranks,
    run_torchrun,
    torchrun_command,
    write_script,
)


def test_free_port_can_be_bound():
    port = free_port()
    assert 1024 <= port <= 65535
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_write_script_dedents_and_creates_folders(tmp_path: Path):
    path = write_script("""
        import sys
        print("hello")
    """, tmp_path / "sub", "s.py")
    assert path == tmp_path / "sub" / "s.py"
    assert path.read_text() == 'import sys\nprint("hello")\n'


def _sample(a, b=2):
    return a + b


def test_function_source_round_trips():
    namespace: dict = {}
    exec(function_source(_sample), namespace)
    assert namespace["_sample"](1) == 3


def test_function_source_explains_missing_source():
    with pytest.raises(LaunchError, match="could not read the source"):
        function_source(len)


@given(nproc=st.integers(1, 8))
def test_standalone_command(nproc: int):
    cmd = torchrun_command("train.py", nproc, script_args=["--epochs", "3"], python="python")
    assert cmd == ["python", "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
                   "train.py", "--epochs", "3"]


@settings(max_examples=20)
@given(nnodes=st.integers(2, 16), nproc=st.integers(1, 8), port=st.integers(1024, 65535), data=st.data())
def test_multi_node_command(nnodes: int, nproc: int, port: int, data):
    node_rank = data.draw(st.integers(0, nnodes - 1))
    cmd = torchrun_command("train.py", nproc, nnodes=nnodes, node_rank=node_rank, master_addr="10.0.0.1",
                           master_port=port, python="python")
    assert "--standalone" not in cmd
    for flag in (f"--nnodes={nnodes}", f"--nproc_per_node={nproc}", f"--node_rank={node_rank}",
                 "--master_addr=10.0.0.1", f"--master_port={port}"):
        assert flag in cmd
    assert cmd[-1] == "train.py"


@pytest.mark.slow
def test_two_gloo_ranks_all_reduce(tmp_path: Path, capsys):
    script = write_script("""
        import os, torch, torch.distributed as dist
        dist.init_process_group("gloo")
        t = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(t)
        print(f"sum={t.item():g} world={os.environ['WORLD_SIZE']}")
        dist.destroy_process_group()
    """, tmp_path)
    result = run_torchrun(script, nproc=2, timeout=120)
    assert result.returncode == 0
    for rank in (0, 1):
        assert result.lines_from_rank(rank) == ["sum=3 world=2"]
    assert "[rank 0] sum=3" in capsys.readouterr().out  # streamed into the caller's stdout


@pytest.mark.slow
def test_failure_raises_with_output_tail(tmp_path: Path):
    script = write_script("""
        import os
        print("about to fail", flush=True)
        raise SystemExit(3)
    """, tmp_path)
    with pytest.raises(LaunchError, match="about to fail"):
        run_torchrun(script, nproc=2, timeout=120, echo=False)
    result = run_torchrun(script, nproc=1, timeout=120, echo=False, check=False)
    assert result.returncode != 0


def _sleeper(tmp_path: Path) -> tuple[Path, Path]:
    """A script whose every rank records its PID and sleeps; the folder the PIDs go to."""
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    script = write_script(f"""
        import os, time
        open(os.path.join({str(pid_dir)!r}, str(os.getpid())), "w").close()
        print(f"rank {{os.environ['RANK']}} sleeping", flush=True)
        time.sleep(600)
    """, tmp_path)
    return script, pid_dir


def _assert_all_stopped(pid_dir: Path, nproc: int) -> None:
    pids = [int(p.name) for p in pid_dir.iterdir()]
    assert len(pids) == nproc
    time.sleep(0.5)
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]


@pytest.mark.slow
def test_timeout_stops_every_rank(tmp_path: Path):
    script, pid_dir = _sleeper(tmp_path)
    start = time.perf_counter()
    with pytest.raises(LaunchError, match="ran past"):
        run_torchrun(script, nproc=2, timeout=12, echo=False)
    assert time.perf_counter() - start < 40
    _assert_all_stopped(pid_dir, 2)


ENV_SCRIPT = """
    import json, os
    print("ENV " + json.dumps({k: os.environ.get(k) for k in %r}))
"""
CORE = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE",
        "GROUP_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT"]


@pytest.mark.slow
def test_run_ranks_sets_what_torchrun_sets(tmp_path: Path):
    script = write_script(ENV_SCRIPT % CORE, tmp_path)
    seen = {}
    for name, launch in (("torchrun", run_torchrun), ("forked", run_ranks),
                         ("fresh", lambda *a, **k: run_ranks(*a, fork=False, **k))):
        result = launch(script, nproc=2, timeout=120, echo=False)
        seen[name] = [json.loads(result.lines_from_rank(r)[0][len("ENV "):]) for r in (0, 1)]
    for name in ("forked", "fresh"):
        for rank in (0, 1):
            ours, theirs = seen[name][rank], seen["torchrun"][rank]
            assert {k: v for k, v in ours.items() if k not in ("MASTER_ADDR", "MASTER_PORT")} == \
                   {k: v for k, v in theirs.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}, name
            assert ours["MASTER_PORT"] == seen[name][0]["MASTER_PORT"]  # every rank meets at rank 0's port


@pytest.mark.slow
@pytest.mark.parametrize("fork", [True, False])
def test_run_ranks_all_reduce_and_a_failing_rank_stops_its_peer(tmp_path: Path, capsys, fork: bool):
    script = write_script("""
        import sys, time, torch, torch.distributed as dist
        dist.init_process_group("gloo")
        t = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(t)
        print(f"sum={t.item():g}")
        if sys.argv[1] == "fail":
            if dist.get_rank() == 1:
                raise ValueError("rank 1 gives up")
            time.sleep(600)  # rank 0 would wait for ever unless the launcher stops it
        dist.destroy_process_group()
    """, tmp_path)
    result = run_ranks(script, nproc=2, script_args=["ok"], timeout=120, fork=fork)
    assert [result.lines_from_rank(r) for r in (0, 1)] == [["sum=3"], ["sum=3"]]
    assert "[rank 1] sum=3" in capsys.readouterr().out
    start = time.perf_counter()
    with pytest.raises(LaunchError, match=r"rank 1 exited with status 1(.|\n)*ValueError: rank 1 gives up") as info:
        run_ranks(script, nproc=2, script_args=["fail"], timeout=120, echo=False, fork=fork)
    assert time.perf_counter() - start < 30
    assert "rank_server.py" not in str(info.value) and "runpy" not in str(info.value)  # the script's frames only


@pytest.mark.slow
def test_run_ranks_timeout_stops_every_rank(tmp_path: Path):
    script, pid_dir = _sleeper(tmp_path)
    with pytest.raises(LaunchError, match="the ranks ran past 3 s"):
        run_ranks(script, nproc=2, timeout=3, echo=False)
    _assert_all_stopped(pid_dir, 2)
