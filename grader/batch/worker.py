"""Grade submissions one after another: `python -m grader.batch.worker`.

The worker reads one spec path per line on stdin, writes that spec's Result JSON, and answers
`done` on stdout; it stays alive for the next one, so torch, the fork server and the reference
records are loaded once per worker. Student code never runs in this process: it runs in a kernel
(sandboxed, forked by the worker's grader.kernel.sandbox.ForkServer), and this process judges what the
kernel sends back (grader/judge/grading.py). If the worker itself dies, the parent records a status for
that submission and starts a new worker.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import sys
import time
import traceback
from pathlib import Path

import nbformat
from nbformat.v4.nbbase import random_cell_id
from nbformat.validator import get_validator

from grader.author.mutants import load_mutants
from grader.batch import stopping
from grader.collect.deadlines import settle
from grader.collect.files import read_regular
from grader.collect.submissions import MAX_NOTEBOOK_BYTES
from grader.course import assignment_named, put_interpreter_on_path
from grader.judge.rebuild import rebuild
from grader.judge.scenarios import scenarios
from grader.kernel import kernelspec, sandbox
from grader.results import Note, NoteKind, Result, Spec
from labkit import cells

# What parsing a hand-in may build: JSON values (objects, arrays, strings, numbers …) and nesting. A notebook
# of empty objects under the byte limit would otherwise make this process 24 times its size.
MAX_JSON_VALUES = 2_000_000
MAX_JSON_DEPTH = 64
# With escaped backslashes and quotes removed first (left to right, as a parser pairs them), a string runs to
# its closing quote, or to the end of a broken file: a match never fails, so the substitution stays linear.
_JSON_STRING = re.compile(rb'"[^"]*(?:"|\Z)')
_OPENS, _CLOSES = b"[{", b"]}"


class TooLarge(ValueError):
    """A hand-in over a bound of parsing: bytes, values or depth."""


def check_json_bounds(data: bytes) -> None:
    """TooLarge unless `data` holds at most MAX_JSON_VALUES values nested at most MAX_JSON_DEPTH deep.

    Counted on the text with every string replaced by one character (brackets in cell sources do not count):
    a value is a container, a key or what follows a comma; the depth is the largest running sum of brackets.
    """
    import numpy as np

    unescaped = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    if unescaped.count(b'"') > 4 * MAX_JSON_VALUES:  # two quotes a string, each string a key or a value
        raise TooLarge(f"more than {MAX_JSON_VALUES} JSON values")
    skeleton = _JSON_STRING.sub(b"0", unescaped)
    values = sum(skeleton.count(bytes([c])) for c in b",:[{") + 1
    if values > MAX_JSON_VALUES:
        raise TooLarge(f"more than {MAX_JSON_VALUES} JSON values")
    brackets = np.frombuffer(skeleton.translate(None, bytes(c for c in range(256) if c not in _OPENS + _CLOSES)),
                             dtype=np.uint8)
    steps = np.where(np.isin(brackets, np.frombuffer(_OPENS, dtype=np.uint8)), 1, -1).astype(np.int8)
    if steps.size and int(np.cumsum(steps, dtype=np.int32).max()) > MAX_JSON_DEPTH:
        raise TooLarge(f"nested deeper than {MAX_JSON_DEPTH} levels")


def _load(path: Path) -> nbformat.NotebookNode:
    """The handed-in notebook: a regular file (never through a link), bounded in size, values and depth, nbformat 4."""
    data = read_regular(path, MAX_NOTEBOOK_BYTES + 1)
    if len(data) > MAX_NOTEBOOK_BYTES:
        raise TooLarge(f"larger than {MAX_NOTEBOOK_BYTES // 2**20} MB")
    check_json_bounds(data)
    return cells_of(json.loads(data.decode("utf-8")))


CELL_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")  # the whole id (fullmatch): "$" would let a final newline through


def cells_of(raw: object) -> nbformat.NotebookNode:
    """A notebook rebuilt from what grading uses — each cell's type, source, metadata and id — and nothing else.

    Editors save nbformat 4 with variations nbformat's validator refuses (ids in a 4.4 file, outputs with
    extra fields, no execution counts): none of that is the student's answer, so it is not held against it.
    """
    major = raw.get("nbformat") if isinstance(raw, dict) else None
    if major != 4:
        raise ValueError(f"nbformat {major!r}, expected 4")
    assert isinstance(raw, dict)
    if not isinstance(raw.get("cells"), list):
        raise ValueError("no list of cells")
    nb = nbformat.v4.new_notebook()
    for cell in raw["cells"]:
        if not isinstance(cell, dict) or cell.get("cell_type") not in ("code", "markdown", "raw"):
            continue
        source = cell.get("source", "")
        source = "".join(part for part in source if isinstance(part, str)) if isinstance(source, list) else source
        metadata = cell.get("metadata")
        cell_id = cell.get("id")
        new = {"id": cell_id if isinstance(cell_id, str) and CELL_ID.fullmatch(cell_id) else random_cell_id(),
               "cell_type": cell["cell_type"], "metadata": metadata if isinstance(metadata, dict) else {},
               "source": source if isinstance(source, str) else ""}
        if cell["cell_type"] == "code":
            new.update(outputs=[], execution_count=None)
        nb.cells.append(nbformat.from_dict(new))
    # One check of the whole notebook with fastjsonschema, not nbformat's per cell with jsonschema (50 ms a hand-in;
    # nbformat.validate would also repeat a failed check with jsonschema, minutes for a huge invalid notebook)
    get_validator(nb.nbformat, nb.nbformat_minor, name="fastjsonschema").validate(nb)
    return nb


_FORKSERVER: sandbox.ForkServer | None = None
_KERNELS: kernelspec.KernelsAhead | None = None
_CANARY_PASSED: set[str] = set()


def _sandboxed_kernels() -> kernelspec.KernelsAhead:
    """This worker's fork server and its kernels, started on first use and kept for every later submission: each
    kernel starts while the submission before it grades."""
    global _FORKSERVER, _KERNELS
    if _KERNELS is None:
        _FORKSERVER = sandbox.ForkServer()
        _FORKSERVER.spawn()
        _KERNELS = kernelspec.KernelsAhead(_FORKSERVER)
    return _KERNELS


def _new_kernel(spec: Spec):
    from grader.judge.grading import plain_kernel_factory

    return _sandboxed_kernels() if spec.sandbox else plain_kernel_factory()


@functools.lru_cache(maxsize=8)
def _released(template: str, name: str) -> nbformat.NotebookNode:
    """The release of assignment `name` in `template`, read once per worker (only ever read: rebuilds copy it)."""
    return nbformat.read(Path(template) / "release" / name / assignment_named(name).notebook, as_version=4)


@functools.lru_cache(maxsize=8)
def _references(name: str, template: str, timeout: int) -> tuple[dict, dict]:
    """The reference records and known mistakes of the assignment released in `template`, read once per worker
    (the files they are cached in are keyed by everything they depend on; none of it changes during a batch)."""
    from grader.judge.grading import known_mistakes, plain_kernel_factory, reference_records

    assignment, released = assignment_named(name), _released(template, name)
    return (reference_records(assignment, plain_kernel_factory(), timeout, released),
            known_mistakes(assignment, plain_kernel_factory(), timeout, released=released))


def _canary(assignment, spec: Spec, released: nbformat.NotebookNode) -> str:
    """'' once the reference has earned full marks in this worker's environment (checked once per assignment)."""
    if assignment.name not in _CANARY_PASSED:
        from grader.judge.grading import canary

        records = _references(spec.assignment, spec.template, spec.timeout)[0]
        problem = canary(assignment, _new_kernel(spec), spec.timeout, records, released)
        if problem:
            return problem
        _CANARY_PASSED.add(assignment.name)
    return ""


