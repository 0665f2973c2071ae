"""A class of 30+ submissions of notebook 01 — correct, wrong, broken and hostile — graded in one run.

Each hostile submission attacks one promise of the grader; the CSV is compared row by row with the
points and status each must get. Then the class is graded again, sequentially and from scratch,
and must give the same CSV; and an interrupted batch resumes without regrading what was done.
Attacks that try to read what the sandbox hides *earn* points only when the read succeeds, so a
sandbox leak shows up as unexpected points.
"""

import json
import shutil
import subprocess

import nbformat
import pytest

from conftest import PYTHON, REPO, autograde, read_rows
from grader import sandbox
from grader.autograde import SandboxUnavailable
from grader.autograde import autograde as autograde_in_process
from grader.bundle import bundle, bundle_leaks
from grader.course import assignment_named
from grader.mutants import load_mutants, mutant_submission, reference_answers, reference_submission
from grader.release import secret_lines
from grader.selftest import Expected, mismatches, put

pytestmark = pytest.mark.slow
ONE = "01_gradient_descent"
TIMEOUT = "10"  # seconds per cell: the slowest reference cell takes under 1 s


def _cells(nb):
    return {c.metadata.get("nbgrader", {}).get("grade_id"): c for c in nb.cells}


def with_code(cell: str, extra: str, base=None) -> nbformat.NotebookNode:
    """The reference submission with `extra` appended to the answer cell `cell`."""
    nb = base or reference_submission(assignment_named(ONE))
    _cells(nb)[cell].source += "\n" + extra
    return nb


def with_answer(cell: str, source: str) -> nbformat.NotebookNode:
    nb = reference_submission(assignment_named(ONE))
    _cells(nb)[cell].source = source
    return nb


def earns_only_if(condition: str) -> str:
    """An mse_grad that is right only when `condition` (an attack's success) holds."""
    return (
        "def mse_grad(w, X, y):\n"
        f"    if {condition}:\n"
        "        return (2.0 / X.shape[0]) * X.T @ (X @ w - y)\n"
        "    return torch.zeros_like(w)\n"
    )


