"""Cribs: every function or class a student can see, handed in as each exercise's answer — none may earn points.

A student sees the released notebook's cells (set-up, the visible part of each test, demos, claims)
and the `helpers` package. If any function or class defined there answers an exercise, copying it
is a working answer: the course gave the answer away. `cribs(assignment)` builds one crib per
(exercise function, visible function or class it could stand in for): the visible definition,
renamed to the exercise's name (with the visible definitions it calls), or imported from `helpers`
under that name, appended to the reference answer cell so that only that one name changes. Arity
must fit: the candidate accepts the arguments the exercise's contract passes. Hand-written cribs
for compositions the mechanical rule cannot build live beside the mutants (`[[crib]]` in
grader/mutants/NN.toml: name, exercise, cell, origin, source). `python -m grader selftest` runs
them all (`crib_problems`) and fails when one earns points.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass

import nbformat
import tomllib

import helpers
import labkit
from grader.author.markers import SOLUTION_BLOCK
from grader.course import Assignment
from grader.judge.judge import ScenarioRecord
from grader.judge.reference import reference_answers, reference_submission
from grader.judge.scenarios import scenarios
from grader.kernel.harness import Kernel, Step, run_steps, scenario_code
from grader.paths import MUTANTS
from labkit import cells


@dataclass(frozen=True)
class Crib:
    """A visible function or class handed in as an exercise's answer."""

    name: str  # unique; used to label the self-test submission
    exercise: str  # the test cell that must not pass
    cell: str  # the answer cell it goes into
    origin: str  # where the student can see it
    source: str  # the answer cell's code


@dataclass(frozen=True)
class _Signature:
    required: int
    total: int
    varargs: bool
    is_class: bool

    def can_stand_in_for(self, wanted: _Signature) -> bool:
        if self.is_class or wanted.is_class:
            return self.is_class and wanted.is_class
        return self.required <= wanted.required and (self.varargs or self.total >= wanted.total)


