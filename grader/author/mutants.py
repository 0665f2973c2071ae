"""Reference, blank, mutant and variant submissions built from the released notebook (the grader's self-test data).

Mutants are realistic wrong answers kept as data in grader/mutants/<assignment>.toml:

    [[mutant]]
    name = "mse_grad_sign_flipped"          # unique, used as the student id in self-tests
    exercise = "mse_grad"                   # the test cell (grade id) this mistake must cost, and no other
    cell = "mse_grad_answer"                # the answer cell it replaces
    why = "residual written as y - Xw"      # the misconception, in plain words
    says = "the sign is flipped"            # what the grader's message must say about it
    source = '''...'''                      # the wrong answer, as a student would write it

Variants are correct answers written differently (another algorithm, dtype, container, in place or not),
kept in grader/variants/<assignment>.toml; each must earn full marks with status ok:

    [[variant]]
    name = "mse_grad_einsum"
    exercise = "mse_grad"                   # the test cell it answers
    cell = "mse_grad_answer"                # the answer cell it replaces
    why = "einsum instead of matrix products"
    source = '''...'''
    scratch = '''...'''                     # optional: a cell of the student's own, right after that answer
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import nbformat
import tomllib

from grader.course import Assignment, assignments
from grader.judge.reference import build_submission, reference_answers, reference_submission
from grader.paths import MUTANTS, VARIANTS
from labkit import cells

MIN_MUTANTS_PER_EXERCISE = 3
MIN_VARIANTS_PER_EXERCISE = 2
# The reference answers live with production grading (grader/judge/reference.py); named here for the self-tests.
__all__ = ["Mutant", "Variant", "blank_submission", "build_submission", "load_mutants", "load_variants",
           "mutant_problems", "mutant_submission", "pack_mutants", "reference_answers", "reference_function",
           "reference_submission"]


@dataclass(frozen=True)
class Mutant:
    """One realistic wrong answer and the test cells it must fail."""

    name: str
    exercise: str
    cell: str
    why: str
    says: str
    source: str


def load_mutants(assignment: Assignment) -> list[Mutant]:
    """The mutants of an assignment (none when it has no mutants file)."""
    path = MUTANTS / f"{assignment.name}.toml"
    if not path.exists():
        return []
    entries = tomllib.loads(path.read_text(encoding="utf-8")).get("mutant", [])
    return [Mutant(name=e["name"], exercise=e["exercise"], cell=e["cell"], why=e["why"], says=e.get("says", ""),
                   source=e["source"]) for e in entries]


@dataclass(frozen=True)
class Variant:
    """One correct answer written differently, with an optional scratch cell of the student's own after it."""

    name: str
    exercise: str
    cell: str
    why: str
    source: str
    scratch: str = ""


def load_variants(assignment: Assignment) -> list[Variant]:
    """The variants of an assignment (none when it has no variants file)."""
    path = VARIANTS / f"{assignment.name}.toml"
    if not path.exists():
        return []
    entries = tomllib.loads(path.read_text(encoding="utf-8")).get("variant", [])
    return [Variant(name=e["name"], exercise=e["exercise"], cell=e["cell"], why=e["why"], source=e["source"],
                    scratch=e.get("scratch", "")) for e in entries]


def reference_function(assignment_name: str, answer_cell: str, name: str, namespace: dict | None = None):
    """A function defined by a reference answer, for instructor scripts and tests that need the real thing."""
    from grader.course import assignment_named

    scope = dict(namespace or {})
    exec(reference_answers(assignment_named(assignment_name))[answer_cell], scope)
    return scope[name]


def blank_submission(assignment: Assignment) -> nbformat.NotebookNode:
    """The released notebook untouched: every answer still raises NotImplementedError."""
    return copy.deepcopy(nbformat.read(assignment.release, as_version=4))


def mutant_submission(assignment: Assignment, group: list[Mutant] | list[Variant],
                      released: nbformat.NotebookNode | None = None) -> nbformat.NotebookNode:
    """The reference with each mutant (or variant) of `group` replacing its answer cell; a variant's scratch
    cell follows its answer as a cell the student added. `released`: the release to fill (default notebooks/')."""
    answers = reference_answers(assignment)
    answers.update({m.cell: m.source for m in group})
    nb = build_submission(assignment, answers, released)
    scratch = {m.cell: m.scratch for m in group if isinstance(m, Variant) and m.scratch}
    for index in reversed(range(len(nb.cells))):
        if (code := scratch.get(cells.grade_id(nb.cells[index]))) is not None:
            nb.cells.insert(index + 1, nbformat.v4.new_code_cell(code))
    return nb


def pack_mutants(mutants: list[Mutant] | list[Variant]) -> list[list]:
    """Group mutants (or variants) into few submissions, never two that touch the same cell or the same exercise."""
    groups: list[list] = []
    for mutant in mutants:
        for group in groups:
            if all(m.cell != mutant.cell and m.exercise != mutant.exercise for m in group):
                group.append(mutant)
                break
        else:
            groups.append([mutant])
    return groups


def mutant_problems() -> list[str]:
    """Mutants and variants that name unknown cells, and graded exercises with fewer than three mutants or fewer
    than two variants (correct answers written differently)."""
    problems = []
    for assignment in assignments():
        source = nbformat.read(assignment.source, as_version=4).cells
        tests = {cells.grade_id(c) for c in source if cells.kind(c) == cells.TEST}
        answers = {cells.grade_id(c) for c in source if cells.kind(c) == cells.ANSWER}
        mutants = load_mutants(assignment)
        for what, entries in (("mutant", mutants), ("variant", load_variants(assignment))):
            names = [m.name for m in entries]
            problems += [f"{assignment.name}: {what} name {n!r} is used twice" for n in set(names) if names.count(n) > 1]
            for m in entries:
                if m.cell not in answers:
                    problems.append(f"{assignment.name}: {what} {m.name} replaces unknown answer cell {m.cell!r}")
                if m.exercise not in tests:
                    problems.append(f"{assignment.name}: {what} {m.name} names {m.exercise!r}, which is not a test cell")
        variants = load_variants(assignment)
        for test in sorted(tests):
            count = sum(m.exercise == test for m in mutants)
            if count < MIN_MUTANTS_PER_EXERCISE:
                problems.append(f"{assignment.name}: exercise {test} has {count} mutants, needs {MIN_MUTANTS_PER_EXERCISE}")
            written = sum(v.exercise == test for v in variants)
            if written < MIN_VARIANTS_PER_EXERCISE:
                problems.append(f"{assignment.name}: exercise {test} has {written} variants, needs {MIN_VARIANTS_PER_EXERCISE}")
    return problems