@pytest.fixture(scope="module")
def graded_class(tmp_path_factory):
    a = assignment_named(ONE)
    full = a.grade_cells()
    zero = {k: 0.0 for k in full}
    answers = reference_answers(a)
    root = tmp_path_factory.mktemp("class")
    cls = root / "class"
    expected: dict[tuple[str, str], Expected] = {}

    def add(student, nb, scores, status="ok"):
        if nb is not None:
            put(cls, student, a, nb)
        expected[student, ONE] = Expected(scores, status)

    def raw(student, name, content: str | bytes):
        (cls / student / ONE).mkdir(parents=True, exist_ok=True)
        path = cls / student / ONE / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())

    # correct, blank and wrong work
    for i in range(3):
        add(f"correct-{i}", reference_submission(a), full)
    add("blank", nbformat.read(a.release, as_version=4), zero)
    for mutant in load_mutants(a)[::3]:
        broken = {k: 0.0 for k in mutant.breaks}
        add(f"wrong-{mutant.name}", mutant_submission(a, [mutant]), {**full, **broken})

    # files that are not what they should be
    raw("corrupted-json", a.notebook, '{"cells": [ this is not json')
    add("corrupted-json", None, zero, "invalid notebook: JSONDecodeError")
    raw("binary-garbage", a.notebook, bytes(range(256)) * 4)
    add("binary-garbage", None, zero, "invalid notebook")
    old = json.loads(nbformat.writes(reference_submission(a)))
    old["nbformat"] = 3
    raw("wrong-nbformat", a.notebook, json.dumps(old))
    add("wrong-nbformat", None, zero, "invalid notebook: ValueError: nbformat 3")
    raw("nothing-handed-in", "notes.txt", "forgot the notebook")
    add("nothing-handed-in", None, zero, "missing notebook 01_gradient_descent.ipynb (found: no notebook)")
    raw("renamed", "my_work.ipynb", nbformat.writes(reference_submission(a)))
    raw("renamed", "scratch.txt", "x")
    add("renamed", None, full, "renamed: graded my_work.ipynb as 01_gradient_descent.ipynb; extra files ignored: scratch.txt")

    # tampering with cells: undone from the source, named in the status
    nb = reference_submission(a)
    nb.cells = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") != "critical_lr"]
    add("deleted-test-cell", nb, full, "tampered: deleted cell critical_lr restored")
    add("edited-test-cell", with_answer("mse_grad", "print('all tests passed')"), full,
        "tampered: edited locked cell mse_grad restored")
    add("edited-read-only-cell", with_answer("setup", "X = y = None"), full, "tampered: edited locked cell setup restored")
    nb = reference_submission(a)
    _cells(nb)["gradient_descent"].metadata.nbgrader.update(grade=False, points=100)
    add("changed-metadata", nb, full, "tampered: changed metadata of gradient_descent restored")
    nb = reference_submission(a)
    nb.cells.append(nb.cells[[i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == "mse_grad"][0]].copy())
    add("duplicated-test-cell", nb, full, "tampered: duplicated cell mse_grad ignored")
    nb = reference_submission(a)
    nb.cells = []
    add("emptied-notebook", nb, zero, "tampered: deleted answer cell mse_grad_answer restored")

    # changing what the tests call: no points for the tests it could fool
    wrong_mse = "def mse_grad(w, X, y):\n    return torch.zeros_like(w)"
    add("shadows-check", with_answer("mse_grad_answer", wrong_mse + "\ncheck_tensor = lambda *args, **kwargs: None"),
        zero, "tampered: cell mse_grad_answer redefines 'check_tensor', which the tests use")
    add("patches-torch", with_code("critical_lr_answer", "torch.linalg.eigvalsh = lambda H: torch.ones(1)"),
        {**full, "critical_lr": 0.0}, "tampered: cell critical_lr_answer patches torch.linalg.eigvalsh")
    add("hooks-ipython", with_code("numerical_grad_answer", "get_ipython().events.register('pre_run_cell', print)"),
        {**full, "numerical_grad": 0.0, "gradient_descent": 0.0, "critical_lr": 0.0},
        "tampered: cell numerical_grad_answer calls get_ipython()")
    nb = reference_submission(a)
    added = nbformat.v4.new_code_cell("import helpers.checks\nhelpers.checks.check_scalar = lambda *a, **k: None")
    index = [i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == "gradient_descent"][0]
    nb.cells.insert(index + 1, added)
    add("patches-helpers-in-own-cell", nb, {**full, "critical_lr": 0.0}, "patches helpers.checks.check_scalar")
    add("reads-test-source", with_code("mse_grad_answer", "leak = In[-1]"),
        zero, "tampered: cell mse_grad_answer uses In")

    # reaching outside: the sandbox hides files and the network (points only if the attack works)
    solution = str(a.source)
    add("reads-solutions", with_answer("mse_grad_answer", "import os\n" + earns_only_if(f"os.path.exists({solution!r})")),
        {**full, "mse_grad": 0.0, "gradient_descent": 0.0})
    add("reads-other-students", with_answer("mse_grad_answer", "import os\n" + earns_only_if(
        f"os.path.exists({str(cls / 'correct-0')!r})")), {**full, "mse_grad": 0.0, "gradient_descent": 0.0})
    add("reads-hidden-tests-in-cwd", with_answer("mse_grad_answer", "import glob\n" + earns_only_if(
        "glob.glob('*.ipynb') or glob.glob('../*/*.ipynb')")), {**full, "mse_grad": 0.0, "gradient_descent": 0.0})
    add("uses-network", with_answer("mse_grad_answer", "import socket\n" + earns_only_if(
        "any(name != 'lo' for _, name in socket.if_nameindex())")), {**full, "mse_grad": 0.0, "gradient_descent": 0.0})

    # failing while running: the cells before keep their points
    add("never-finishes", with_code("numerical_grad_answer", "while True:\n    pass"), full,
        "timeout in cell numerical_grad_answer")
    add("ignores-interrupt", with_code("gradient_descent_answer",
                                       "import time\nwhile True:\n    try:\n        time.sleep(0.05)\n"
                                       "    except KeyboardInterrupt:\n        pass"),
        {**full, "gradient_descent": 0.0, "critical_lr": 0.0}, "timeout in cell gradient_descent_answer")
    add("kernel-dies", with_answer("critical_lr_answer", "import os\nos._exit(1)"), {**full, "critical_lr": 0.0},
        "kernel died in cell critical_lr_answer")
    add("eats-memory", with_code("critical_lr_answer", "hog = bytearray(8 * 2**30)"), full,
        "out of memory in cell critical_lr_answer")
    add("floods-output", with_code("numerical_grad_answer", "print('x' * 3_000_000)"), full,
        "output too large in cell numerical_grad_answer")

    out = root / "graded"
    autograde(cls, out, "--timeout", TIMEOUT)
    assert len(expected) >= 30
    return expected, out, cls


def test_every_submission_gets_its_points_and_status(graded_class):
    expected, out, _ = graded_class
    assert mismatches(read_rows(out), expected) == []