def _signature_of_def(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> _Signature:
    if isinstance(node, ast.ClassDef):
        return _Signature(0, 0, False, True)
    positional = node.args.posonlyargs + node.args.args
    return _Signature(len(positional) - len(node.args.defaults), len(positional), node.args.vararg is not None, False)


def _signature_of_object(obj: object) -> _Signature | None:
    if inspect.isclass(obj):
        return _Signature(0, 0, False, True)
    try:
        params = list(inspect.signature(obj).parameters.values())  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = sum(p.default is p.empty for p in positional)
    return _Signature(required, len(positional), any(p.kind == p.VAR_POSITIONAL for p in params), False)


def _definitions(source: str) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    return {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}


def _visible(assignment: Assignment) -> dict[str, tuple[str, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef, str]]:
    """name → (origin, definition, its source) for every def/class in a non-answer cell of the released notebook."""
    found = {}
    for cell in nbformat.read(assignment.release, as_version=4).cells:
        if cells.kind(cell) in (cells.PROSE, cells.WRITTEN, cells.ANSWER):
            continue
        imports = _imports(cell.source)  # what the cell's definitions may need: a crib copies them too
        for name, node in _definitions(cell.source).items():
            found[name] = (f"cell {cells.grade_id(cell) or '?'} of the released notebook", node,
                           "\n".join([*imports, ast.get_source_segment(cell.source, node) or ast.unparse(node)]))
    return found


def _imports(source: str) -> list[str]:
    """The top-level import statements of a cell's source (none when it does not parse)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    return [ast.unparse(node) for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]


def _with_dependencies(name: str, visible: dict) -> list[str]:
    """`name` and the visible definitions it uses, transitively, in a defining order."""
    order: list[str] = []

    def visit(current: str) -> None:
        if current in order:
            return
        order.append(current)
        for node in ast.walk(visible[current][1]):
            if isinstance(node, ast.Name) and node.id in visible and node.id != current:
                visit(node.id)

    visit(name)
    return order[::-1]


def _helper_objects() -> dict[str, tuple[str, object]]:
    """qualified name → (module, object) for every public function and class defined in `helpers` or `labkit`."""
    found: dict[str, tuple[str, object]] = {}
    infos = [info for package in (helpers, labkit) for info in pkgutil.iter_modules(package.__path__, f"{package.__name__}.")]
    for info in infos:
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if name.startswith("_") or not (inspect.isfunction(obj) or inspect.isclass(obj)):
                continue
            if getattr(obj, "__module__", "") == info.name:
                found[f"{info.name}.{name}"] = (info.name, obj)
    return found


def _exercise_functions(assignment: Assignment) -> list[tuple[str, str, str, _Signature]]:
    """(answer cell, test id, name, signature) for every function or class an answer cell must define."""
    wanted = []
    for cell in nbformat.read(assignment.source, as_version=4).cells:
        if cells.kind(cell) != cells.ANSWER:
            continue
        stub = SOLUTION_BLOCK.sub("raise NotImplementedError()\n", cell.source)
        for name, node in _definitions(stub).items():
            wanted.append((cells.grade_id(cell), cells.grade_id(cell).removesuffix("_answer"), name, _signature_of_def(node)))
    return wanted


def _renamed(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef, name: str) -> str:
    import copy

    renamed = copy.deepcopy(node)
    renamed.name = name
    return ast.unparse(renamed)


def cribs(assignment: Assignment) -> list[Crib]:
    """Every mechanical crib of `assignment`, then the hand-written ones."""
    answers = reference_answers(assignment)
    visible = _visible(assignment)
    helper_objects = _helper_objects()
    found: list[Crib] = []
    for cell, test, target, wanted in _exercise_functions(assignment):
        for name, (origin, node, _) in sorted(visible.items()):
            if name == target or not _signature_of_def(node).can_stand_in_for(wanted):
                continue
            needed = [visible[n][2] for n in _with_dependencies(name, visible) if n != name]
            own_imports = visible[name][2].split("\n")[:len(_imports(visible[name][2]))]
            crib = "\n\n".join([answers[cell], *needed, *own_imports, _renamed(node, target)])
            found.append(Crib(f"crib-{target}-from-{name}", test, cell, origin, crib))
        for qualified, (module, obj) in sorted(helper_objects.items()):
            signature = _signature_of_object(obj)
            if signature is None or not signature.can_stand_in_for(wanted):
                continue
            crib = f"{answers[cell]}\n\nfrom {module} import {qualified.rsplit('.', 1)[1]} as {target}\n"
            found.append(Crib(f"crib-{target}-from-{qualified}", test, cell, qualified, crib))
    return found + hand_written(assignment)


def hand_written(assignment: Assignment) -> list[Crib]:
    """The `[[crib]]` entries of grader/mutants/<assignment>.toml: compositions of visible code."""
    path = MUTANTS / f"{assignment.name}.toml"
    if not path.exists():
        return []
    entries = tomllib.loads(path.read_text(encoding="utf-8")).get("crib", [])
    answers = reference_answers(assignment)
    return [Crib(f"crib-{e['name']}", e["exercise"], e["cell"], e["origin"], f"{answers[e['cell']]}\n\n{e['source']}")
            for e in entries]


def crib_problems(assignment: Assignment, new_kernel: Callable[[], Kernel], timeout: float,
                  records: dict[str, ScenarioRecord]) -> list[str]:
    """Every crib of `assignment` that earns its exercise's points, in words (empty: no crib works).

    One kernel runs the reference notebook's cells, then for each crib: the crib's answer cell, the
    scenario of its exercise, and the reference answer cell again (trusted code only: course cells).
    """
    from grader.judge.grading import plan, read_scenario, verdict

    answers = reference_answers(assignment)
    tests = {s.test: s for s in scenarios(assignment)}
    steps = [s for s in plan(reference_submission(assignment), assignment, reference=True) if not s.test]
    found = cribs(assignment)
    checks: dict[int, Crib] = {}  # the index of the step that runs the crib's test -> the crib
    for crib in found:
        scenario = tests[crib.exercise]
        steps.append(Step(crib.cell, crib.source, by_student=True))
        checks[len(steps)] = crib
        steps.append(Step(crib.exercise, scenario_code(crib.exercise, scenario.student_code, scenario.answers,
                                                       scenario.inject, scenario.inject_names),
                          by_student=False, test=crib.exercise))
        steps.append(Step(crib.cell, answers[crib.cell], by_student=False))
    runs = run_steps(steps, new_kernel, timeout)
    problems = []
    for index, crib in checks.items():
        scenario_run = runs[index]
        # a test that ended on its own yet sent nothing readable checked nothing (a crib that crashes, hangs or
        # floods the kernel earns nothing, as it would for a student)
        if not scenario_run.failure and read_scenario(crib.exercise, scenario_run, timeout)[2] is not None:
            problems.append(f"{assignment.name}: {crib.origin} ({crib.name}) could not be checked: its test of "
                            f"{crib.exercise} sent no readable result")
            continue
        judged = verdict(crib.exercise, tests[crib.exercise].points, records[crib.exercise], scenario_run, timeout)
        if judged.points > 0:
            problems.append(f"{assignment.name}: {crib.origin} answers {crib.exercise} ({crib.name})")
    return problems
