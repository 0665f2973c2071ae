"""Grade one notebook: run its cells and hidden scenarios in a kernel, judge the results outside it.

The reference solution is run once per version of the course (`reference_records`, cached under
build/): its scenarios, oracle blocks included, record what every observation must be. A student's
notebook runs the same scenarios without the oracle blocks; `grade_notebook` compares the two on
this side. Before a worker grades its first submission of an assignment it grades the reference
submission the student's way (`canary`): anything short of full marks means the grading environment
is broken, and grading stops instead of writing zeros.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from jupyter_client import KernelManager

from grader.author.mutants import Mutant, load_mutants, mutant_submission, pack_mutants, reference_submission
from grader.course import Assignment
from grader.judge.judge import BadPayload, ScenarioRecord, Verdict, behaves_like, decode_payload, judge
from grader.judge.scenarios import scenarios
from grader.kernel import harness
from grader.kernel.harness import DIED, KILLED, NOT_RUN, OUTPUT_LIMIT, SKIPPED, TIMEOUT, Kernel, Step, StepRun
from grader.paths import BUILD, KERNEL_PACKAGES, MUTANTS
from grader.results import Note, NoteKind
from labkit import cells

REFERENCE_CACHE = BUILD / "reference-records"


class GradingEnvironmentBroken(RuntimeError):
    """The reference solution does not pass in this environment: no student grade would mean anything."""


@dataclass
class Graded:
    """One notebook's grading run: the steps, what each produced, and the verdict of each test."""

    steps: list[Step]
    runs: list[StepRun]
    verdicts: dict[str, Verdict]
    mistakes: dict[str, str] = field(default_factory=dict)  # failed test -> known mistake (mutant) it behaves like
    clock: dict[str, float] = field(default_factory=dict)  # seconds spent starting and stopping kernels

    def seconds(self) -> dict[str, float]:
        """Where the time went: kernels, set-up cells, the student's cells, hidden-test scenarios."""
        spent = {"kernel start": 0.0, "kernel stop": 0.0, **self.clock, "set-up cells": 0.0, "student cells": 0.0,
                 "scenarios": 0.0}
        for step, run in zip(self.steps, self.runs):
            kind = "scenarios" if step.test else "student cells" if step.by_student else "set-up cells"
            spent[kind] += run.seconds
        return spent

    @property
    def first_test(self) -> int:
        """Index of the first scenario step (outputs from then on may carry hidden-test data)."""
        return next((i for i, s in enumerate(self.steps) if s.test), len(self.steps))


def plan(nb: nbformat.NotebookNode, assignment: Assignment, *, reference: bool = False) -> list[Step]:
    """The steps that grade `nb`: set-up cells, the student's cells, and a scenario for each test cell."""
    tests = {s.test: s for s in scenarios(assignment)}
    steps = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or not cell.source.strip():
            continue
        grade_id, cell_kind = cells.grade_id(cell), cells.kind(cell)
        if cell_kind == cells.TEST:
            scenario = tests[grade_id]
            code = (harness.scenario_code(grade_id, scenario.reference_code, scenario.answers) if reference else
                    harness.scenario_code(grade_id, scenario.student_code, scenario.answers, scenario.inject,
                                          scenario.inject_names))
            steps.append(Step(grade_id, code, by_student=False, test=grade_id))
        elif cell_kind == cells.ANSWER:
            steps.append(Step(grade_id, cell.source, by_student=True))
        elif cell_kind == cells.SETUP:
            steps.append(Step(grade_id, cell.source, by_student=False))
            steps.append(Step(f"{grade_id} (names)", harness.snapshot_code(), by_student=False))
        elif cell_kind == cells.ADDED:
            steps.append(Step(f"cell {index + 1}", cell.source, by_student=True, added=True))
    return steps


FAILURE_WORDS = {
    TIMEOUT: "the test ran past the time limit of {timeout:g} s",
    KILLED: "the test ran past the time limit of {timeout:g} s and would not stop",
    DIED: "the kernel died while the test ran",
    NOT_RUN: "the kernel could not be restarted after an earlier crash",
    SKIPPED: "",
    OUTPUT_LIMIT: "",
    "": "",
}


