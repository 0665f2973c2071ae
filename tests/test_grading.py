"""The grader grades: reference full, blank 0, every mutant costs exactly its exercise and says why.

The self-test class goes through `python -m grader autograde` itself (a subprocess), as an instructor
runs it; tests/test_class.py grades classes of troubled, hostile and honest submissions.
"""

import subprocess

import nbformat
import pytest
from conftest import PYTHON, autograde, read_rows, shown_lines

from grader.author.check import secret_lines
from grader.author.mutants import load_mutants, load_variants, reference_answers, reference_submission
from grader.author.selftest import mismatches, write_selftest_class
from grader.course import assignment_named, assignments

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


def test_every_mutant_names_its_mistake():
    for assignment in assignments():
        for mutant in load_mutants(assignment):
            assert mutant.says, f"{assignment.name}: mutant {mutant.name} has no `says`"


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
        # Hidden-test lines that no answer (reference, mutant or variant, with its scratch cell) also contains:
        # the student's own cells are shown on purpose.
        answers = {line.strip() for source in [*reference_answers(assignment).values(),
                                               *(m.source for m in load_mutants(assignment)),
                                               *(v.source + "\n" + v.scratch for v in load_variants(assignment))]
                   for line in source.splitlines()}
        hidden = secret_lines(nbformat.read(assignment.source, as_version=4), solutions=False) - answers
        for page in (graded / "feedback").glob(f"*/{assignment.name}/*.html"):
            leaked = hidden & shown_lines(page.read_text())
            assert not leaked, f"{page} shows hidden test lines: {sorted(leaked)[:3]}"


def test_validate_exit_code_follows_the_visible_tests(tmp_path):
    a = assignment_named(ONE)
    good, blank = tmp_path / "good.ipynb", tmp_path / "blank.ipynb"
    nbformat.write(reference_submission(a), good)
    nbformat.write(nbformat.read(a.release, as_version=4), blank)
    passed = subprocess.run([PYTHON, "-m", "labkit.validate", str(good)], capture_output=True, text=True)
    failed = subprocess.run([PYTHON, "-m", "labkit.validate", str(blank)], capture_output=True, text=True)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert failed.returncode == 1 and "✗ mse_grad: not answered yet" in failed.stdout
