"""`python -m grader check` passes on the course, and fails on each kind of problem it promises to catch."""

import copy
import subprocess

import nbformat
import pytest
from conftest import PYTHON, REPO

from grader.author.check import leak_problems, metadata_problems, nbgrader_problems, output_problems
from grader.author.mutants import reference_answers
from grader.author.release import generate
from grader.course import assignment_named, assignments


@pytest.mark.integration  # the CLI, and nbgrader generates every notebook
def test_grader_check_passes():
    run = subprocess.run([PYTHON, "-m", "grader", "check"], cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.integration  # nbgrader generates a notebook twice
def test_release_is_deterministic(tmp_path):
    one = assignment_named("01_gradient_descent")
    first = generate(tmp_path / "a", [one]) / "release" / one.name / one.notebook
    second = generate(tmp_path / "b", [one]) / "release" / one.name / one.notebook
    assert first.read_bytes() == second.read_bytes() == one.release.read_bytes()


def test_every_solution_has_a_release():
    for assignment in assignments():
        assert assignment.release.exists(), f"{assignment.name} is not released"


def test_check_catches_outputs(tmp_path):
    nb = nbformat.read(assignment_named("01_gradient_descent").release, as_version=4)
    code = next(c for c in nb.cells if c.cell_type == "code")
    code.outputs = [nbformat.v4.new_output("stream", text="hello")]
    code.execution_count = 1
    nbformat.write(nb, tmp_path / "executed.ipynb")
    assert output_problems((tmp_path,)) == [f"{tmp_path / 'executed.ipynb'} carries outputs: clear them before committing"]


def test_check_catches_solution_and_hidden_test_leaks(tmp_path):
    one = assignment_named("01_gradient_descent")
    source = nbformat.read(one.source, as_version=4)
    leaked = tmp_path / one.name / one.notebook
    leaked.parent.mkdir()
    nbformat.write(source, leaked)  # the instructor copy published by mistake
    problems = leak_problems(tmp_path)
    solution_line = max(reference_answers(one)["mse_grad_answer"].splitlines()[2:], key=len).strip()
    assert any(solution_line in p for p in problems), (solution_line, problems)
    assert any("BEGIN SOLUTION/HIDDEN TESTS marker" in p for p in problems)
    assert leak_problems() == []


def test_check_runs_nbgrader_s_own_metadata_validation(tmp_path):
    """A released cell nbgrader would refuse (here the set-up cell's grade id gone, as a hand-edited release might
    have it) fails the check: on a hub every hand-in of that notebook would fail to grade."""
    one = assignment_named("01_gradient_descent")
    released = nbformat.read(one.release, as_version=4)
    setup = next(c for c in released.cells if c.get("id") == "course-bootstrap")
    del setup.metadata["nbgrader"]["grade_id"]
    broken = tmp_path / one.name / one.notebook
    broken.parent.mkdir()
    nbformat.write(released, broken)
    problems = nbgrader_problems(tmp_path)
    assert len(problems) == 1 and "nbgrader rejects it: nbgrader cell does not have a grade_id" in problems[0], problems
    assert nbgrader_problems() == []


@pytest.mark.parametrize("breakage, message", [
    ("duplicate", "is used 2 times"),
    ("no_points", "test cell without positive points"),
    ("unlocked_test", "test cell is not locked"),
    ("bare_code", "code cell without nbgrader metadata"),
    ("no_marker", "answer cell without ### BEGIN SOLUTION"),
    ("written_no_points", "written answer without positive points"),
    ("written_no_model", "written answer without a model answer"),
])
def test_check_catches_bad_metadata(tmp_path, breakage, message):
    nb = copy.deepcopy(nbformat.read(assignment_named("01_gradient_descent").source, as_version=4))
    test_cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade"))
    answer = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution"))
    if breakage == "duplicate":
        answer.metadata.nbgrader["grade_id"] = test_cell.metadata.nbgrader["grade_id"]
    elif breakage == "no_points":
        del test_cell.metadata.nbgrader["points"]
    elif breakage == "unlocked_test":
        test_cell.metadata.nbgrader["locked"] = False
    elif breakage == "bare_code":
        del nb.cells[1].metadata["nbgrader"]
    elif breakage == "no_marker":
        answer.source = "def mse_grad(w, X, y):\n    return w"
    elif breakage.startswith("written"):
        written = next(c for c in nb.cells if c.cell_type == "markdown" and c.metadata.get("nbgrader", {}).get("grade"))
        if breakage == "written_no_points":
            written.metadata.nbgrader["points"] = 0
        else:
            written.source = "A good answer names the curvature."  # a model answer the leak check cannot see
    path = tmp_path / "broken.ipynb"
    nbformat.write(nb, path)
    problems = metadata_problems([path])
    assert any(message in p for p in problems), problems
    assert metadata_problems() == []
