"""`nbgrader autograde`, scored by the course's grader: the pieces nbgrader_config.py plugs into nbgrader.

nbgrader's Autograde converts each hand-in twice, with two configurable lists of preprocessors. The course
replaces the parts that would run or reveal anything:
- sanitize: `RestoreFromRelease` instead of nbgrader's OverwriteCells, which copies the gradebook's source
  cells back in — hidden tests included, so they would reach the formgrader and the feedback (nbgrader #917).
  The course's release has no hidden test, and its rebuild keeps the student's answers and own cells.
- autograde: `CourseVerdicts` instead of Execute. nbgrader runs no kernel: the course's grader grades the
  assignment's hand-ins in `submitted/` as one batch (sandboxed kernels, hidden scenarios, the trusted judge;
  cached per hand-in in `course-grading/`), and each test cell gets the trusted verdict as its only output —
  a line of text and the points as an `execute_result`, which nbgrader's own SaveAutoGrades reads as partial
  credit. Nothing a kernel printed reaches the notebook, so no nbgrader page can show it (the outflow rule).
nbgrader keeps the rest: the gradebook, due dates and its late-penalty plugin (AssignLatePenalties), manual
grades and comments, feedback, export. A manual grade stays through a second autograde unless the hand-in
changed (`forget_manual_grades`). `canonical_names`, a pre-convert hook, gives a renamed hand-in
(`Copy of 01_gradient_descent.ipynb`) its assignment's name, which nbgrader needs to find it in the gradebook.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import nbformat
from nbconvert.exporters.exporter import ResourcesDict
from nbformat.notebooknode import NotebookNode
from nbgrader.api import Gradebook, MissingEntry
from nbgrader.coursedir import CourseDirectory
from nbgrader.preprocessors import NbGraderPreprocessor

from grader.course import Assignment, assignments
from grader.results import Result, points, printable, status_text

# The course grader's own output inside the nbgrader course directory: its cache, grades.csv, report, feedback.
COURSE_GRADING = "course-grading"
RENAMED_FILE = "renamed.json"  # student/assignment -> the name the hand-in had before canonical_names
HANDINS_FILE = "nbgrader-hand-ins.json"  # student/assignment -> digest of the hand-in last given nbgrader's grades
DEFAULT_STRUCTURE = "{nbgrader_step}/{student_id}/{assignment_id}"


class CourseGradingFailed(RuntimeError):
    """The course's grader could not grade this assignment: nbgrader records no grade for it, and says why."""


def course_assignment(name: str) -> Assignment:
    """The course's assignment `name`, or CourseGradingFailed: this directory grades only the course's own."""
    found = {a.name: a for a in assignments()}.get(name)
    if found is None:
        known = ", ".join(a.name for a in assignments())
        raise CourseGradingFailed(f"{name!r} is not one of this course's assignments ({known}); this course directory "
                                  "grades only those. Grade other assignments in a course directory of their own.")
    return found


def _grading_folder(coursedir: CourseDirectory) -> Path:
    return Path(coursedir.root) / COURSE_GRADING


def _submitted_root(coursedir: CourseDirectory) -> Path:
    if coursedir.directory_structure != DEFAULT_STRUCTURE:
        raise CourseGradingFailed(f"CourseDirectory.directory_structure must stay {DEFAULT_STRUCTURE!r} for the "
                                  "course's grader, which reads submitted/<student>/<assignment>/")
    return Path(coursedir.root) / coursedir.submitted_directory