def grade(spec: Spec) -> Result:
    """Grade one submission; every failure becomes a status note, never an exception."""
    # On the first submission the fork server (started here) imports torch and the kernel's packages while this
    # process imports the judge, torch too, below: on two cores the two imports take the time of one.
    if spec.sandbox:
        _sandboxed_kernels().ahead = not spec.last
    from grader.judge.grading import coarse, grade_notebook, run_notes
    from grader.report.feedback import write_feedback

    assignment = assignment_named(spec.assignment)
    released = _released(spec.template, spec.assignment)
    max_scores = {s.test: s.points for s in scenarios(assignment)}
    result = Result(spec.student, spec.assignment, {k: 0.0 for k in max_scores}, max_scores)
    result.status += spec.notes
    if spec.canary_only:
        result.broken = _canary(assignment, spec, released)
        return result
    if spec.problem or not spec.submitted:
        result.status.append(spec.problem or Note(NoteKind.MISSING, "no notebook"))
        return result
    try:
        submitted = _load(Path(spec.submitted))
    except TooLarge as exc:
        result.status.append(Note(NoteKind.INVALID, f"notebook too large to read: {exc}"))
        return result
    except Exception as exc:  # any unreadable file is a status, not a crash
        result.status.append(Note(NoteKind.INVALID, f"invalid notebook: {type(exc).__name__}: {str(exc)[:200]}"))
        return result
    rebuilt, tamper_notes = rebuild(submitted, released)
    result.status += tamper_notes
    result.answered = _answered(rebuilt, released)
    result.by_hand_max, result.by_hand = _written(rebuilt, released)
    result.answers = {gid: c.source for c in rebuilt.cells if (gid := cells.grade_id(c)) in result.answered}

    problem = _canary(assignment, spec, released)
    if problem:
        result.broken = problem
        return result
    new_kernel = _new_kernel(spec)
    records, mistakes = _references(spec.assignment, spec.template, spec.timeout)
    started = time.monotonic()
    graded = grade_notebook(rebuilt, assignment, new_kernel, spec.timeout, records, mistakes)
    judged = time.monotonic()
    result.scores = {test: v.points for test, v in graded.verdicts.items()}
    result.messages = {test: v.message for test, v in graded.verdicts.items() if v.message}
    result.mistakes = {test: name for test, name in graded.mistakes.items() if name}
    result.status += run_notes(graded)
    result.unanswered = graded.unanswered
    whys = {m.name: m.why for m in load_mutants(assignment)}
    settle(result, spec.lateness, spec.overrides)
    write_feedback(Path(spec.feedback), student=spec.student, assignment=spec.assignment, notebook=rebuilt,
                   graded=graded, status=result.status, mistakes={t: whys[n] for t, n in result.mistakes.items()},
                   mode=spec.feedback_mode, late=spec.lateness.get("note", ""), penalty=result.penalty,
                   overrides=result.overrides)
    spent = graded.seconds()
    result.seconds = coarse({**spent, "judging": judged - started - sum(spent.values()), "feedback": time.monotonic() - judged})
    return result


