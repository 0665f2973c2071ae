"""The grader grades: reference full, blank 0, every mutant of every exercise loses its points.

The self-test class goes through `python -m grader autograde` itself (a subprocess), as an instructor
runs it; tests/test_class.py grades a class of troubled and hostile submissions.
"""

import subprocess
import zipfile

import nbformat
import pytest

from conftest import PYTHON, autograde, read_rows
from grader.course import assignment_named, assignments
from grader.mutants import reference_submission
from grader.release import secret_lines
from grader.selftest import mismatches, write_selftest_class
from grader.submissions import collect, unpack_zip

pytestmark = pytest.mark.slow
ONE = "01_gradient_descent"


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
