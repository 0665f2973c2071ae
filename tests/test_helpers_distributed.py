"""Tests for helpers.distributed: scripts and torchrun command lines, script and function launches, failures (one
line per rank, tracebacks on request), timeouts, the choice of backend, the nccl probe, the per-rank device set-up,
the fork probe and the nccl and fork fallbacks."""

from __future__ import annotations

import inspect
import json
import os
import re
import socket
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import helpers.distributed as distributed
from helpers.distributed import (
    LaunchError,
    RankError,
    choose_backend,
    free_port,
    function_source,
    init_rank,
    nccl_probe,
    rank_device,
    run_ranks,
    run_torchrun,
    start_torchrun,
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
def test_start_torchrun_returns_at_once_and_result_waits(tmp_path: Path, capsys):
    script = write_script("""
        import os, time
        time.sleep(1)
        print(f"rank={os.environ['RANK']}", flush=True)
    """, tmp_path)
    started = time.perf_counter()
    launch = start_torchrun(script, nproc=2, timeout=120)
    assert time.perf_counter() - started < 1.0  # torchrun imports torch in its own process meanwhile
    assert capsys.readouterr().out == ""  # nothing shown while another cell may be running
    time.sleep(0.5)
    result = launch.result()
    assert result.returncode == 0 and [result.lines_from_rank(r) for r in (0, 1)] == [["rank=0"], ["rank=1"]]
    assert "[rank 1] rank=1" in capsys.readouterr().out  # shown when collected
    assert result.seconds > 1.0  # the launch's own duration: the ranks slept 1 s

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
    # Status 1, or now and then -6: gloo may abort while the interpreter shuts down after the error.
    with pytest.raises(LaunchError, match=r"rank 1 exited with status (1|-6)(.|\n)*ValueError: rank 1 gives up") as info:
        run_ranks(script, nproc=2, script_args=["fail"], timeout=120, echo=False, fork=fork)
    assert time.perf_counter() - start < 30
    assert "rank_server.py" not in str(info.value) and "runpy" not in str(info.value)  # the script's frames only


@pytest.mark.slow
def test_run_ranks_timeout_stops_every_rank(tmp_path: Path):
    script, pid_dir = _sleeper(tmp_path)
    with pytest.raises(LaunchError, match="the ranks ran past 3 s"):
        run_ranks(script, nproc=2, timeout=3, echo=False)
    _assert_all_stopped(pid_dir, 2)


# --- function launches: ranks forked from this process ------------------------------------------------------

def _sum_of_ranks(scale):
    import torch
    import torch.distributed as dist

    value = torch.tensor([dist.get_rank() + 1.0]) * scale
    dist.all_reduce(value)
    print(f"rank {dist.get_rank()} of {dist.get_world_size()} on {dist.get_backend()}")
    return value.item(), os.environ["RANK"], os.environ["LOCAL_RANK"], os.environ["WORLD_SIZE"]


@pytest.mark.slow
def test_function_ranks_return_values_and_stream_output(capsys):
    result = run_ranks(_sum_of_ranks, 3, args=(2.0,), backend="gloo", timeout=60)
    assert result.backend == "gloo" and result.returncode == 0
    assert result.values == ((12.0, "0", "0", "3"), (12.0, "1", "1", "3"), (12.0, "2", "2", "3"))
    assert "[rank 2] rank 2 of 3 on gloo" in capsys.readouterr().out


@pytest.mark.slow
def test_function_ranks_see_what_this_process_defined():
    local = {"weights": [1.0, 2.0]}  # a closure over this test's data: no pickling, no source needed

    def body():
        import torch.distributed as dist

        return sum(local["weights"]) * (dist.get_rank() + 1)

    assert run_ranks(body, 2, backend="gloo", echo=False).values == (3.0, 6.0)


@pytest.mark.slow
def test_function_rank_error_names_the_rank_and_stops_its_peers():
    def body():
        import time

        import torch.distributed as dist

        if dist.get_rank() == 1:
            raise ValueError("rank 1 gives up")
        time.sleep(600)  # rank 0 would wait for ever unless the launcher stops it

    start = time.perf_counter()
    with pytest.raises(RankError, match="rank 1 raised ValueError: rank 1 gives up") as info:
        run_ranks(body, 2, backend="gloo", echo=False, timeout=60)
    assert time.perf_counter() - start < 30
    assert (info.value.rank, info.value.error_type, info.value.summary) == (1, "ValueError", "ValueError: rank 1 gives up")
    # the launcher's frames are left out of the rank's traceback
    assert "helpers/distributed.py" not in str(info.value) and "forked_ranks.py" not in str(info.value)


@pytest.mark.slow
def test_function_rank_at_an_unfinished_exercise_raises_not_implemented():
    def exercise():
        raise NotImplementedError()

    with pytest.raises(NotImplementedError, match="exercise\\(\\) is not written yet"):
        run_ranks(exercise, 2, backend="gloo", echo=False)


@pytest.mark.slow
def test_function_ranks_timeout_stops_every_rank():
    def body():
        import time

        time.sleep(600)

    start = time.perf_counter()
    with pytest.raises(LaunchError, match="ran past 2 s") as info:
        run_ranks(body, 2, backend="gloo", echo=False, timeout=2)
    assert time.perf_counter() - start < 15
    assert info.value.summary == "the ranks ran past 2 s and were stopped"


@pytest.mark.slow
def test_function_ranks_without_init_join_the_group_themselves():
    def body():
        import torch.distributed as dist

        before = dist.is_initialized()
        device = init_rank("gloo")
        return before, str(device), dist.get_backend(), str(rank_device())

    assert run_ranks(body, 2, init=False, echo=False).values == ((False, "cpu", "gloo", "cpu"),) * 2


@pytest.mark.slow
def test_a_failing_rank_prints_one_line_and_its_traceback_only_on_request(capsys, monkeypatch):
    def body():
        import time

        import torch.distributed as dist

        if dist.get_rank() == 1:
            raise ValueError("rank 1 gives up\nsecond line of the message")
        time.sleep(600)

    monkeypatch.delenv("TML_TRACEBACKS", raising=False)
    with pytest.raises(RankError, match="rank 1 raised ValueError"):
        run_ranks(body, 2, backend="gloo", timeout=60)
    printed = capsys.readouterr().out
    lines, first = inspect.getsourcelines(body)
    raised_at = first + next(i for i, line in enumerate(lines) if "raise ValueError" in line)
    assert [line for line in printed.splitlines() if line.startswith("[rank 1]")] == [
        f"[rank 1] ValueError: rank 1 gives up (in body, line {raised_at}) — for the traceback: TML_TRACEBACKS=1 or "
        "run_ranks(..., tracebacks=True)"]
    assert "Traceback" not in printed and not [line for line in printed.splitlines() if line.startswith("[rank 0]")]
    for shown in (dict(tracebacks=True), {}):
        if not shown:
            monkeypatch.setenv("TML_TRACEBACKS", "1")
        with pytest.raises(RankError):
            run_ranks(body, 2, backend="gloo", timeout=60, **shown)
        printed = capsys.readouterr().out
        assert "[rank 1] Traceback (most recent call last):" in printed and "[rank 1] ValueError: rank 1 gives up" in printed


# --- nccl: the probe, refusals and the fallback to gloo ------------------------------------------------------------

@pytest.fixture
def two_gpus_with_nccl(monkeypatch):
    """Whatever this machine has: nccl built in, 2 GPUs visible, and no probe run yet in this process."""
    import torch
    import torch.distributed as dist

    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(distributed, "_NCCL_PROBES", {})
    launches = []
    real = distributed._run_function
    monkeypatch.setattr(distributed, "_run_function", lambda *a, **k: launches.append(a[4]) or real(*a, **k))
    return launches  # the backend of every function launch, the probe's included


def _nccl_fails_in_the_ranks(monkeypatch, how):
    """nccl made to fail where it fails on a GPU host: in each forked rank, as it joins (a fork keeps the patch)."""
    import torch

    monkeypatch.setattr(torch.cuda, "set_device", how)


def _unhandled_system_error(device):
    raise RuntimeError("NCCL error in: ProcessGroupNCCL.cpp, unhandled system error (run with NCCL_DEBUG=INFO)")


@pytest.mark.slow
def test_a_failed_nccl_probe_picks_gloo_for_the_process_in_one_line(two_gpus_with_nccl, monkeypatch, capsys):
    _nccl_fails_in_the_ranks(monkeypatch, _unhandled_system_error)
    assert choose_backend(2) == "gloo"
    printed = capsys.readouterr().out
    assert printed.splitlines() == [printed.strip()] and "Traceback" not in printed
    assert re.fullmatch(r"nccl probe, one all-reduce on 2 ranks \(\d+\.\d s\): failed — rank \d: RuntimeError: NCCL error "
                        r"in: ProcessGroupNCCL\.cpp, unhandled system error \(run with NCCL_DEBUG=INFO\); launches from "
                        r"this process use gloo\n", printed), printed
    assert choose_backend(2) == "gloo" and capsys.readouterr().out == ""  # asked once per process
    # a launch that asks for nccl goes to gloo at once, in one line, without trying nccl again
    result = run_ranks(_sum_of_ranks, 2, args=(1.0,), backend="nccl", echo=False)
    assert result.backend == "gloo" and result.values[0][0] == 3.0
    assert capsys.readouterr().out.startswith("nccl failed its probe in this process (rank ")
    assert two_gpus_with_nccl == ["nccl", "gloo"]


@pytest.mark.slow
def test_a_hung_nccl_probe_ends_at_its_short_time_limit(two_gpus_with_nccl, monkeypatch, capsys):
    _nccl_fails_in_the_ranks(monkeypatch, lambda device: time.sleep(600))  # nccl's set-up never returns
    start = time.perf_counter()
    assert nccl_probe(2, timeout_s=3) == "the ranks ran past 3 s and were stopped"
    assert time.perf_counter() - start < 15
    assert "launches from this process use gloo" in capsys.readouterr().out


@pytest.mark.slow
def test_a_passed_nccl_probe_picks_nccl(two_gpus_with_nccl, monkeypatch, capsys):
    # nccl stood in for by gloo inside the ranks: the probe's own all-reduce runs for real and sums to 2
    real = distributed.init_rank
    monkeypatch.setattr(distributed, "init_rank", lambda backend, timeout_s: real("gloo", timeout_s))
    assert choose_backend(2) == "nccl" and nccl_probe(2) == ""
    assert re.fullmatch(r"nccl probe, one all-reduce on 2 ranks \(\d+\.\d s\): passed; launches from this process use "
                        r"nccl\n", capsys.readouterr().out)
    assert two_gpus_with_nccl == ["nccl"]


@pytest.mark.slow
def test_nccl_launch_that_cannot_run_falls_back_to_gloo(two_gpus_with_nccl, monkeypatch, capsys):
    import torch

    # a forked child is told it is in a bad fork (as after torch.cuda.is_available() initialised the driver), so forked
    # ranks cannot use CUDA: the probe fails before it forks
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: True)
    with pytest.raises(LaunchError, match="CUDA's driver is already initialised in this process"):
        run_ranks(_sum_of_ranks, 2, args=(1.0,), backend="nccl", fallback=None, echo=False)
    start = time.perf_counter()
    result = run_ranks(_sum_of_ranks, 2, args=(1.0,), backend="nccl", echo=False)
    assert time.perf_counter() - start < 30  # fails fast: no stall before the fallback
    assert result.backend == "gloo" and result.values[0][0] == 3.0
    assert "failed — CUDA's driver was initialised in this process before the fork" in capsys.readouterr().out
    # a launch that fails after a passed probe is tried again with gloo
    monkeypatch.setattr(distributed, "_NCCL_PROBES", {2: ""})
    result = run_ranks(_sum_of_ranks, 2, args=(1.0,), backend="nccl", echo=False)
    assert result.backend == "gloo" and "The nccl launch failed" in capsys.readouterr().out