def received(test: str, run: StepRun, timeout: float) -> tuple[ScenarioRecord | None, str]:
    """What one scenario step sent back, decoded, and what stopped it ('' when nothing did)."""
    failure = FAILURE_WORDS[run.failure].format(timeout=timeout)
    student = None
    if len(run.payloads) == 1:
        try:
            student = decode_payload(run.payloads[0])
        except BadPayload:
            failure = failure or "its result could not be read (something in the notebook interferes with the tests)"
        if student is not None and student.test != test:
            student, failure = None, failure or "its result was for another test"
    elif len(run.payloads) > 1:
        failure = failure or "more than one result came back (something in the notebook interferes with the tests)"
    else:
        failure = failure or "no result came back (something in the notebook interferes with the tests)"
    return student, failure


def verdict(test: str, points: float, reference: ScenarioRecord, run: StepRun, timeout: float) -> Verdict:
    """Judge one scenario step against the reference record."""
    return judge(test, points, reference, *received(test, run, timeout))


def grade_notebook(nb: nbformat.NotebookNode, assignment: Assignment, new_kernel: Callable[[], Kernel],
                   timeout: float, records: dict[str, ScenarioRecord],
                   known_mistakes: dict[str, dict[str, ScenarioRecord]] | None = None) -> Graded:
    """Run `nb` the grading way and judge every test cell; name the known mistake a failed one behaves like."""
    steps = plan(nb, assignment)
    clock: dict[str, float] = {}
    runs = harness.run_steps(steps, new_kernel, timeout, clock)
    points = {s.test: s.points for s in scenarios(assignment)}
    graded = Graded(steps, runs, {}, clock=clock)
    for step, run in zip(steps, runs):
        if not step.test:
            continue
        student, failure = received(step.test, run, timeout)
        graded.verdicts[step.test] = judge(step.test, points[step.test], records[step.test], student, failure)
        if student is not None and not graded.verdicts[step.test].passed:
            graded.mistakes[step.test] = next(
                (name for name, mistake in (known_mistakes or {}).get(step.test, {}).items()
                 if behaves_like(student, mistake, records[step.test])), "")
    return graded


def run_notes(graded: Graded) -> list[Note]:
    """Status notes for what went wrong while the notebook ran (timeouts, crashes, floods)."""
    notes: list[Note] = []
    for step, run in zip(graded.steps, graded.runs):
        where = f"test {step.test}" if step.test else step.label if step.label.startswith("cell ") else f"cell {step.label}"
        if run.failure in (TIMEOUT, KILLED):
            notes.append(Note(NoteKind.TIMEOUT,
                              f"timeout in {where}" + (" (the kernel was stopped)" if run.failure == KILLED else "")))
        elif run.failure == DIED:  # with the limit that killed it, when the sandbox knows
            notes.append(Note(NoteKind.KERNEL_DIED, f"kernel died in {where}" + (f" ({run.reason})" if run.reason else "")))
        elif run.failure == OUTPUT_LIMIT:
            notes.append(Note(NoteKind.LIMIT_HIT, f"output too large in {where}"))
        elif run.failure == NOT_RUN:
            notes.append(Note(NoteKind.KERNEL_DIED, f"not run: {where} (no kernel after repeated crashes)"))
        elif run.failure == SKIPPED and not any(n.kind == NoteKind.SKIPPED for n in notes):
            notes.append(Note(NoteKind.SKIPPED, f"skipped your cells from {where} on: your own cells had used their "
                                                "time budget (answers and tests still ran)"))
        elif run.error == "MemoryError" and step.by_student:
            notes.append(Note(NoteKind.LIMIT_HIT, f"out of memory in {where}"))
        elif step.test and len(run.payloads) != 1:
            # Something in the notebook got between the test and the grader: worth the instructor's look.
            came = "no result" if not run.payloads else "more than one result"
            notes.append(Note(NoteKind.INTERFERENCE, f"interference in {where}: {came} came back"))
    return notes


def canary(assignment: Assignment, new_kernel: Callable[[], Kernel], timeout: float,
           records: dict[str, ScenarioRecord]) -> str:
    """'' when the reference submission, graded the student's way here, earns full marks; else why not."""
    graded = grade_notebook(reference_submission(assignment), assignment, new_kernel, timeout, records)
    failed = [v for v in graded.verdicts.values() if not v.passed]
    if not failed:
        return ""
    notes = "; ".join(note.text for note in run_notes(graded))
    return (f"the reference solution of {assignment.name} does not earn full marks in this grading environment "
            f"({len(failed)} test(s) failed; first: {failed[0].message}){' — ' + notes if notes else ''}")


# --- the reference records ----------------------------------------------------------------------------------

