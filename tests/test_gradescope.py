"""Gradescope's autograder (issue 22 item 1): the zip per Gradescope's specification, run in a Gradescope-shaped folder.

Fast: the zip's layout, which notebook a submission holds (and the refusals), results.json in both feedback modes.
Slow: the zip unpacked into <root>/source, prepared as setup.sh would, then `run_autograder` on submissions the way
Gradescope runs it (AUTOGRADER_ROOT and TML_PYTHON point it at this folder and this checkout's interpreter).
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import zipfile
from pathlib import Path

import nbformat
import pytest
from conftest import PYTHON, REPO, artifacts
from instructor_class import FULL, ONE, A
from unix_users import in_child

from grader.author.mutants import load_mutants, mutant_submission, reference_submission
from grader.course import assignment_named, assignments
from grader.platforms.gradescope import HELD_BACK, NETWORK_ASSIGNMENTS, Refused, build_zip, identify, results_json
from grader.results import Note, NoteKind, Result

FACTOR2 = next(m for m in load_mutants(A) if m.name == "mse_grad_missing_factor_2")
COPY_OF = "Copy of 01_gradient_descent.ipynb"  # what Colab's "Save a copy in Drive" names it


def test_the_zip_has_setup_and_run_autograder_at_its_root_and_no_developer_tools(tmp_path):
    count = build_zip(tmp_path / "a.zip", [A], "at-once", 12)
    with zipfile.ZipFile(tmp_path / "a.zip") as zf:
        names = zf.namelist()
        modes = {i.filename: i.external_attr >> 16 & 0o777 for i in zf.infolist()}
        settings = json.loads(zf.read("gradescope.json"))
        pins = zf.read("requirements-gradescope.txt").decode()
    assert len(names) == count and {"setup.sh", "run_autograder", "solutions/01_gradient_descent/01_gradient_descent.ipynb",
                                     "grader/platforms/student_kernel.py", "helpers/__init__.py"} <= set(names)
    assert modes["setup.sh"] == modes["run_autograder"] == 0o755
    assert settings == {"assignments": [ONE], "feedback": "at-once", "timeout": 12}
    assert "torch==" in pins and "nbgrader==" in pins and "pytest" not in pins and "playwright" not in pins
    assert not [n for n in names if "__pycache__" in n or n.startswith(("build/", ".venv/", "tests/"))]
    build_zip(tmp_path / "b.zip", [A], "at-once", 12)
    assert (tmp_path / "a.zip").read_bytes() == (tmp_path / "b.zip").read_bytes()  # the same course, the same bytes


def hand_in(folder: Path, files: dict[str, object]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, nbformat.NotebookNode):
            nbformat.write(content, path)
        else:
            path.write_text(str(content))
    return folder


TWO = assignment_named("02")
REFUSALS = {
    "nothing": ({}, "No notebook (.ipynb) in your submission (it is empty): hand in 01_gradient_descent.ipynb."),
    "no notebook": ({"answers.py": "x = 1"}, "No notebook (.ipynb) in your submission (found: answers.py)"),
    "two notebooks": ({"a.ipynb": reference_submission(A), "b/b.ipynb": reference_submission(A)},
                      "Your submission has 2 notebooks (a.ipynb, b/b.ipynb): hand in one, 01_gradient_descent.ipynb."),
    "foreign": ({"mine.ipynb": nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(1)")])},
                "mine.ipynb is not one of the course's notebooks"),
    "another assignment": ({"02_autograd_graph.ipynb": reference_submission(TWO)},
                           "02_autograd_graph.ipynb is notebook 02_autograd_graph; this assignment grades "
                           "01_gradient_descent.ipynb."),
    "not json": ({"01_gradient_descent.ipynb": "{not json"}, "01_gradient_descent.ipynb is not a readable notebook"),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_what_cannot_be_graded_is_refused_with_a_message_for_the_student(tmp_path, case):
    files, says = REFUSALS[case]
    with pytest.raises(Refused) as why:
        identify(hand_in(tmp_path / "submission", files), [A])
    assert says in str(why.value)


def test_a_renamed_notebook_and_its_checkpoint_are_one_notebook(tmp_path):
    folder = hand_in(tmp_path / "submission", {COPY_OF: reference_submission(A),
                                               ".ipynb_checkpoints/x-checkpoint.ipynb": reference_submission(A)})
    assert identify(folder, [A]) == (folder / COPY_OF, A)
    assert identify(folder, [])[1] == A  # a zip for every assignment: the notebook says which it is


def test_a_notebook_whose_cell_metadata_a_tool_dropped_is_known_by_its_cell_ids(tmp_path):
    stripped = reference_submission(A)
    for cell in stripped.cells:
        cell.metadata = {}  # what some editors and converters keep: the sources and the cell ids
    folder = hand_in(tmp_path / "submission", {"01_gradient_descent.ipynb": stripped})
    assert identify(folder, [A]) == (folder / "01_gradient_descent.ipynb", A)


def graded_row() -> Result:
    scores = {**FULL, "mse_grad": 0.0, "critical_lr": 0.0}
    return Result("submission", ONE, scores, dict(FULL), [Note(NoteKind.RENAMED, f"renamed: graded {COPY_OF} as {ONE}.ipynb")],
                  messages={"mse_grad": "off by a factor of 0.5", "critical_lr": "wrong"}, mistakes={"mse_grad": FACTOR2.name})


def test_results_json_after_release_holds_the_messages_until_the_due_date():
    out = results_json(graded_row(), A, "after-release", 3.0)
    assert out["score"] == 5 and out["visibility"] == "visible" and out["stdout_visibility"] == "hidden"
    tests = {t["name"]: t for t in out["tests"]}
    assert list(tests) == list(FULL) and [t["number"] for t in out["tests"]] == [str(i) for i in range(1, len(FULL) + 1)]
    assert {t["visibility"] for t in out["tests"]} == {"after_due_date"}
    assert tests["mse_grad"] == {"name": "mse_grad", "number": "1", "score": 0.0, "max_score": 3.0, "status": "failed",
                                 "output": f"off by a factor of 0.5\nThis looks like a known mistake: {FACTOR2.why}.",
                                 "visibility": "after_due_date"}
    assert tests["numerical_grad"]["output"] == "passed" and tests["numerical_grad"]["status"] == "passed"
    assert out["output"].splitlines()[:2] == [f"{ONE}: 5 / 10 points", "  mse_grad: 0 / 3"]
    assert f"  renamed: graded {COPY_OF} as {ONE}.ipynb" in out["output"]


@pytest.mark.parametrize(("seconds", "kept"), [(9.6349, 9.6), (123.456, 120.0), (1234.5, 1200.0)])
def test_results_json_keeps_the_run_time_to_two_significant_digits(seconds, kept):
    # a hand-in's scenarios can stretch the run: its time is a channel, counted at 2 digits like the other timings
    assert results_json(graded_row(), A, "at-once", seconds)["execution_time"] == kept


def test_results_json_at_once_shows_points_only():
    out = results_json(graded_row(), A, "at-once", 3.0)
    assert {t["visibility"] for t in out["tests"]} == {"visible"}
    failed = graded_row().messages
    assert [t["output"] for t in out["tests"]] == [f"not passed — {HELD_BACK}" if name in failed else "passed" for name in FULL]
    assert "off by a factor" not in json.dumps(out)


def test_in_user_isolation_only_the_notebooks_that_start_ranks_keep_the_network():
    # gloo's ranks (helpers.distributed) meet over loopback TCP; every other kernel gets AF_UNIX sockets only
    starts_ranks = {a.name for a in assignments() if "from helpers.distributed import" in a.source.read_text()}
    assert NETWORK_ASSIGNMENTS == starts_ranks == {"07_distributed"}


# --- slow: the zip in a Gradescope-shaped folder -------------------------------------------------------------------

def unpack(archive: Path, root: Path) -> Path:
    """What Gradescope does with the zip: unpacked into <root>/source, run_autograder copied to <root>."""
    source = root / "source"
    with zipfile.ZipFile(archive) as zf:
        for info in zf.infolist():
            zf.extract(info, source)
            (source / info.filename).chmod(info.external_attr >> 16 & 0o777)
    shutil.copy2(source / "run_autograder", root / "run_autograder")
    return source


def run_autograder(root: Path, files: dict, **env) -> tuple[dict | None, subprocess.CompletedProcess, float]:
    for folder in ("submission", "results"):
        shutil.rmtree(root / folder, ignore_errors=True)
    hand_in(root / "submission", files)
    (root / "results").mkdir()
    started = time.perf_counter()
    done = subprocess.run([str(root / "run_autograder")], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "AUTOGRADER_ROOT": str(root), "TML_PYTHON": PYTHON, **env})
    seconds = time.perf_counter() - started
    results = root / "results" / "results.json"
    return (json.loads(results.read_text()) if results.exists() else None), done, seconds


def prepared_root(root: Path, python: str, **env: str) -> Path:
    """`root` made a Gradescope-shaped folder with the zip of notebook 01 unpacked and prepared with `python`
    (setup.sh's last step)."""
    subprocess.run([PYTHON, "-m", "grader", "gradescope", str(root / "autograder.zip"), "--assignment", "01",
                    "--timeout", "10"], cwd=REPO, check=True, capture_output=True)
    source = unpack(root / "autograder.zip", root)
    # The reference records are content-addressed (sources, probe, torch, Python): this checkout's are valid there.
    for cached in (REPO / "build" / "reference-records").glob(f"{ONE}-*.json"):
        (source / "build" / "reference-records").mkdir(parents=True, exist_ok=True)
        shutil.copy(cached, source / "build" / "reference-records")
    prepared = subprocess.run([python, "-m", "grader.platforms.gradescope", "prepare"], cwd=source, capture_output=True,
                              text=True, timeout=900, env={**os.environ, "PYTHONPATH": str(source), **env})
    assert prepared.returncode == 0, prepared.stdout + prepared.stderr
    return root


@pytest.fixture(scope="module")
def gradescope_root(tmp_path_factory):
    return prepared_root(tmp_path_factory.mktemp("autograder"), PYTHON)


@pytest.mark.slow
def test_run_autograder_grades_a_copy_of_the_notebook_per_exercise_and_refuses_what_it_cannot_grade(gradescope_root):
    from grader.kernel import sandbox

    if sandbox.why_unavailable() and os.environ.get("CI") != "true":
        pytest.skip(f"the sandbox cannot be built here: {sandbox.why_unavailable()}")
    results, done, seconds = run_autograder(gradescope_root, {COPY_OF: mutant_submission(A, [FACTOR2]), "notes.txt": "hi"})
    assert done.returncode == 0 and results is not None, done.stdout + done.stderr
    tests = {t["name"]: (t["score"], t["max_score"]) for t in results["tests"]}
    assert tests == {"mse_grad": (0.0, 3.0), "numerical_grad": (2.0, 2.0), "gradient_descent": (2.0, 2.0),
                     "critical_lr": (2.0, 2.0), "best_momentum": (1.0, 1.0)} and results["score"] == 7
    mse = next(t for t in results["tests"] if t["name"] == "mse_grad")
    assert f"This looks like a known mistake: {FACTOR2.why}." in mse["output"] and mse["visibility"] == "after_due_date"
    assert f"renamed: graded {COPY_OF} as {ONE}.ipynb" in results["output"]
    (artifacts("gradescope") / "per-submission.json").write_text(json.dumps(
        {"seconds": round(seconds, 1), "execution_time": results["execution_time"], "cpus": os.cpu_count(),
         "load_average": os.getloadavg(), "stdout": done.stdout}, indent=1))
    print(f"one Gradescope submission: {seconds:.1f} s wall, run_autograder included ({os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.1f}); {done.stdout.strip()}")
    for case in ("two notebooks", "foreign"):
        files, says = REFUSALS[case]
        refused, done, _ = run_autograder(gradescope_root, files)
        assert done.returncode == 0 and refused is not None, done.stdout + done.stderr
        assert refused["score"] == 0 and says in refused["output"] and refused["visibility"] == "visible"


def unused_uid() -> int:
    """A uid no process on this machine runs as (the launcher stops every process of its user)."""
    if os.geteuid() != 0:
        pytest.skip("only root can run kernels as another user (Gradescope's run_autograder runs as root)")
    uid = 64000 + os.getpid() % 1000
    if any(Path(f"/proc/{p}").stat().st_uid == uid for p in os.listdir("/proc") if p.isdigit()):
        pytest.skip(f"uid {uid} is in use on this machine")
    return uid


@pytest.mark.integration  # forks a child that becomes the student
def test_the_student_kernel_launcher_drops_to_the_user_before_anything_runs(tmp_path):
    from grader.platforms.student_kernel import become_student

    uid = unused_uid()
    secret = tmp_path / "secret"  # under pytest's folder for root: the user cannot even get there
    secret.mkdir(mode=0o700)
    kernel = Path(tempfile.mkdtemp(prefix="kernel-"))  # where plain_kernel_factory puts a kernel's files
    connection = kernel / "connection.json"
    connection.write_text("{}")

    def what_the_kernel_finds() -> dict:  # the launcher's steps, then what the kernel would find
        os.environ["TML_STUDENT_UID"] = str(uid)
        become_student(str(connection))
        status = Path("/proc/self/status").read_text()
        try:
            os.listdir(secret)
            reached = "reached"
        except PermissionError:
            reached = "refused"
        return {"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(), "cwd": os.getcwd(),
                "secret": reached, "no_new_privs": "NoNewPrivs:\t1" in status, "home": os.environ["HOME"]}

    found = in_child(what_the_kernel_finds)
    try:
        assert found == {"uid": uid, "gid": uid, "groups": [], "cwd": str(kernel), "secret": "refused",
                         "no_new_privs": True, "home": str(kernel)}
        assert connection.stat().st_uid == kernel.stat().st_uid == uid
    finally:
        shutil.rmtree(kernel)


def runnable_by_others(path: Path) -> str:
    """'' when another user can run the interpreter at `path`, else the folder or file that stops them."""
    real = Path(os.path.realpath(path))
    for folder in reversed(real.parents):
        if not folder.stat().st_mode & 0o001:
            return str(folder)
    return "" if real.stat().st_mode & 0o005 == 0o005 else str(real)


def student_python(folder: Path) -> dict[str, str]:
    """What runs Gradescope's grading with an interpreter the student's user can run (TML_PYTHON, PATH): this one,
    else (it is behind a folder only its owner enters, like pyenv's under /root) a venv in `folder` on the system's
    Python of the same version that adds this interpreter's packages, as Gradescope's setup.sh installs its Python
    where every user can run it (its tools, nbgrader's `alembic`, stay this interpreter's)."""
    if not runnable_by_others(Path(PYTHON)):
        return {"TML_PYTHON": PYTHON}
    system = Path(f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}")
    if not system.exists() or runnable_by_others(system):
        pytest.skip(f"this interpreter ({os.path.realpath(PYTHON)}) is behind {runnable_by_others(Path(PYTHON))}, which "
                    f"other users cannot enter, and there is no {system} to stand in for it")
    subprocess.run([str(system), "-m", "venv", "--without-pip", str(folder)], check=True)
    packages = sysconfig.get_paths()["purelib"]
    (Path(sysconfig.get_paths(vars={"base": str(folder)})["purelib"]) / "course.pth").write_text(
        f"import site; site.addsitedir({packages!r})\n")
    return {"TML_PYTHON": str(folder / "bin" / "python"),
            "PATH": os.pathsep.join([str(folder / "bin"), str(Path(PYTHON).parent), os.environ["PATH"]])}


@pytest.fixture(scope="module")
def user_mode():
    """(a Gradescope-shaped folder prepared by an interpreter the student's user can run, the environment that
    runs it, a uid), everything where that user can reach it (pytest's own folders are for root only)."""
    uid = unused_uid()
    top = Path(tempfile.mkdtemp(prefix="tml-gradescope-"))
    top.chmod(0o755)
    env = student_python(top / "venv")
    (top / "autograder").mkdir()
    try:
        yield prepared_root(top / "autograder", env["TML_PYTHON"], **env), env, uid
    finally:
        shutil.rmtree(top, ignore_errors=True)


# In the student's own cell (the same kernel as the hidden scenarios): the grader's files, the network (the attack
# of review F2 sent the hidden scenario to a TCP listener), and memory beyond the limit.
USER_MODE_PROBE = """
import os, pathlib, resource, socket
leak = pathlib.Path({leak!r})
def tried(name, attempt):
    try:
        attempt()
        (leak / name).write_text("reached")
    except (OSError, MemoryError):
        pass
(leak / "uid").write_text(str(os.getuid()))
(leak / "limits").write_text(repr([resource.getrlimit(r) for r in (resource.RLIMIT_AS, resource.RLIMIT_NPROC)]))
tried("build", lambda: os.listdir({build!r}))
tried("solutions", lambda: os.listdir({solutions!r}))
tried("results", lambda: open({results!r}, "w").write("{{}}"))
tried("tcp", lambda: socket.create_connection(("127.0.0.1", {port}), timeout=3).sendall(b"hidden tests"))
tried("tcp6", lambda: socket.socket(socket.AF_INET6, socket.SOCK_DGRAM))
tried("packet", lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW))
tried("memory", lambda: bytearray({memory}).__len__())
unix = socket.socketpair()  # the kernel's own kind of socket still works
(leak / "unix").write_text(str(unix[0].family))
if "GRADESCOPE_API_TOKEN" in os.environ:  # run_autograder's environment
    (leak / "token").write_text("reached")
import subprocess
subprocess.Popen(["sleep", "300"], start_new_session=True)  # a daemon, which outlives the kernel
"""


@pytest.mark.slow
def test_without_the_sandbox_student_code_runs_as_an_unprivileged_user_with_no_network_and_the_memory_limit(user_mode):
    from grader.kernel.limits import Limits

    root, env, uid = user_mode
    limits = Limits.from_env()
    leak = Path(f"/tmp/tml-leak-{os.getpid()}")
    leak.mkdir(mode=0o777)
    leak.chmod(0o777)
    source = root / "source"
    with socket.create_server(("127.0.0.1", 0)) as listener:
        probe = USER_MODE_PROBE.format(leak=str(leak), build=str(source / "build"), solutions=str(source / "solutions"),
                                       results=str(root / "results" / "results.json"), memory=limits.memory_bytes,
                                       port=listener.getsockname()[1])
        nb = reference_submission(A)
        nb.cells.insert(len(nb.cells) - 1, nbformat.v4.new_code_cell(probe))
        try:
            results, done, _ = run_autograder(root, {f"{ONE}.ipynb": nb}, **env, TML_GRADESCOPE_ISOLATION="user",
                                              TML_STUDENT_UID=str(uid), GRADESCOPE_API_TOKEN="an instructor's secret")
            assert done.returncode == 0 and results is not None, done.stdout + done.stderr
            assert results["score"] == 10, results
            assert (leak / "uid").read_text() == str(uid)  # the probe ran, as that user
            # and reached none of the grader's files, no network, no memory beyond the limit
            assert sorted(p.name for p in leak.iterdir()) == ["limits", "uid", "unix"]
            assert (leak / "limits").read_text() == repr([(limits.address_space_bytes,) * 2, (limits.processes,) * 2])
            assert (leak / "unix").read_text() == str(socket.AF_UNIX)
            listener.setblocking(False)
            with pytest.raises(BlockingIOError):
                listener.accept()  # nobody connected
            assert not [p for p in os.listdir("/proc") if p.isdigit() and Path(f"/proc/{p}").stat().st_uid == uid
                        and "State:\tZ" not in Path(f"/proc/{p}/status").read_text()]  # the daemon is gone
        finally:
            shutil.rmtree(leak, ignore_errors=True)