def test_nccl_needs_a_gpu_per_rank(monkeypatch):
    import torch
    import torch.distributed as dist

    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(LaunchError, match="nccl needs a GPU per rank: 2 ranks, 1 GPU"):
        run_ranks(_sum_of_ranks, 2, args=(1.0,), backend="nccl", fallback=None, echo=False)


def test_choose_backend(monkeypatch):
    import torch
    import torch.distributed as dist

    monkeypatch.delenv("TML_BACKEND", raising=False)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    probed = []
    monkeypatch.setattr(distributed, "nccl_probe", lambda nproc: probed.append(nproc) or "")  # nccl passes its probe
    for gpus, nproc, wanted in ((0, 2, "gloo"), (1, 2, "gloo"), (2, 2, "nccl"), (8, 2, "nccl"), (2, 4, "gloo")):
        monkeypatch.setattr(torch.cuda, "device_count", lambda gpus=gpus: gpus)
        assert choose_backend(nproc) == wanted
    assert probed == [2, 2]  # only where nccl could run
    monkeypatch.setattr(distributed, "nccl_probe", lambda nproc: "it hung")
    assert choose_backend(2) == "gloo"
    monkeypatch.setattr(dist, "is_nccl_available", lambda: False)
    assert choose_backend(2) == "gloo"
    monkeypatch.setenv("TML_BACKEND", "NCCL")
    assert choose_backend(2) == "nccl"
    monkeypatch.setenv("TML_BACKEND", "mpi")
    with pytest.raises(ValueError, match="TML_BACKEND"):
        choose_backend(2)


def test_init_rank_sets_the_device_before_joining_nccl(monkeypatch):
    import torch
    import torch.distributed as dist

    calls = []
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.append(("set_device", str(device))))
    monkeypatch.setattr(dist, "init_process_group",
                        lambda backend, **kw: calls.append(("init", backend, str(kw.get("device_id")),
                                                            kw["timeout"].total_seconds())))
    assert str(init_rank("nccl", timeout_s=7)) == "cuda:3"
    assert calls == [("set_device", "cuda:3"), ("init", "nccl", "cuda:3", 7.0)]
    calls.clear()
    assert str(init_rank("gloo")) == "cpu"
    assert calls == [("init", "gloo", "None", 60.0)]


# --- scripts: fallbacks of the rank server ------------------------------------------------------------------------

@pytest.mark.integration  # forks a child
def test_fork_refusal_asks_a_forked_child(monkeypatch):
    import torch

    from labkit.rank_server import cuda_fork_poisoned, fork_refusal

    assert fork_refusal() == "" and not cuda_fork_poisoned()
    # torch.cuda.is_initialized() stays False after is_available() initialised the driver: it is not the signal.
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert fork_refusal() == ""
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: True)  # what a child forked after cuInit reads
    assert cuda_fork_poisoned() and "CUDA's driver is initialised" in fork_refusal()


