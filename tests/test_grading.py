"""The grader grades: reference full, blank 0, every mutant loses its points, and a messy class survives.

Both classes go through `python -m grader autograde` itself (a subprocess), as an instructor runs it.
"""

import csv
import json
import subprocess
import zipfile

import nbformat
import pytest

from conftest import PYTHON, REPO
from grader.course import assignment_named, assignments
from grader.mutants import load_mutants, mutant_submission, reference_answers, reference_submission
from grader.release import secret_lines
from grader.selftest import Expected, mismatches, put, write_selftest_class
from grader.submissions import collect, unpack_zip

pytestmark = pytest.mark.slow
ONE = "01_gradient_descent"


def autograde(submissions, out, *extra):
    run = subprocess.run([PYTHON, "-m", "grader", "autograde", str(submissions), "--out", str(out), *extra],
                         cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    return run


def read_rows(out):
    with open(out / "grades.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    fixed = {"student", "assignment", "total", "max_total", "status"}
    return {
        (r["student"], r["assignment"]): ({k: float(v) for k, v in r.items() if k not in fixed and v != ""}, r["status"])
        for r in rows
    }


@pytest.fixture(scope="module")
def selftest(tmp_path_factory):
    root = tmp_path_factory.mktemp("selftest")
    expected = write_selftest_class(root / "class", assignments())
    autograde(root / "class", root / "graded", "--timeout", "120")
    return expected, read_rows(root / "graded"), root / "graded"


def test_reference_blank_and_every_mutant_score_as_expected(selftest):
    expected, rows, _ = selftest
    assert mismatches(rows, expected) == []


def test_every_exercise_has_mutants_in_the_class(selftest):
    expected, _, _ = selftest
    for assignment in assignments():
        broken = {gid for (student, name), exp in expected.items()
                  if name == assignment.name and student.startswith("mutants-")
                  for gid, points in exp.scores.items() if points == 0}
        assert broken == set(assignment.grade_cells()), f"{assignment.name}: exercises without a failing mutant"


def test_feedback_shows_no_hidden_test(selftest):
    _, _, graded = selftest
    pages = list((graded / "feedback").rglob("*.html"))
    assert pages, "no feedback was written"
    for assignment in assignments():
        hidden = secret_lines(nbformat.read(assignment.source, as_version=4), solutions=False)
        for page in (graded / "feedback").glob(f"*/{assignment.name}/*.html"):
            text = page.read_text()
            leaked = [line for line in hidden if line in text]
            assert not leaked, f"{page} shows hidden test lines: {leaked[:3]}"


# ---- one class with every kind of trouble, graded in one run ----

def _with_answer(source: str, cell: str) -> nbformat.NotebookNode:
    a = assignment_named(ONE)
    nb = reference_submission(a)
    for c in nb.cells:
        if c.metadata.get("nbgrader", {}).get("grade_id") == cell:
            c.source = source
    return nb


def _without(grade_id: str) -> nbformat.NotebookNode:
    nb = reference_submission(assignment_named(ONE))
    nb.cells = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") != grade_id]
    return nb


def _edited(grade_id: str, source: str) -> nbformat.NotebookNode:
    nb = reference_submission(assignment_named(ONE))
    for c in nb.cells:
        if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id:
            c.source = source
    return nb


@pytest.fixture(scope="module")
def messy_class(tmp_path_factory):
    a = assignment_named(ONE)
    full = a.grade_cells()
    zero = {k: 0.0 for k in full}
    answers = reference_answers(a)
    root = tmp_path_factory.mktemp("messy")
    cls = root / "class"
    expected: dict[tuple[str, str], Expected] = {}

    def add(student, nb, scores, status="ok"):
        if nb is not None:
            put(cls, student, a, nb)
        expected[student, ONE] = Expected(scores, status)

    add("correct", reference_submission(a), full)
    add("blank", nbformat.read(a.release, as_version=4), zero)
    ascends = next(m for m in load_mutants(a) if m.name == "gradient_descent_ascends")
    add("wrong", mutant_submission(a, [ascends]), {**full, "gradient_descent": 0.0})
    add("deleted-test-cell", _without("critical_lr"), full, "tampered: deleted cell critical_lr restored")
    add("edited-test-cell", _edited("mse_grad", "print('all tests passed')"), full,
        "tampered: edited locked cell mse_grad restored")
    add("edited-read-only-cell", _edited("setup", "X = y = None"), full, "tampered: edited locked cell setup restored")
    add("never-finishes", _with_answer(answers["numerical_grad_answer"] + "\nwhile True:\n    pass\n",
                                       "numerical_grad_answer"), full, "timeout in cell numerical_grad_answer")
    resist = answers["gradient_descent_answer"] + (
        "\nimport time\nwhile True:\n    try:\n        time.sleep(0.05)\n    except KeyboardInterrupt:\n        pass\n")
    add("ignores-interrupt", _with_answer(resist, "gradient_descent_answer"),
        {**full, "gradient_descent": 0.0, "critical_lr": 0.0}, "timeout in cell gradient_descent_answer")
    add("kernel-dies", _with_answer("import os\nos._exit(1)", "critical_lr_answer"), {**full, "critical_lr": 0.0},
        "kernel died in cell critical_lr_answer")
    (cls / "corrupted-json" / ONE).mkdir(parents=True)
    (cls / "corrupted-json" / ONE / a.notebook).write_text('{"cells": [ this is not json')
    add("corrupted-json", None, zero, "invalid notebook")
    (cls / "nothing-handed-in" / ONE).mkdir(parents=True)
    (cls / "nothing-handed-in" / ONE / "notes.txt").write_text("forgot the notebook")
    add("nothing-handed-in", None, zero, "missing notebook")
    (cls / "renamed" / ONE).mkdir(parents=True)
    nbformat.write(reference_submission(a), cls / "renamed" / ONE / "my_work.ipynb")
    (cls / "renamed" / ONE / "scratch.txt").write_text("x")
    add("renamed", None, full, "renamed: graded my_work.ipynb")
    expected["renamed", ONE].status = "extra files ignored: scratch.txt"

    out = root / "graded"
    run = autograde(cls, out, "--timeout", "15")
    return expected, out, cls, run


def test_messy_class_gets_every_row_with_points_and_status(messy_class):
    expected, out, _, _ = messy_class
    rows = read_rows(out)
    assert mismatches(rows, expected) == []
    assert rows["renamed", ONE][1].startswith("renamed: graded my_work.ipynb")


def test_messy_class_writes_feedback_for_graded_submissions(messy_class):
    _, out, _, _ = messy_class
    for student in ("correct", "wrong", "kernel-dies"):
        assert (out / "feedback" / student / ONE / f"{ONE}.html").exists()
    page = (out / "feedback" / "wrong" / ONE / f"{ONE}.html").read_text()
    assert "gradient_descent" in page and "CheckFailure" in page


def test_regrading_reuses_results_and_gives_the_same_csv(messy_class):
    _, out, cls, _ = messy_class
    before = (out / "grades.csv").read_text()
    results = out / ".work" / "results" / "correct" / f"{ONE}.json"
    stamp = results.stat().st_mtime_ns
    autograde(cls, out, "--timeout", "15")
    assert (out / "grades.csv").read_text() == before
    assert results.stat().st_mtime_ns == stamp, "an unchanged submission was graded again"


def test_an_lms_zip_is_graded_like_a_folder(tmp_path):
    a = assignment_named(ONE)
    archive = tmp_path / "export.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr(f"alice_12_345_{a.notebook}", nbformat.writes(reference_submission(a)))
        zf.writestr(f"bob_late_13_346_{ONE}-1.ipynb", nbformat.writes(nbformat.read(a.release, as_version=4)))
        zf.writestr("../escape.ipynb", "{}")
    unpacked = unpack_zip(archive, tmp_path / "unpacked", assignments())
    subs = collect(unpacked, assignments())
    assert [(s.student, s.assignment, [f.name for f in s.files]) for s in subs] == [
        ("alice", ONE, [a.notebook]), ("bob", ONE, [a.notebook])]
    assert not (tmp_path / "escape.ipynb").exists()
    autograde(archive, tmp_path / "graded", "--timeout", "60")
    rows = read_rows(tmp_path / "graded")
    assert sum(rows["alice", ONE][0].values()) == sum(a.grade_cells().values())
    assert sum(rows["bob", ONE][0].values()) == 0


def test_validate_exit_code_follows_the_visible_tests(tmp_path):
    a = assignment_named(ONE)
    good, blank = tmp_path / "good.ipynb", tmp_path / "blank.ipynb"
    nbformat.write(reference_submission(a), good)
    nbformat.write(nbformat.read(a.release, as_version=4), blank)
    passed = subprocess.run([PYTHON, "-m", "helpers.validate", str(good)], capture_output=True, text=True)
    failed = subprocess.run([PYTHON, "-m", "helpers.validate", str(blank)], capture_output=True, text=True)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert failed.returncode == 1 and "✗ mse_grad: not answered yet" in failed.stdout