def _records_key(assignment: Assignment) -> str:
    """Changes with anything the reference records depend on: the source, the probe, helpers, torch."""
    import torch

    digest = hashlib.sha256(assignment.source.read_bytes())
    from grader.judge import scenarios
    from grader.kernel import probe

    kernel_side = sorted(path for package in KERNEL_PACKAGES for path in package.glob("*.py"))
    mutants = MUTANTS / f"{assignment.name}.toml"
    for path in [*kernel_side, Path(probe.__file__), Path(scenarios.__file__), *([mutants] if mutants.exists() else [])]:
        digest.update(path.name.encode() + path.read_bytes())
    digest.update(f"{torch.__version__} {sys.version}".encode())
    return digest.hexdigest()[:16]


def reference_records(assignment: Assignment, new_kernel: Callable[[], Kernel], timeout: float) -> dict[str, ScenarioRecord]:
    """What every hidden observation of `assignment` must be: the reference run's records (cached)."""
    path = REFERENCE_CACHE / f"{assignment.name}-{_records_key(assignment)}.json"
    if path.exists():
        payloads = json.loads(path.read_text())
    else:
        payloads = _run_reference(assignment, new_kernel, timeout)
        _write_atomically(path, payloads)
    return {test: decode_payload(payload) for test, payload in payloads.items()}


def _run_reference(assignment: Assignment, new_kernel: Callable[[], Kernel], timeout: float) -> dict[str, dict]:
    steps = plan(reference_submission(assignment), assignment, reference=True)
    runs = harness.run_steps(steps, new_kernel, timeout)
    payloads: dict[str, dict] = {}
    for step, run in zip(steps, runs):
        where = f"{assignment.name}, {'hidden test ' + step.test if step.test else 'cell ' + step.label}"
        if run.failure and run.failure != OUTPUT_LIMIT:
            raise GradingEnvironmentBroken(f"{where}: the reference run stopped ({run.failure})")
        if not step.test:
            if run.error:
                detail = next((o.get("evalue", "") for o in run.outputs if o.get("output_type") == "error"), "")
                raise GradingEnvironmentBroken(f"{where}: the reference raised {run.error}: {detail[:300]}")
            continue
        if len(run.payloads) != 1 or run.payloads[0].get("error"):
            error = run.payloads[0].get("error") if run.payloads else "no result"
            raise GradingEnvironmentBroken(f"{where}: the reference solution did not complete the scenario ({error})")
        if not run.payloads[0].get("observed"):
            raise GradingEnvironmentBroken(f"{where}: the scenario observes nothing, so any answer would pass")
        payloads[step.test] = run.payloads[0]
    return payloads


def known_mistakes(assignment: Assignment, new_kernel: Callable[[], Kernel],
                   timeout: float, jobs: int = 1) -> dict[str, dict[str, ScenarioRecord]]:
    """test → mutant name → what that mutant's scenario recorded (cached like the reference records).

    The mutants are the course's own code, run the student's way in trusted kernels (`jobs` at a time),
    once per version.
    """
    path = REFERENCE_CACHE / f"{assignment.name}-mutants-{_records_key(assignment)}.json"
    if path.exists():
        payloads = json.loads(path.read_text())
    else:
        def record(group: list[Mutant]) -> list[tuple[str, str, dict]]:
            steps = plan(mutant_submission(assignment, group), assignment)
            runs = harness.run_steps(steps, new_kernel, timeout)
            ran = {step.test: run for step, run in zip(steps, runs) if step.test}
            return [(m.exercise, m.name, ran[m.exercise].payloads[0]) for m in group
                    if not ran[m.exercise].failure and len(ran[m.exercise].payloads) == 1]

        payloads = {}
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            for recorded in pool.map(record, pack_mutants(load_mutants(assignment))):
                for exercise, name, payload in recorded:
                    payloads.setdefault(exercise, {})[name] = payload
        _write_atomically(path, payloads)
    return {test: {name: decode_payload(p) for name, p in by_name.items()} for test, by_name in payloads.items()}


def _write_atomically(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkstemp(dir=path.parent, suffix=".partial")[1])
    partial.write_text(json.dumps(data))
    partial.replace(path)


# --- kernels ---------------------------------------------------------------------------------------------

def plain_kernel_factory(env: dict[str, str] | None = None) -> Callable[[], Kernel]:
    """Kernels of this interpreter with no sandbox (trusted code only: the reference run, --unsandboxed)."""
    def start() -> Kernel:
        work = tempfile.mkdtemp(prefix="kernel-")
        manager = KernelManager(kernel_name="python3", transport="ipc", ip=os.path.join(work, "kernel"))
        manager.connection_file = os.path.join(work, "connection.json")
        return Kernel(manager, scratch=work, cwd=work, env={**os.environ, **(env or {})})

    return start