@pytest.mark.slow
def test_refused_fork_starts_fresh_interpreters(tmp_path: Path, monkeypatch, capsys):
    from labkit.rank_server import ForkRefused, RankServer

    def refuse(self, argv, envs, cwd):
        raise ForkRefused("CUDA is initialised in the rank server, and a forked child cannot use it")

    monkeypatch.setattr(RankServer, "start", refuse)
    script = write_script("""
        import os, sys
        print("fresh" if "torch" not in sys.modules else "forked", os.environ["TML_BACKEND"])
    """, tmp_path)
    result = run_ranks(script, 2, backend="gloo", timeout=120)
    assert [result.lines_from_rank(r) for r in (0, 1)] == [["fresh gloo"], ["fresh gloo"]]
    assert "fresh interpreters instead" in capsys.readouterr().out


@pytest.mark.slow
def test_script_at_an_unfinished_exercise_raises_not_implemented(tmp_path: Path):
    script = write_script("""
        def exercise():
            raise NotImplementedError()
        exercise()
    """, tmp_path)
    with pytest.raises(NotImplementedError, match="unfinished exercise"):
        run_ranks(script, 2, timeout=120, echo=False)


@pytest.mark.slow
def test_a_rank_that_returns_first_makes_a_peers_unpartnered_all_reduce_fail_at_once():
    # notebook 07's claim 2: rank 1 takes one step more than rank 0; its last all-reduce has no partner
    def uneven_steps():
        import torch
        import torch.distributed as dist

        try:
            for _ in range(2 + dist.get_rank()):
                dist.all_reduce(torch.ones(3))
            return "finished"
        except RuntimeError:
            return "failed"

    start = time.perf_counter()
    assert run_ranks(uneven_steps, 2, backend="gloo", echo=False, timeout=40).values == ("finished", "failed")
    assert time.perf_counter() - start < 20, "rank 1 waited for its time limit instead of failing when rank 0 left"


