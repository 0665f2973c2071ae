"""Grade submissions, each in a private nbgrader course folder: `python -m grader.worker`.

The worker reads one spec path per line on stdin, writes that spec's Result JSON, and answers
`done` on stdout; it stays alive for the next one, so nbgrader is imported once per worker, not
once per submission. Each submission gets its own copy of the gradebook, so workers run side by
side and a re-grade starts from nothing (no stale scores). Student code never runs in this process
(it runs in the kernel nbgrader starts), and if the worker itself dies the parent records a status
for that submission and starts a new worker.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import nbformat
from nbgrader.api import Gradebook

from grader import integrity, sandbox
from grader.course import SOLUTIONS, load_config, nbgrader_api, put_interpreter_on_path
from grader.preprocessors import CELL_TIMEOUT, KERNEL_DIED, OUTPUT_LIMIT


@dataclass
class Spec:
    """What the parent asks a worker to grade."""

    student: str
    assignment: str
    notebook: str  # expected file name, e.g. 01_gradient_descent.ipynb
    files: list[str]  # everything the student handed in for this assignment
    template: str  # folder made by grader.release.generate: release/ and gradebook.db
    result: str  # where to write the Result JSON
    feedback: str  # where to write the feedback HTML
    timeout: int  # seconds per cell
    sandbox: bool = True  # run the kernel in bubblewrap (grader.sandbox)
    problem: str = ""  # set by the collector when there is nothing to grade


@dataclass
class Result:
    """One row of grades.csv before formatting."""

    student: str
    assignment: str
    scores: dict[str, float]
    max_scores: dict[str, float]
    status: list[str] = field(default_factory=list)


def _grade_ids(nb: nbformat.NotebookNode) -> list[str]:
    return [c.metadata["nbgrader"]["grade_id"] for c in nb.cells if "nbgrader" in c.metadata]


def rebuild(submitted: nbformat.NotebookNode, released: nbformat.NotebookNode) -> tuple[nbformat.NotebookNode, list[str]]:
    """The released notebook with the student's answers and own cells put back in; plus what was tampered with.

    Locked cells, tests and their metadata always come from the release, so an edited, deleted,
    duplicated or re-labelled cell is undone; the student's answer cells and the cells they added
    (no nbgrader metadata) are kept in their place.
    """
    notes: list[str] = []
    known = set(_grade_ids(released))
    answers: dict[str, nbformat.NotebookNode] = {}
    extras: dict[str | None, list[nbformat.NotebookNode]] = {}
    released_ids = {c.get("id") for c in released.cells}
    anchor: str | None = None
    for cell in submitted.cells:
        info = cell.get("metadata", {}).get("nbgrader")
        if not info:
            # The student's own cells: code they added, and prose cells the release does not have.
            if cell.cell_type == "code" or cell.get("id") not in released_ids:
                extras.setdefault(anchor, []).append(cell)
            continue
        grade_id = info.get("grade_id")
        if grade_id not in known:
            notes.append(f"unknown cell {grade_id!r} removed")
        elif grade_id in answers:
            notes.append(f"duplicated cell {grade_id} ignored")
        else:
            answers[grade_id] = cell
            anchor = grade_id
    rebuilt = copy.deepcopy(released)
    cells = list(extras.get(None, []))
    for cell in rebuilt.cells:
        cells.append(cell)
        info = cell.metadata.get("nbgrader")
        if not info:
            continue
        grade_id = info["grade_id"]
        theirs = answers.get(grade_id)
        if theirs is None:
            notes.append(f"deleted {'answer ' if info.get('solution') else ''}cell {grade_id} restored")
        elif info.get("solution"):
            cell.source = theirs.source
        else:
            if theirs.source != cell.source:
                notes.append(f"edited locked cell {grade_id} restored")
            their_info = theirs.metadata.get("nbgrader", {})
            if any(their_info.get(k) != info.get(k) for k in ("grade", "solution", "locked", "points")):
                notes.append(f"changed metadata of {grade_id} restored")
        cells.extend(extras.get(grade_id, []))
    rebuilt.cells = cells
    return rebuilt, [f"tampered: {n}" for n in notes]


def _pick_notebook(spec: Spec) -> tuple[Path | None, list[str]]:
    files = [Path(f) for f in spec.files]
    notebooks = [f for f in files if f.suffix == ".ipynb"]
    exact = [f for f in notebooks if f.name == spec.notebook]
    chosen = exact[0] if exact else (notebooks[0] if len(notebooks) == 1 else None)
    notes = []
    if chosen is None:
        found = ", ".join(f.name for f in notebooks) or "no notebook"
        notes.append(f"missing notebook {spec.notebook} (found: {found})")
    elif chosen.name != spec.notebook:
        notes.append(f"renamed: graded {chosen.name} as {spec.notebook}")
    others = [f.name for f in files if f != chosen]
    if others:
        shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        notes.append(f"extra files ignored: {shown}")
    return chosen, notes


def _load(path: Path) -> nbformat.NotebookNode:
    text = path.read_text(encoding="utf-8")
    raw = json.loads(text)
    major = raw.get("nbformat") if isinstance(raw, dict) else None
    if major != 4:
        raise ValueError(f"nbformat {major!r}, expected 4")
    nb = nbformat.reads(text, as_version=4)
    nbformat.validate(nb)
    return nb


def _execution_notes(nb: nbformat.NotebookNode) -> list[str]:
    notes = []
    for index, cell in enumerate(nb.cells):
        where = cell.metadata.get("nbgrader", {}).get("grade_id") or f"#{index}"
        for out in cell.get("outputs", []):
            name = out.get("ename") if out.get("output_type") == "error" else None
            if name == KERNEL_DIED:
                notes.append(f"kernel died in cell {where}")
            elif name == CELL_TIMEOUT:
                notes.append(f"timeout in cell {where}")
            elif name == OUTPUT_LIMIT:
                notes.append(f"output too large in cell {where}")
            elif name == "MemoryError":
                notes.append(f"out of memory in cell {where}")
    return notes


_FORKSERVER: sandbox.ForkServer | None = None


def _forkserver() -> sandbox.ForkServer:
    """This worker's fork server, started on first use and kept for every later submission."""
    global _FORKSERVER
    if _FORKSERVER is None:
        _FORKSERVER = sandbox.ForkServer()
        os.environ[sandbox.FORKSERVER_ENV] = str(_FORKSERVER.control)
    return _FORKSERVER


