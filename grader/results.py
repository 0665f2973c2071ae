"""What grading produces, as named types: the request a worker gets (`Spec`), the row it returns (`Result`),
the status notes on that row (`Note`, whose `NoteKind` is the category the class report shows), and the
writers of grades.csv and results.json. Standard library only."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path


class NoteKind(Enum):
    """Why a row is not simply `ok`; each kind is one category of the class report, in the report's order."""

    TAMPERED = "tampered"  # a locked or test cell edited, deleted, duplicated or re-labelled (restored)
    INTERFERENCE = "interference"  # a test's result did not come from the test
    TIMEOUT = "timeout"  # a cell ran past --timeout
    KERNEL_DIED = "kernel died"  # the kernel died (a limit, a crash) or could not be started again
    LIMIT_HIT = "limit hit"  # output, memory, cell count or the worker's wall-clock budget
    SKIPPED = "skipped"  # the student's own cells used their time budget; later ones did not run
    INVALID = "invalid"  # the hand-in is not a readable notebook, or too large
    MISSING = "missing"  # the folder has no notebook for the assignment
    NO_SUBMISSION = "no submission"  # the student handed nothing in for the assignment
    REFUSED = "refused"  # collection refused it: links, special files, unsafe or unknown names
    GRADER_ERROR = "grader error"  # the grader itself failed on this hand-in (see the worker log)
    NOT_JUDGED = "not judged"  # judging one test failed on the values it got: that test earns nothing, the rest stand
    RENAMED = "renamed"  # graded under another file name than the release's
    EXTRA_FILES = "extra files"  # files beside the notebook, ignored
    REGRADED = "regraded by hand"  # an [[override]] in grading.toml set an exercise's points (grader/collect/deadlines.py)
    TIME_IGNORED = "time ignored"  # the upload carried its own hand-in time (timestamp.txt); the LMS's was used
    ANSWER_COPIED = "answer copied"  # an answer cell appears more than once: its last copy was graded
    METADATA_RESTORED = "metadata restored"  # cells lost their nbgrader metadata; matched to the release by cell id
    BY_HAND = "waiting for a hand grade"  # a written answer nobody has graded yet ([[override]] in grading.toml)
    OVERRIDE_CHANGED = "changed since regraded"  # an [[override]] was given for an earlier hand-in (collect/ledger.py)

    @property
    def graded(self) -> bool:
        """Whether a row with this note still had its notebook graded (statistics count only those)."""
        return self not in (NoteKind.INVALID, NoteKind.MISSING, NoteKind.NO_SUBMISSION, NoteKind.REFUSED)

    @property
    def look_at(self) -> bool:
        """Whether the report lists the row under "look at these" (an instructor should read the hand-in)."""
        return self in (NoteKind.TAMPERED, NoteKind.INTERFERENCE, NoteKind.TIMEOUT, NoteKind.KERNEL_DIED,
                        NoteKind.LIMIT_HIT, NoteKind.SKIPPED, NoteKind.GRADER_ERROR, NoteKind.NOT_JUDGED,
                        NoteKind.TIME_IGNORED, NoteKind.ANSWER_COPIED, NoteKind.OVERRIDE_CHANGED)


@dataclass(frozen=True)
class Note:
    """One status note: its kind decides where the report files it; its text is what people read."""

    kind: NoteKind
    text: str

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind.value, "text": self.text}

    @classmethod
    def from_json(cls, raw: dict[str, str]) -> Note:
        return cls(NoteKind(raw["kind"]), raw["text"])


def status_text(notes: list[Note]) -> str:
    """grades.csv's status column: the notes' texts, or `ok`."""
    return "; ".join(note.text for note in notes) or "ok"


@dataclass
class Spec:
    """What the parent asks a worker to grade."""

    student: str
    assignment: str
    notebook: str  # expected file name, e.g. 01_gradient_descent.ipynb
    submitted: str  # the handed-in notebook to grade ("" when there is none)
    template: str  # folder made by grader.author.release.generate: release/<assignment>/<notebook>
    result: str  # where to write the Result JSON
    feedback: str  # where to write the feedback HTML
    timeout: int  # seconds per cell
    sandbox: bool = True  # run the kernel in the sandbox (grader.kernel.sandbox)
    problem: Note | None = None  # set by the collector when there is nothing to grade
    notes: list[Note] = field(default_factory=list)  # what collection noticed (renamed, extra files, …)
    feedback_mode: str = "after-release"  # or "at-once": no hidden-test messages yet (grader/report/feedback.py)
    lateness: dict = field(default_factory=dict)  # grader.collect.deadlines.Lateness, shown on the feedback page
    canary_only: bool = False  # only check this worker's environment on the reference (before any student runs)
    last: bool = False  # no hand-in is likely to follow in this worker: it starts no kernel ahead for one
    overrides: list[dict] = field(default_factory=list)  # grader.collect.deadlines.Override for this hand-in (as dicts)

    def to_json(self) -> str:
        raw = asdict(self)
        raw["problem"] = self.problem.to_json() if self.problem else None
        raw["notes"] = [note.to_json() for note in self.notes]
        return json.dumps(raw)

    @classmethod
    def from_json(cls, text: str) -> Spec:
        raw = json.loads(text)
        raw["problem"] = Note.from_json(raw["problem"]) if raw.get("problem") else None
        raw["notes"] = [Note.from_json(n) for n in raw.get("notes", [])]
        return cls(**raw)


