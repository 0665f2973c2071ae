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

import functools
import hashlib
import json
import os
import re
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
    """nbgrader's pre-convert hook: the notebook the course's grader grades gets its assignment's notebook name.

    nbgrader grades a notebook only under the name the gradebook knows, and only at the top of the hand-in
    folder; `Copy of 01_gradient_descent.ipynb` (Colab), `01-gradient-descent.ipynb` (Kaggle), a notebook whose
    metadata says the assignment, or one in a subfolder would be skipped and the student given 0. The course's
    collection (grader/collect/submissions.py) picks the notebook it grades, and that very file is moved to the
    name nbgrader knows (its content untouched), so nbgrader's notebook and the graded one are the same file; the
    old name is kept in course-grading/renamed.json for the verdict's note. nbgrader calls the hook once per
    student with the command's `assignment` and `student` patterns, so the folders come from the paths: every
    student's folder of this assignment is put right on the first call, and `notebooks`, nbgrader's own list, is
    updated in place.
    """
    from grader.collect.submissions import collect

    if not notebooks:
        return
    folder = Path(notebooks[0]).parent
    submitted = folder.parent.parent
    target = next((a for a in assignments() if a.name == folder.name), None)
    if target is None:
        return
    record_path = submitted.parent / COURSE_GRADING / RENAMED_FILE
    record = _record(record_path)
    for handin in collect(submitted, assignments(), target.name):
        canonical = submitted / handin.student / target.name / target.notebook
        if handin.notebook is None or handin.notebook == canonical or canonical.exists():
            continue
        handin.notebook.rename(canonical)
        record[f"{handin.student}/{target.name}"] = str(handin.notebook.relative_to(canonical.parent))
    if record:
        _write_record(record_path, record)
    canonical = folder / target.notebook
    if canonical.is_file() and str(canonical) not in notebooks:
        notebooks[:] = [str(canonical), *(n for n in notebooks if Path(n).exists())]


# --- sanitize: the release's cells back, the student's answers kept --------------------------------------------

class RestoreFromRelease(NbGraderPreprocessor):
    """The hand-in rebuilt on the course's release: locked and test cells from the release (no hidden test),
    the student's answers and own cells kept where they were (grader/judge/rebuild.py), and the student's markdown
    made plain text. The formgrader and the feedback render markdown as HTML, raw HTML and `javascript:` links
    included: a student's `<script>`, `onerror=` or link would run in the instructor's formgrader, with the rights
    to change grades; an image would tell the student when the instructor looked."""

    def preprocess(self, nb: NotebookNode, resources: ResourcesDict) -> tuple[NotebookNode, ResourcesDict]:
        from grader.judge.rebuild import ADDED, rebuild
        from labkit import cells

        assignment = course_assignment(resources["nbgrader"]["assignment"])
        rebuilt, _ = rebuild(nb, _release(assignment.release))  # what was tampered with is a note of the verdict
        stubs = {cells.grade_id(c): c for c in _release(assignment.release).cells if cells.kind(c) == cells.WRITTEN}
        for cell in rebuilt.cells:
            theirs = cell.metadata.get(ADDED) or (cells.kind(cell) == cells.WRITTEN
                                                  and cells.is_answered(cell, stubs[cells.grade_id(cell)]))
            if cell.cell_type == "markdown" and theirs:
                cell.source = as_text(cell.source)
                cell.pop("attachments", None)
        return rebuilt, resources


def as_text(markdown: str) -> str:
    """`markdown` as a fenced block, which renders as its plain text: no HTML, link or image of the student's can
    take effect (a fence longer than any run of backticks in it cannot be closed from inside)."""
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall("`+", markdown)), default=0))
    return f"{fence}text\n{markdown}\n{fence}"


@functools.lru_cache(maxsize=16)
def _release(path: Path) -> NotebookNode:
    """The course's release of an assignment, read once per process (rebuild copies what it uses)."""
    return nbformat.read(path, as_version=4)


# --- autograde: the course's verdicts --------------------------------------------------------------------------

# One batch per state of the assignment's hand-ins: nbgrader converts hand-ins one by one, the course's grader grades
# a class at once (warm sandboxed kernels on every core). The key holds every hand-in file's name, size and time, so
# a formgrader that autogrades again in the same process after a hand-in changed grades again (the course's grader
# regrades only what changed). A failure is kept too: every hand-in of the run fails with the same reason.
_batches: dict[tuple[str, str, str], dict[str, list[Result]] | CourseGradingFailed] = {}