def grade(spec: Spec) -> Result:
    """Grade one submission; every failure becomes a status note, never an exception."""
    released_path = Path(spec.template) / "release" / spec.assignment / spec.notebook
    released = nbformat.read(released_path, as_version=4)
    max_scores = {
        c.metadata.nbgrader["grade_id"]: float(c.metadata.nbgrader["points"])
        for c in released.cells
        if c.metadata.get("nbgrader", {}).get("grade")
    }
    result = Result(spec.student, spec.assignment, {k: 0.0 for k in max_scores}, max_scores)
    if spec.problem:
        result.status.append(spec.problem)
        return result
    chosen, notes = _pick_notebook(spec)
    result.status += notes
    if chosen is None:
        return result
    try:
        submitted = _load(chosen)
    except Exception as exc:  # any unreadable file is a status, not a crash
        result.status.append(f"invalid notebook: {type(exc).__name__}: {str(exc)[:200]}")
        return result
    rebuilt, tamper_notes = rebuild(submitted, released)
    result.status += tamper_notes
    finding = integrity.scan(rebuilt, released)
    fooled = [c.metadata.nbgrader["grade_id"] for c in rebuilt.cells[finding.cell_index:]
              if c.metadata.get("nbgrader", {}).get("grade")] if finding else []
    if finding:
        result.status.append(f"tampered: cell {finding.cell_id} {finding.reason}; "
                             f"no points for {', '.join(fooled) or 'nothing'}")

    with tempfile.TemporaryDirectory(prefix="grade-") as tmp:
        course = Path(tmp)
        target = course / "submitted" / spec.student / spec.assignment / spec.notebook
        target.parent.mkdir(parents=True)
        nbformat.write(rebuilt, target)
        shutil.copy(Path(spec.template) / "gradebook.db", course / "gradebook.db")
        config = load_config(root=str(course), source_directory=str(SOLUTIONS))
        config.CourseDirectory.db_url = f"sqlite:///{course / 'gradebook.db'}"
        config.Execute.timeout = spec.timeout
        config.Exchange.root = str(course / "exchange")  # unused; keeps nbgrader from probing /usr/local
        (course / "exchange").mkdir()
        if spec.sandbox:
            # The kernel talks over Unix sockets in a folder the sandbox binds: TCP cannot cross --unshare-net.
            runtime = _forkserver().next_runtime()
            os.environ["JUPYTER_RUNTIME_DIR"] = str(runtime)
            config.Execute.kernel_name = sandbox.KERNEL_NAME
            config.KernelManager.transport = "ipc"
            config.KernelManager.ip = str(runtime / "kernel")
        api = nbgrader_api(config)
        graded = api.autograde(spec.assignment, spec.student, force=True, create=True)
        if not graded["success"]:
            last = (graded.get("error") or graded.get("log") or "").strip().splitlines()[-1:] or ["no log"]
            result.status.append(f"grading failed: {last[0][:200]}")
            return result
        autograded = course / "autograded" / spec.student / spec.assignment / spec.notebook
        result.status += _execution_notes(nbformat.read(autograded, as_version=4))
        with Gradebook(config.CourseDirectory.db_url) as gb:
            notebook = gb.find_submission_notebook(Path(spec.notebook).stem, spec.assignment, spec.student)
            for g in notebook.grades:
                if g.name in result.scores and g.name not in fooled:
                    result.scores[g.name] = float(g.score)
        feedback = api.generate_feedback(spec.assignment, spec.student, force=True)
        html = course / "feedback" / spec.student / spec.assignment / f"{Path(spec.notebook).stem}.html"
        if feedback["success"] and html.exists():
            Path(spec.feedback).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(html, spec.feedback)
        else:
            result.status.append("feedback could not be generated")
    return result


def grade_to_file(spec_path: Path) -> None:
    """Grade the spec stored at `spec_path` and write its Result JSON atomically."""
    spec = Spec(**json.loads(spec_path.read_text()))
    result = grade(spec)
    out = Path(spec.result)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".partial")
    partial.write_text(json.dumps(asdict(result), indent=1))
    partial.replace(out)  # an interrupted batch never leaves half a result


def main() -> int:
    logging.basicConfig(level=logging.WARNING)
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
        if _FORKSERVER is not None:
            _FORKSERVER.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
