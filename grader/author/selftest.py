"""The grader's self-test class: reference, blank, mutant and variant submissions with the scores they must get.

Used by the test suite and the benchmark. Student folders are named after what they hold:
`reference` and `blank` hand in every assignment; `mutants-K` hands in the K-th group of packed
mutants of each assignment that has one (independent mistakes share a submission, so a class stays
small while each lost point is still attributable); `variants-K` the K-th group of packed variants,
correct answers written differently, which must earn full marks with status ok.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from grader.author.mutants import (
    blank_submission,
    load_mutants,
    load_variants,
    mutant_submission,
    pack_mutants,
    reference_submission,
)
from grader.course import Assignment


@dataclass
class Expected:
    """The row a submission must produce: points per exercise and a fragment of the status."""

    scores: dict[str, float]
    status: str = "ok"
    why: str = ""
    says: dict[str, str] = field(default_factory=dict)  # exercise -> what its feedback message must contain
    mistakes: dict[str, str] = field(default_factory=dict)  # exercise -> the known mistake it must be recognised as


def put(root: Path, student: str, assignment: Assignment, nb: nbformat.NotebookNode) -> Path:
    """Write a submission where autograde looks for it."""
    path = root / student / assignment.name / assignment.notebook
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def write_selftest_class(root: Path, chosen: list[Assignment]) -> dict[tuple[str, str], Expected]:
    """Write reference, blank and mutant submissions under `root`; returns (student, assignment) → Expected."""
    expected: dict[tuple[str, str], Expected] = {}
    for assignment in chosen:
        full = assignment.grade_cells()
        put(root, "reference", assignment, reference_submission(assignment))
        expected["reference", assignment.name] = Expected(dict(full), why="reference solution")
        put(root, "blank", assignment, blank_submission(assignment))
        expected["blank", assignment.name] = Expected({k: 0.0 for k in full}, why="blank stubs")
        for index, group in enumerate(pack_mutants(load_mutants(assignment))):
            student = f"mutants-{index}"
            put(root, student, assignment, mutant_submission(assignment, group))
            broken = {m.exercise: m for m in group}
            expected[student, assignment.name] = Expected(
                {k: 0.0 if k in broken else v for k, v in full.items()},
                why=", ".join(f"{m.name} ({m.why})" for m in group),
                says={k: m.says for k, m in broken.items() if m.says},
                mistakes={k: m.name for k, m in broken.items()})
        for index, variants in enumerate(pack_mutants(load_variants(assignment))):
            student = f"variants-{index}"
            put(root, student, assignment, mutant_submission(assignment, variants))
            expected[student, assignment.name] = Expected(dict(full), why=", ".join(f"{v.name} ({v.why})" for v in variants))
    # Students who hand in some assignments but not others get a row saying so.
    students = {s for s, _ in expected}
    for assignment in chosen:
        for student in students:
            expected.setdefault((student, assignment.name),
                                Expected({k: 0.0 for k in assignment.grade_cells()}, "no submission"))
    return expected


# points per exercise, status, message per failed exercise, known mistake per failed exercise
Row = tuple[dict[str, float], str, dict[str, str], dict[str, str]]


def mismatches(rows: dict[tuple[str, str], Row], expected: dict[tuple[str, str], Expected]) -> list[str]:
    """Every way the graded rows differ from what was expected, in words."""
    problems = []
    for key, want in sorted(expected.items()):
        if key not in rows:
            problems.append(f"{key[0]}/{key[1]}: no row in grades.csv")
            continue
        scores, status, messages, mistakes = rows[key]
        for exercise, name in want.mistakes.items():
            if mistakes.get(exercise) != name:
                problems.append(f"{key[0]}/{key[1]}: {exercise} was recognised as "
                                f"{mistakes.get(exercise) or 'no known mistake'}, "
                                f"not {name} (two mutants that behave alike on every probe are one mistake)")
        for exercise, fragment in want.says.items():
            if fragment not in messages.get(exercise, ""):
                problems.append(f"{key[0]}/{key[1]}: the message for {exercise} does not say {fragment!r}: "
                                f"{messages.get(exercise, '')!r}")
        wrong = {k: (scores.get(k), v) for k, v in want.scores.items() if scores.get(k) != v}
        if wrong:
            detail = ", ".join(f"{k} got {got} expected {v}" for k, (got, v) in wrong.items())
            problems.append(f"{key[0]}/{key[1]} [{want.why}]: {detail}")
        if (status != "ok") if want.status == "ok" else (want.status not in status):
            problems.append(f"{key[0]}/{key[1]}: status {status!r} does not mention {want.status!r}")
    problems += [f"{s}/{a}: unexpected row" for s, a in rows if (s, a) not in expected]
    return problems