def _record(path: Path) -> dict[str, str]:
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _write_record(path: Path, record: dict[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(record, indent=1, sort_keys=True), encoding="utf-8")
    partial.replace(path)


# --- the renamed hand-in --------------------------------------------------------------------------------------

def canonical_names(assignment: str, student: str, notebooks: list[str], **_: object) -> None:
    """nbgrader's pre-convert hook: a hand-in saved under another name gets its assignment's notebook name.

    nbgrader grades a notebook only under the name the gradebook knows; `Copy of 01_gradient_descent.ipynb`
    (Colab), `01-gradient-descent.ipynb` (Kaggle) or any name whose notebook metadata says the assignment would
    be skipped and the student given 0. Such a file is renamed in place (its content untouched) when its folder
    has no notebook of the right name; the old name is kept in course-grading/renamed.json for the verdict's
    note. nbgrader calls the hook once per student with the command's `assignment` and `student` patterns, so
    the folders come from the paths: every student's folder of this assignment is put right on the first call
    (the course's grader grades them all then), and `notebooks`, nbgrader's own list, is updated in place.
    """
    if not notebooks:
        return
    folder = Path(notebooks[0]).parent
    submitted = folder.parent.parent
    target = next((a for a in assignments() if a.name == folder.name), None)
    if target is None:
        return
    record_path = submitted.parent / COURSE_GRADING / RENAMED_FILE
    record = _record(record_path)
    for handin in sorted(p for p in submitted.glob(f"*/{target.name}") if p.is_dir() and not p.is_symlink()):
        renamed = _rename_to_canonical(handin, target)
        if renamed:
            record[f"{handin.parent.name}/{target.name}"] = renamed
    if record:
        _write_record(record_path, record)
    canonical = folder / target.notebook
    if canonical.is_file() and str(canonical) not in notebooks:
        notebooks[:] = [str(canonical), *(n for n in notebooks if Path(n).exists())]


def _rename_to_canonical(handin: Path, target: Assignment) -> str:
    """Rename the one notebook in `handin` that is `target`'s under another name; returns its old name, or ''."""
    from grader.collect.submissions import assignment_in, notebook_for, read_bounded

    if (handin / target.notebook).exists():
        return ""
    known = assignments()
    meant = [p for p in sorted(handin.glob("*.ipynb")) if p.is_file() and not p.is_symlink()
             and (notebook_for(p.name, known) or assignment_in(read_bounded(p), known)) == target]
    if len(meant) != 1:  # none, or several candidates: which one the student meant is not ours to guess
        return ""
    meant[0].rename(handin / target.notebook)
    return meant[0].name


# --- sanitize: the release's cells back, the student's answers kept --------------------------------------------

class RestoreFromRelease(NbGraderPreprocessor):
    """The hand-in rebuilt on the course's release: locked and test cells from the release (no hidden test),
    the student's answers and own cells kept where they were (grader/judge/rebuild.py)."""

    def preprocess(self, nb: NotebookNode, resources: ResourcesDict) -> tuple[NotebookNode, ResourcesDict]:
        from grader.judge.rebuild import rebuild

        assignment = course_assignment(resources["nbgrader"]["assignment"])
        released = nbformat.read(assignment.release, as_version=4)
        rebuilt, _ = rebuild(nb, released)  # what was tampered with is a note of the course's verdict
        return rebuilt, resources


# --- autograde: the course's verdicts --------------------------------------------------------------------------

# One batch per course directory and assignment per process: nbgrader converts hand-ins one by one, the course's
# grader grades a class at once (warm sandboxed kernels on every core). A failure is kept, so that every hand-in
# of the run fails with the same reason instead of starting the batch again.
_batches: dict[tuple[str, str], dict[str, Result] | CourseGradingFailed] = {}


def class_results(coursedir: CourseDirectory, assignment: Assignment) -> dict[str, Result]:
    """The course grader's rows for `assignment`'s hand-ins in submitted/, by student folder name."""
    from grader.batch.autograde import GradingEnvironmentBroken, SandboxUnavailable, autograde
    from grader.collect.submissions import CollectionError

    key = (str(Path(coursedir.root).resolve()), assignment.name)
    if key not in _batches:
        try:
            rows = autograde(_submitted_root(coursedir), _grading_folder(coursedir), only=assignment.name)
            _batches[key] = {r.student: r for r in rows if r.assignment == assignment.name}
        except (GradingEnvironmentBroken, SandboxUnavailable, CollectionError) as err:
            _batches[key] = CourseGradingFailed(f"the course's grader graded nothing: {printable(str(err))}")
    found = _batches[key]
    if isinstance(found, CourseGradingFailed):
        raise found
    return found


def handin_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""


def forget_manual_grades(db_url: str, notebook: str, assignment: str, student: str) -> int:
    """Drop the manual scores and comments of one submitted notebook (its hand-in changed); returns how many."""
    dropped = 0
    with Gradebook(db_url) as gb:
        try:
            submitted = gb.find_submission_notebook(notebook, assignment, student)
        except MissingEntry:
            return 0
        for grade in submitted.grades:
            if grade.manual_score is not None or grade.extra_credit:
                grade.manual_score, grade.extra_credit = None, None
                dropped += 1
        for comment in submitted.comments:
            if comment.manual_comment:
                comment.manual_comment = None
                dropped += 1
        gb.db.commit()
    return dropped


def verdict_outputs(result: Result, grade_id: str) -> list[NotebookNode]:
    """A test cell's outputs: the trusted verdict in words, then its points as nbgrader's partial credit."""
    got, full = result.scores.get(grade_id, 0.0), result.max_scores[grade_id]
    lines = [f"{'✓' if got >= full else '✗'} {points(got)} of {points(full)} point(s), from the course's grader"]
    if grade_id in result.unanswered:
        lines.append("not answered yet")
    elif message := result.messages.get(grade_id):
        lines.append(message)
    if mistake := result.mistakes.get(grade_id):
        lines.append(f"known mistake: {mistake}")
    if override := result.overrides.get(grade_id):
        lines.append(f"set by hand: {override.get('reason', '')}")
    return [nbformat.v4.new_output("display_data", data={"text/plain": "\n".join(lines)}),
            nbformat.v4.new_output("execute_result", data={"text/plain": points(got)}, execution_count=None)]


def summary_cell(result: Result, renamed_from: str) -> NotebookNode:
    """The markdown cell on top of the autograded notebook: the course grader's total and its status notes."""
    total, full = sum(result.scores.values()), sum(result.max_scores.values())
    notes = status_text(result.status)
    lines = [f"**Autograded by the course's grader:** {points(total)} of {points(full)} point(s).",
             f"Status: {notes}." if notes != "ok" else "Status: ok."]
    if renamed_from:
        lines.append(f"Handed in as `{renamed_from}`; graded as this assignment.")
    cell = nbformat.v4.new_markdown_cell("\n\n".join(lines), id="course-verdict")
    cell.metadata["tml_course_verdict"] = True
    return cell


class CourseVerdicts(NbGraderPreprocessor):
    """Each test cell's output set to the course grader's trusted verdict (points as partial credit)."""

    def preprocess(self, nb: NotebookNode, resources: ResourcesDict) -> tuple[NotebookNode, ResourcesDict]:
        from grader.collect.submissions import slug

        info = resources["nbgrader"]
        assignment = course_assignment(info["assignment"])
        coursedir = CourseDirectory(config=self.config)
        rows = class_results(coursedir, assignment)
        student = info["student"]
        result = rows.get(student) or rows.get(slug(student))
        if result is None:
            raise CourseGradingFailed(f"the course's grader has no row for {printable(student)}'s "
                                      f"{assignment.name}; run nbgrader autograde again")
        key = f"{student}/{assignment.name}"
        folder = _grading_folder(coursedir)
        self._forget_if_changed(folder, key, info, _submitted_root(coursedir) / student / assignment.name / assignment.notebook)
        for cell in nb.cells:
            grade_id = (cell.metadata.get("nbgrader") or {}).get("grade_id")
            if cell.cell_type == "code" and grade_id in result.max_scores:
                cell.outputs = verdict_outputs(result, grade_id)
        nb.cells = [c for c in nb.cells if not c.metadata.get("tml_course_verdict")]
        nb.cells.insert(0, summary_cell(result, _record(folder / RENAMED_FILE).get(key, "")))
        return nb, resources

    def _forget_if_changed(self, folder: Path, key: str, info: dict, handin: Path) -> None:
        """A manual grade belongs to the hand-in it was given for: a changed hand-in loses it."""
        record = _record(folder / HANDINS_FILE)
        digest = handin_digest(handin)
        if record.get(key) not in (None, digest):
            dropped = forget_manual_grades(info["db_url"], info["notebook"], info["assignment"], info["student"])
            if dropped:
                self.log.warning("%s handed in a changed notebook: %d manual grade(s) and comment(s) dropped",
                                 key, dropped)
        record[key] = digest
        _write_record(folder / HANDINS_FILE, record)


def use_course_grading(c) -> None:
    """Plug the course's grading into nbgrader's configuration `c` (called by the course's nbgrader_config.py)."""
    from nbgrader.preprocessors import (
        AssignLatePenalties,
        CheckCellMetadata,
        ClearOutput,
        DeduplicateIds,
        OverwriteKernelspec,
        SaveAutoGrades,
    )

    c.Autograde.sanitize_preprocessors = [ClearOutput, DeduplicateIds, OverwriteKernelspec, RestoreFromRelease,
                                          CheckCellMetadata]
    c.Autograde.autograde_preprocessors = [CourseVerdicts, SaveAutoGrades, AssignLatePenalties, CheckCellMetadata]
    c.Autograde.pre_convert_hook = canonical_names