@pytest.mark.slow
def test_a_function_that_joins_a_group_of_its_own_leaves_it_with_its_peers(tmp_path: Path):
    # an answer may leave the group it was given and join another (here on a file store of its own)
    def rejoins():
        import os

        import torch
        import torch.distributed as dist

        dist.all_reduce(torch.ones(1))
        dist.destroy_process_group()
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=int(os.environ["RANK"]),
                                world_size=2)
        total = torch.ones(1)
        dist.all_reduce(total)
        return float(total)

    start = time.perf_counter()
    assert run_ranks(rejoins, 2, backend="gloo", echo=False, timeout=30).values == (2.0, 2.0)
    assert time.perf_counter() - start < 20, "the ranks waited for the launch's time limit to leave the new group"


@pytest.mark.slow
def test_a_collective_that_never_completes_is_ended_by_the_launch_time_limit():
    # The group's collectives wait longer than the launch: a hung all-reduce is stopped by the launch's limit, as a
    # timeout (which grading reads as "ran out of time"), never by a gloo error racing it on a loaded machine.
    def lonely_all_reduce():
        import time

        import torch
        import torch.distributed as dist

        gloo = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
        print(f"collective timeout {gloo.options._timeout.total_seconds():g} s", flush=True)
        if dist.get_rank() == 0:
            dist.all_reduce(torch.ones(1))
        else:
            time.sleep(600)

    with pytest.raises(LaunchError, match="ran past 5 s and were stopped") as info:
        run_ranks(lonely_all_reduce, 2, backend="gloo", echo=False, timeout=5)
    timeouts = {float(t) for t in re.findall(r"collective timeout (\S+) s", str(info.value))}
    assert timeouts and min(timeouts) > 5, f"the collectives give up at {timeouts} s, not after the launch's 5 s"


@pytest.mark.slow
def test_the_rank_that_failed_first_is_named_even_when_it_aborted():
    # rank 1 dies of SIGABRT (gloo can abort in a shutdown after an error); rank 0 is stopped by the launcher, and its
    # output may close first: rank 1 is still the one whose failure explains the launch
    import subprocess
    import sys

    from labkit.launch import culprit, stream

    # rank 1's output outlives it by a second (a child holds it), so rank 0's, stopped at once, closes first
    code = {0: "import time; time.sleep(600)",
            1: "import os, signal, time\nif os.fork() == 0:\n    time.sleep(2)\n    os._exit(0)\n"
               "time.sleep(0.5)\nos.kill(os.getpid(), signal.SIGABRT)"}
    processes = [subprocess.Popen([sys.executable, "-c", code[rank]], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  start_new_session=True) for rank in (0, 1)]
    _, timed_out, closed = stream(processes, lambda rank, line: line, 60, False, stop_on_failure=True)
    codes = [p.returncode for p in processes]
    assert not timed_out and codes[1] == -6 and codes[0] < 0
    assert closed[0] == 1 and culprit(codes, closed) == 1