def _state(submitted: Path, assignment: Assignment) -> str:
    """A digest of the names, sizes and modification times of every file in the assignment's hand-in folders."""
    digest = hashlib.sha256()
    for folder in sorted(submitted.glob(f"*/{assignment.name}")):
        for current, _, files in sorted(os.walk(folder)):
            for name in sorted(files):
                info = os.lstat(os.path.join(current, name))
                digest.update(f"{current}/{name}\0{info.st_size}\0{info.st_mtime_ns}\0".encode(errors="surrogateescape"))
    return digest.hexdigest()


def class_results(coursedir: CourseDirectory, assignment: Assignment) -> dict[str, list[Result]]:
    """The course grader's rows for `assignment`'s hand-ins in submitted/, by student key."""
    from grader.batch.autograde import GradingEnvironmentBroken, SandboxUnavailable, autograde
    from grader.collect.submissions import CollectionError

    submitted = _submitted_root(coursedir)
    key = (str(Path(coursedir.root).resolve()), assignment.name, _state(submitted, assignment))
    if key not in _batches:
        try:
            rows = autograde(submitted, _grading_folder(coursedir), only=assignment.name)
            by_student: dict[str, list[Result]] = {}
            for row in rows:
                if row.assignment == assignment.name:
                    by_student.setdefault(row.student, []).append(row)
            _batches[key] = by_student
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
    # built as plain nodes: nbformat's constructors validate each one against the schema (9 ms apiece)
    return [nbformat.from_dict({"output_type": "display_data", "data": {"text/plain": "\n".join(lines)}, "metadata": {}}),
            nbformat.from_dict({"output_type": "execute_result", "data": {"text/plain": points(got)}, "metadata": {},
                                "execution_count": None})]


def summary_cell(result: Result, renamed_from: str) -> NotebookNode:
    """The cell on top of the autograded notebook: the course grader's total and status notes, as plain text (the
    notes name files the student named: as markdown they would be HTML in the instructor's formgrader)."""
    total, full = sum(result.scores.values()), sum(result.max_scores.values())
    lines = [f"Autograded by the course's grader: {points(total)} of {points(full)} point(s).",
             f"Status: {status_text(result.status)}."]
    if renamed_from:
        lines.append(f"Handed in as {renamed_from!r}; graded as this assignment.")
    return nbformat.from_dict({
        "cell_type": "code", "id": "course-verdict", "source": "", "execution_count": None,
        "metadata": {"tml_course_verdict": True, "editable": False, "deletable": False},
        "outputs": [{"output_type": "display_data", "data": {"text/plain": "\n".join(lines)}, "metadata": {}}]})


class CourseVerdicts(NbGraderPreprocessor):
    """Each test cell's output set to the course grader's trusted verdict (points as partial credit)."""

    def preprocess(self, nb: NotebookNode, resources: ResourcesDict) -> tuple[NotebookNode, ResourcesDict]:
        info = resources["nbgrader"]
        assignment = course_assignment(info["assignment"])
        coursedir = CourseDirectory(config=self.config)
        student = info["student"]
        rows = class_results(coursedir, assignment).get(student, [])
        if len(rows) != 1:  # none: a folder name the course refuses; two: a refused folder claims this student's key
            raise CourseGradingFailed(f"the course's grader has {len(rows)} rows for the folder {printable(student)!r} "
                                      f"of {assignment.name}: see course-grading/grades.csv")
        (result,) = rows
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
    """Plug the course's grading into nbgrader's configuration `c` (called by the course's nbgrader_config.py).

    Left out of nbgrader's lists besides OverwriteCells and Execute: OverwriteKernelspec (no kernel runs under
    nbgrader) and CheckCellMetadata (every nbgrader cell of the rebuilt notebook is the release's, which
    `grader check` validates with nbgrader's own validator; it cost 0.15 s a pass)."""
    from nbgrader.preprocessors import AssignLatePenalties, ClearOutput, DeduplicateIds, SaveAutoGrades

    from grader.nbgrader.exchange import SafeCollect

    c.ExchangeFactory.collect = SafeCollect
    c.Autograde.sanitize_preprocessors = [ClearOutput, DeduplicateIds, RestoreFromRelease]
    c.Autograde.autograde_preprocessors = [CourseVerdicts, SaveAutoGrades, AssignLatePenalties]
    c.Autograde.pre_convert_hook = canonical_names