@dataclass
class Result:
    """One row of grades.csv before formatting."""

    student: str
    assignment: str
    scores: dict[str, float]
    max_scores: dict[str, float]
    status: list[Note] = field(default_factory=list)
    messages: dict[str, str] = field(default_factory=dict)  # test id -> what its failure says
    mistakes: dict[str, str] = field(default_factory=dict)  # failed test id -> the known mistake (mutant) it matches
    seconds: dict[str, float] = field(default_factory=dict)  # where grading spent its time (benchmarks/run.py)
    broken: str = ""  # set when the grading environment failed its canary: no grade was given
    answered: list[str] = field(default_factory=list)  # answer cells the student changed from the release
    unanswered: list[str] = field(default_factory=list)  # failed tests whose answer still raised NotImplementedError
    submitted_at: str = ""  # hand-in time as collection found it
    lateness: dict = field(default_factory=dict)  # grader.collect.deadlines.Lateness ({} when no due date applies)
    penalty: float = 0.0  # points the late policy took; grades.csv's total = sum(scores) - penalty
    # exercise -> {"graded": the autograder's points, "points": the instructor's, "reason": why} (deadlines.settle)
    overrides: dict[str, dict] = field(default_factory=dict)
    answers: dict[str, str] = field(default_factory=dict)  # answer cell -> the student's source (similarity report)
    # written answers, graded by hand and kept apart from the autograded tests: id -> points (None: not graded yet;
    # 0 when not answered), and each one's maximum
    by_hand: dict[str, float | None] = field(default_factory=dict)
    by_hand_max: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> float:
        """The points that count: the exercises' points, plus what was given by hand for written answers, less
        the late penalty (grades.csv's `total`; `max_total` counts the autograded tests only)."""
        given = sum(v for v in self.by_hand.values() if v is not None)
        return round(sum(self.scores.values()) + given - self.penalty, 6)

    def to_dict(self) -> dict:
        raw = asdict(self)
        raw["status"] = [note.to_json() for note in self.status]
        return raw

    @classmethod
    def from_dict(cls, raw: dict) -> Result:
        return cls(**{**raw, "status": [Note.from_json(n) for n in raw.get("status", [])]})

    @classmethod
    def read(cls, path: Path) -> Result:
        return cls.from_dict(json.loads(path.read_text(encoding="utf-8")))

    def write(self, path: Path) -> None:
        """Write atomically: an interrupted batch never leaves half a result."""
        path.parent.mkdir(parents=True, exist_ok=True)
        write_whole(path, json.dumps(self.to_dict(), indent=1))


def write_whole(path: Path, text: str) -> None:
    """Write `text` to `path` atomically (a temporary file beside it, then renamed): Ctrl-C or a crash while it is
    written leaves the file as it was before, or whole — never half a grades.csv someone may import."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text, encoding="utf-8", newline="")
    partial.replace(path)


def printable(text: str) -> str:
    """`text` with control characters escaped, safe to print in a terminal, a status or a CSV cell."""
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode() for ch in text)


def csv_cell(value: str) -> str:
    """A text cell a spreadsheet will not run as a formula (=, +, -, @ first), control characters escaped.

    A lone "-" (Moodle's worksheet: no grade) is no formula and stays as it is."""
    value = printable(value)
    if value[:1] not in ("=", "+", "-", "@") or value == "-":
        return value
    return "'" + value


def points(value: float) -> str:
    """A number of points as every page and CSV of the course writes it."""
    return f"{value:g}"


def write_csv(results: list[Result], exercises: list[str], path: Path) -> None:
    """grades.csv: student, assignment, points per exercise, total, max_total, late_by, penalty, status.

    A written answer's column is empty until it is graded by hand. `total` is the points after the late penalty
    (the exercises' points, plus what written answers were given, minus `penalty`); `late_by` is
    the hours after the due date in effect (0 when on time, empty when no due date applies or the
    hand-in time is unknown); see grader/collect/deadlines.py.
    """
    with io.StringIO(newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["student", "assignment", *exercises, "total", "max_total", "late_by", "penalty", "status"])
        for r in sorted(results, key=lambda r: (r.student, r.assignment)):
            row = [csv_cell(r.student), csv_cell(r.assignment)]
            given = {e: v for e, v in r.by_hand.items() if v is not None}
            row += [points(r.scores[e]) if e in r.scores else points(given[e]) if e in given else "" for e in exercises]
            late_by = r.lateness.get("late_by")
            row += [points(r.total), points(sum(r.max_scores.values())),
                    "" if late_by is None else points(late_by), points(r.penalty), csv_cell(status_text(r.status))]
            writer.writerow(row)
        write_whole(path, f.getvalue())


def write_json(results: list[Result], path: Path) -> None:
    """results.json: every row with its messages, known mistakes, notes and timings."""
    write_whole(path, json.dumps([r.to_dict() for r in results], indent=1))


def read_json(path: Path) -> list[Result]:
    return [Result.from_dict(raw) for raw in json.loads(path.read_text(encoding="utf-8"))]
