"""Hidden tests as scenarios: what runs in the student's kernel, and what only the reference run may see.

A test cell's hidden block (between `### BEGIN HIDDEN TESTS` and `### END HIDDEN TESTS` in
solutions/) is a scenario: it builds inputs, calls the student's functions and records the results
with `observe(name, value, **spec)`. Inside it:

    with oracle():                        # runs only in the reference run, never in a student's kernel
        expect(name, torch_computed_value)  # the value `name` must have (default: what the reference returned)
    with autograd_guard() as guard:       # counts calls into autograd (for "no autograd" exercises)
        got = mse_grad(...)
    uses_reference("mse_grad")            # this test calls another exercise's function: use the reference one

A block starts with `from labkit.scenario import …` (stand-ins that let the solution notebook run in
Jupyter). The grader reads the blocks from the source notebook (never from a submission), drops that
import and the `uses_reference` lines, removes the oracle blocks for the student's kernel and keeps
them for the reference run.
"""

from __future__ import annotations

import ast
import copy
import functools
from dataclasses import dataclass

import nbformat

from grader.author.markers import HIDDEN_BLOCK, SOLUTION_BLOCK
from grader.course import Assignment
from grader.judge.reference import reference_answers
from labkit import cells


@dataclass(frozen=True)
class Scenario:
    """One test cell's hidden scenario, in the two forms the grader runs."""

    test: str
    points: float
    student_code: str  # oracle blocks removed: what runs in a student's kernel
    reference_code: str  # everything: what runs in the reference kernel
    answers: tuple[str, ...]  # what the scenario may use from the notebook: the names answer cells define
    inject: str  # reference definitions of other exercises' functions this test calls
    inject_names: tuple[str, ...]


def _is_oracle_block(node: ast.stmt) -> bool:
    return (isinstance(node, ast.With) and len(node.items) == 1 and isinstance(node.items[0].context_expr, ast.Call)
            and isinstance(node.items[0].context_expr.func, ast.Name) and node.items[0].context_expr.func.id == "oracle")


def _is_scenario_import(node: ast.stmt) -> bool:
    """`from labkit.scenario import …`: the solution notebook's stand-ins, replaced at grading by the probe's."""
    return isinstance(node, ast.ImportFrom) and node.module == "labkit.scenario"


def _uses_reference(node: ast.stmt) -> list[str] | None:
    if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name)
            and node.value.func.id == "uses_reference"):
        names = [a.value for a in node.value.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        if len(names) != len(node.value.args):
            raise ValueError("uses_reference() takes function names as string literals")
        return names
    return None


class _StripOracles(ast.NodeTransformer):
    def generic_visit(self, node: ast.AST) -> ast.AST:
        for field_name in ("body", "orelse", "finalbody", "handlers"):
            body = getattr(node, field_name, None)
            if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
                kept = [n for n in body if not _is_oracle_block(n)]
                setattr(node, field_name, kept or [ast.Pass()])
        return super().generic_visit(node)


def split(hidden: str) -> tuple[str, str, list[str]]:
    """(student code, reference code, names from uses_reference) for one hidden block."""
    tree = ast.parse(hidden)
    needs: list[str] = []
    body = []
    for node in tree.body:
        names = _uses_reference(node)
        if names is not None:
            needs += names
        elif not _is_scenario_import(node):
            body.append(node)
    reference = ast.Module(body=body, type_ignores=[])
    student = _StripOracles().visit(copy.deepcopy(reference))
    return ast.unparse(student), ast.unparse(reference), needs


@functools.cache
def scenarios(assignment: Assignment) -> tuple[Scenario, ...]:
    """Every test cell of `assignment` as a Scenario (read from solutions/), in the order they run: notebook order,
    except that a test given another exercise's reference answer (`uses_reference`) runs after that exercise's
    own test — the student's code sees the reference while it runs, so it must be too late to use it there."""
    answers = reference_answers(assignment)
    providers = {name: (cell_id, source) for cell_id, source in answers.items()
                 for name in cells.defined_names(source, imports=False)}
    source = nbformat.read(assignment.source, as_version=4).cells
    stubs = [SOLUTION_BLOCK.sub("raise NotImplementedError()\n", c.source) for c in source if cells.kind(c) == cells.ANSWER]
    exposed = tuple(sorted({name for stub in stubs for name in cells.defined_names(stub, imports=False)}))
    found, after = [], {}
    for cell in source:
        if cells.kind(cell) != cells.TEST:
            continue
        info = cells.nbgrader(cell)
        blocks = HIDDEN_BLOCK.findall(cell.source + "\n")
        student, reference, needs = split("\n".join(blocks))
        missing = [n for n in needs if n not in providers]
        if missing:
            raise ValueError(f"{assignment.name}/{info['grade_id']}: uses_reference names no answer's function: {missing}")
        inject = "\n\n".join(dict.fromkeys(providers[n][1] for n in needs))
        after[info["grade_id"]] = {providers[n][0].removesuffix("_answer") for n in needs}
        found.append(Scenario(info["grade_id"], cells.points([cell])[info["grade_id"]], student, reference, exposed, inject,
                              tuple(sorted(cells.defined_names(inject, imports=False))) if inject else ()))
    return tuple(_dependencies_first(found, after))


def _dependencies_first(found: list[Scenario], after: dict[str, set[str]]) -> list[Scenario]:
    """`found` in notebook order, each test moved after the tests whose reference answers it is given."""
    ordered: list[Scenario] = []
    waiting = list(found)
    while waiting:
        ready = next((s for s in waiting if not after[s.test] & {w.test for w in waiting}), None)
        if ready is None:
            raise ValueError(f"tests give each other their reference answers in a circle: {[s.test for s in waiting]}")
        ordered.append(ready)
        waiting.remove(ready)
    return ordered