def _answered(rebuilt: nbformat.NotebookNode, released: nbformat.NotebookNode) -> list[str]:
    """Answer cells whose source differs from the released stub (what tells a blank hand-in from a tried one)."""
    stubs = {cells.grade_id(c): c.source.strip() for c in released.cells if cells.kind(c) == cells.ANSWER}
    return [gid for c in rebuilt.cells if (gid := cells.grade_id(c)) in stubs and c.source.strip() != stubs[gid]]


def _written(rebuilt: nbformat.NotebookNode, released: nbformat.NotebookNode
             ) -> tuple[dict[str, float], dict[str, float | None]]:
    """The written answers' maxima, and their points so far: 0 when not answered, else None (a person grades it)."""
    stubs = {cells.grade_id(c): c for c in released.cells if cells.kind(c) == cells.WRITTEN}
    given = {gid: None if cells.is_answered(c, stubs[gid]) else 0.0
             for c in rebuilt.cells if (gid := cells.grade_id(c)) in stubs}
    maxima = {gid: float(cells.nbgrader(c)["points"]) for gid, c in stubs.items()}
    return maxima, {gid: given.get(gid, 0.0) for gid in stubs}


def grade_to_file(spec_path: Path) -> None:
    """Grade the spec stored at `spec_path` and write its Result JSON atomically."""
    spec = Spec.from_json(spec_path.read_text())
    try:
        result = grade(spec)
    except Exception as exc:  # a bug met by one odd hand-in is that hand-in's status, never the batch's
        traceback.print_exc()
        failed = Note(NoteKind.GRADER_ERROR, f"grading failed: internal error {type(exc).__name__} (see the worker log)")
        result = Result(spec.student, spec.assignment, {}, {}, [*spec.notes, failed])
    result.write(Path(spec.result))


def main() -> int:
    logging.basicConfig(level=logging.WARNING)
    stopping.die_with_parent()  # a parent killed outright (SIGKILL) leaves no worker, fork server or kernel
    put_interpreter_on_path()
    # stdout is the channel to the parent; everything else written to fd 1 (kernels started from
    # here inherit it) goes to the log on stderr instead.
    channel = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    try:
        for line in sys.stdin:
            grade_to_file(Path(line.strip()))
            channel.write("done\n")
            channel.flush()
    finally:
        if _KERNELS is not None:
            _KERNELS.close()
        if _FORKSERVER is not None:
            _FORKSERVER.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
