"""The release a submission is graded against, and the reference solution filled into it.

Production grading needs both — the reference run records what every observation must be, and the
canary hands the reference in the student's way — so they live here, not with the self-test data
(grader/author/mutants.py). Every grading step takes the released notebook it is given, so the canary,
the reference records and the students' rebuilds use one and the same release.
"""

from __future__ import annotations

import copy

import nbformat

from grader.author.markers import SOLUTION_MARKER
from grader.course import Assignment
from labkit import cells


def reference_answers(assignment: Assignment) -> dict[str, str]:
    """Answer cell grade_id → the reference solution's source, without the BEGIN/END markers."""
    nb = nbformat.read(assignment.source, as_version=4)
    return {cells.grade_id(c): SOLUTION_MARKER.sub("", c.source) for c in nb.cells if cells.kind(c) == cells.ANSWER}


def released_notebook(assignment: Assignment) -> nbformat.NotebookNode:
    """The student edition in notebooks/ (what `grader release` wrote and students downloaded)."""
    return nbformat.read(assignment.release, as_version=4)


def build_submission(assignment: Assignment, answers: dict[str, str],
                     released: nbformat.NotebookNode | None = None) -> nbformat.NotebookNode:
    """`released` (default: notebooks/'s) with the given answer cells filled in, as a student would hand it in."""
    nb = copy.deepcopy(released) if released is not None else released_notebook(assignment)
    for cell in nb.cells:
        if cells.grade_id(cell) in answers:
            cell.source = answers[cells.grade_id(cell)]
    return nb


def reference_submission(assignment: Assignment, released: nbformat.NotebookNode | None = None) -> nbformat.NotebookNode:
    """Every answer cell filled with the reference solution."""
    return build_submission(assignment, reference_answers(assignment), released)