def test_feedback_never_shows_hidden_tests_or_tracebacks(graded_class):
    _, out, _ = graded_class
    hidden = secret_lines(nbformat.read(assignment_named(ONE).source, as_version=4), solutions=False)
    pages = sorted((out / "feedback").rglob("*.html"))
    assert len(pages) >= 20
    for page in pages:
        text = page.read_text()
        assert not [line for line in hidden if line in text], f"{page} shows hidden test lines"
        assert "BEGIN HIDDEN TESTS" not in text
    wrong = (out / "feedback" / "wrong-gradient_descent_ascends" / ONE / f"{ONE}.html").read_text()
    assert "CheckFailure" in wrong and "most recent call last" not in wrong  # message kept, traceback dropped


def test_regrading_from_scratch_one_at_a_time_gives_the_same_csv(graded_class):
    _, out, cls = graded_class
    again = out.parent / "graded-again"
    autograde(cls, again, "--timeout", TIMEOUT, "--jobs", "1", "--force")
    assert (again / "grades.csv").read_text() == (out / "grades.csv").read_text()


def test_an_interrupted_batch_resumes_without_regrading(graded_class):
    _, out, cls = graded_class
    resumed = out.parent / "resumed"
    shutil.copytree(out, resumed)
    results = resumed / ".work" / "results"
    # as if the batch had stopped before these two finished
    for student in ("correct-1", "blank"):
        (results / student / f"{ONE}.fingerprint").unlink()
    kept = (results / "correct-0" / f"{ONE}.json").stat().st_mtime_ns
    autograde(cls, resumed, "--timeout", TIMEOUT)
    assert (resumed / "grades.csv").read_text() == (out / "grades.csv").read_text()
    assert (results / "correct-0" / f"{ONE}.json").stat().st_mtime_ns == kept
    assert (results / "blank" / f"{ONE}.fingerprint").exists()


def test_a_kernel_leaves_nothing_behind_for_the_next_student(tmp_path):
    """One worker grades all three in order: traps set by the first must not reach the second or stop the third."""
    a = assignment_named(ONE)
    full = a.grade_cells()
    shared = "glob.glob('/tmp/work') + glob.glob('/dev/shm') + glob.glob('/tmp/forkserver-*/runtime')"
    traps = (
        "import glob, os, signal, subprocess\n"
        f"for folder in {shared}:\n"
        "    open(os.path.join(folder, 'planted'), 'w').write('x')\n"
        "subprocess.Popen(['python', '-c', 'import time\\nwhile True: time.sleep(0.1)'], start_new_session=True)\n"
        "for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGSTOP, signal.SIGKILL):\n"
        "    os.kill(1, sig)  # the fork server, PID 1 of the sandbox\n"
    )
    look = (
        "import glob, os\n"
        f"leftover = [f for folder in {shared} for f in glob.glob(os.path.join(folder, 'planted'))]\n"
        "leftover += [p for p in os.listdir('/proc') if p.isdigit() and int(p) not in (1, os.getpid())]\n"
    )
    cls = tmp_path / "class"
    put(cls, "a-sets-traps", a, with_code("mse_grad_answer", traps))
    put(cls, "b-finds-traps", a, with_answer("mse_grad_answer", look + earns_only_if("leftover")))
    put(cls, "c-correct", a, reference_submission(a))
    autograde(cls, tmp_path / "out", "--timeout", TIMEOUT, "--jobs", "1")
    expected = {
        ("a-sets-traps", ONE): Expected(full, "ok"),
        ("b-finds-traps", ONE): Expected({**full, "mse_grad": 0.0, "gradient_descent": 0.0}, "ok"),
        ("c-correct", ONE): Expected(full, "ok"),
    }
    assert mismatches(read_rows(tmp_path / "out"), expected) == []


def test_grading_refuses_without_the_sandbox(tmp_path, monkeypatch):
    monkeypatch.setattr(sandbox, "bwrap_works", lambda: False)
    with pytest.raises(SandboxUnavailable, match="--unsandboxed"):
        autograde_in_process(tmp_path, tmp_path / "out")


def test_sandbox_is_installed_by_the_setup():
    assert sandbox.bwrap_works(), "bubblewrap must be installed by ./course setup"
    assert (sandbox.kernelspec_dir() / "kernel.json").exists()


def test_student_bundle_holds_no_solution(tmp_path):
    files = bundle(tmp_path / "bundle")
    names = {p.relative_to(tmp_path / "bundle").parts[0] for p in files}
    assert names == {"notebooks", "helpers", "course", "requirements.txt", "environment.yml", "pyproject.toml", "README.md"}
    assert bundle_leaks(tmp_path / "bundle") == []
    run = subprocess.run([PYTHON, "-m", "grader", "bundle", str(tmp_path / "second")], cwd=REPO,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout
