"""Finding submissions in a folder (`<student>/<assignment>/<notebook>.ipynb`) or an LMS zip.

Collection never trusts a hand-in: it lists folders without following links, looks only at regular
files, reads names and sizes and, only where a name does not say which assignment a notebook is, that
notebook's metadata (bounded in size; `assignment_in`), and turns everything odd — a link, a device file,
an unreadable folder, an unsafe name, a file too large, a notebook of another assignment — into a status
on that student's row, so one hand-in cannot stop the batch.

A hand-in renamed on the way is still graded as its assignment: by its name once the additions of
re-uploads, Colab (`Copy of …`) and Kaggle (`-` for `_`) are taken off, or else by the assignment the
release wrote into its metadata (`metadata.tml.assignment`); the status says what it was called.

Hand-in times come only from the collection, never from what a student uploaded: from an LMS zip,
the time the zip records for the hand-in's files (kept in `COLLECTION_TIMES` beside the unpacked folders,
where no upload can land; none for a Moodle zip, whose times are not hand-in times); from a folder,
nbgrader's `timestamp.txt`, which its exchange writes. A `timestamp.txt` inside an LMS upload is the
student's own file: ignored, with a status note.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from grader.collect.files import read_regular
from grader.collect.lms_zip import (  # noqa: F401 (collection's one entry point for LMS zips too)
    COLLECTION_TIMES,
    MAX_MEMBERS,
    MAX_ZIP_BYTES,
    CollectionError,
    Unpacked,
    collection_refused,
    collection_times,
    unpack_zip,
)
from grader.collect.names import (  # noqa: F401 (what other modules import from here)
    MAX_NOTEBOOK_BYTES,
    SAFE_NAME,
    assignment_in,
    hashed_key,
    notebook_for,
    slug,
)
from grader.course import Assignment
from grader.results import Note, NoteKind, printable

MAX_ENTRIES = 2000  # files looked at per hand-in folder
TIMESTAMP_FILE = "timestamp.txt"  # nbgrader's convention: when the hand-in arrived
SECRET_FILE = "submission_secret.txt"  # what nbgrader's submit writes beside it: the exchange's, no extra file


@dataclass
class Submission:
    """One student's hand-in for one assignment, as collection found it."""

    student: str
    assignment: str
    notebook: Path | None = None  # the regular file to grade
    notes: list[Note] = field(default_factory=list)  # renamed, extra files, refused links …
    problem: Note | None = None  # set when there is nothing to grade; the row says why
    submitted_at: str = ""  # ISO time from the LMS zip or nbgrader's timestamp.txt, when known

def read_bounded(path: Path, under: Path | None = None) -> bytes:
    """The start of a regular file, or b"" when it cannot be read (the worker then says why): never through a link
    (nor, with `under`, through a folder below `under` swapped for one), never blocking on a FIFO (files.py)."""
    try:
        return read_regular(path, MAX_NOTEBOOK_BYTES + 1, under)
    except OSError:
        return b""


# --- folders ----------------------------------------------------------------------------------------------

def _entries(folder: Path) -> tuple[list[tuple[Path, os.stat_result]], list[Note]]:
    """Regular files and what else was found under `folder`, never following a link; bounded."""
    files: list[tuple[Path, os.stat_result]] = []
    odd: list[Note] = []
    stack = [folder]
    seen = 0
    while stack:
        current = stack.pop()
        with os.scandir(current) as listing:
            for entry in listing:
                seen += 1
                if seen > MAX_ENTRIES:
                    odd.append(Note(NoteKind.LIMIT_HIT, f"more than {MAX_ENTRIES} files: the rest ignored"))
                    return files, odd
                info = entry.stat(follow_symlinks=False)
                path = Path(entry.path)
                if stat.S_ISLNK(info.st_mode):
                    odd.append(Note(NoteKind.REFUSED, f"link {printable(entry.name)} refused"))
                elif stat.S_ISDIR(info.st_mode):
                    if entry.name != ".ipynb_checkpoints":
                        stack.append(path)
                elif stat.S_ISREG(info.st_mode):
                    files.append((path, info))
                else:
                    odd.append(Note(NoteKind.REFUSED, f"special file {printable(entry.name)} ignored"))
    return sorted(files), odd


def _hand_in(student: str, assignment: Assignment, folder: Path, known: list[Assignment],
             times: dict[str, str] | None) -> Submission:
    """What `folder` holds for `assignment`; `times`: the LMS zip's hand-in times (None: a folder of nbgrader's)."""
    sub = Submission(student, assignment.name)
    try:
        files, odd = _entries(folder)
    except OSError as exc:
        sub.problem = Note(NoteKind.REFUSED, f"could not read the hand-in folder: {type(exc).__name__}")
        return sub
    sub.notes += odd
    stamp = next((p for p, _ in files if p.name == TIMESTAMP_FILE and p.parent == folder), None)
    if times is not None:  # an LMS zip: the time is the zip's; a timestamp.txt came with the student's upload
        sub.submitted_at = times.get(f"{student}/{assignment.name}", "")
        if stamp is not None:
            lms_time = f"the LMS zip's ({sub.submitted_at})" if sub.submitted_at else "the LMS's own, unknown here"
            sub.notes.append(Note(NoteKind.TIME_IGNORED,
                                  f"{TIMESTAMP_FILE} in the upload ignored: the hand-in time is {lms_time}"))
    elif stamp is not None:
        sub.submitted_at = _read_small(stamp)
    files = [(p, info) for p, info in files if p != stamp and not (p.name == SECRET_FILE and p.parent == folder)]
    # nearer the top first: what nbgrader and a person looking at the folder take for the hand-in
    notebooks = sorted(((p, info) for p, info in files if p.suffix == ".ipynb"),
                       key=lambda n: (len(n[0].relative_to(folder).parts), n[0]))
    exact = [n for n in notebooks if n[0].name == assignment.notebook]
    renamed = [n for n in notebooks if notebook_for(n[0].name, [assignment]) is not None]
    alone = notebooks if len(notebooks) == 1 else []
    by_content = [n for n in notebooks if not (exact or renamed or alone) and n[1].st_size <= MAX_NOTEBOOK_BYTES
                  and assignment_in(read_bounded(n[0], folder), [assignment]) is not None]
    chosen = (exact or renamed or alone or by_content)[:1]
    if not chosen:
        names = ", ".join(printable(p.name) for p, _ in notebooks[:5]) or "no notebook"
        others = [printable(p.name) for p, _ in files if p.suffix != ".ipynb"]  # a zip of the notebook, a .py …
        besides = f"; other files: {', '.join(others[:5])}" + (" …" if len(others) > 5 else "") if others else ""
        sub.problem = Note(NoteKind.MISSING, f"missing notebook {assignment.notebook} (found: {names}){besides}")
        return sub
    path, info = chosen[0]
    if info.st_size > MAX_NOTEBOOK_BYTES:
        sub.problem = Note(NoteKind.INVALID, f"notebook too large: {printable(path.name)} is {info.st_size / 2**20:.0f} MB "
                                             f"(limit {MAX_NOTEBOOK_BYTES // 2**20} MB)")
        return sub
    other = assignment_in(read_bounded(path, folder), known)
    if other is not None and other.name != assignment.name:
        sub.problem = Note(NoteKind.MISSING, f"foreign notebook: {printable(path.name)} is {other.name}'s (its metadata)")
        return sub
    sub.notebook = path
    if path.name != assignment.notebook:
        how = " (its metadata)" if by_content else ""
        sub.notes.insert(0, Note(NoteKind.RENAMED, f"renamed: graded {printable(path.name)} as {assignment.notebook}{how}"))
    others = [printable(p.name) for p, _ in files if p != path]
    if others:
        shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        sub.notes.append(Note(NoteKind.EXTRA_FILES, f"extra files ignored: {shown}"))
    return sub


def _folders(path: Path) -> list[os.DirEntry]:
    with os.scandir(path) as listing:
        return sorted((e for e in listing if not e.name.startswith(".")), key=lambda e: e.name)


def _refused(student: str, assignment: str, why: str) -> Submission:
    return Submission(student, assignment, problem=Note(NoteKind.REFUSED, why))


def _read_small(path: Path) -> str:
    """The first line of a small text file (never through a link, never blocking on a pipe)."""
    try:
        return read_regular(path, 64).decode("utf-8", errors="replace").strip()
    except OSError:
        return ""


def collect(root: Path, known: list[Assignment], only: str | None = None) -> list[Submission]:
    """One Submission per student and graded assignment, including students who handed nothing in."""
    by_name = {a.name: a for a in known}
    times = collection_times(root)
    found: dict[tuple[str, str], Submission] = {}
    students: list[str] = []
    for entry in _folders(root):
        student = slug(entry.name)
        if not student or student != entry.name:
            shown = hashed_key(entry.name)  # a key no safe folder name can have: it never takes another's place
            found[(shown, "?")] = _refused(shown, only or "?", f"refused: unsafe folder name {printable(entry.name)!r}")
            continue
        if not entry.is_dir(follow_symlinks=False):
            if entry.is_symlink():
                found[(student, "?")] = _refused(student, only or "?", "refused: the student folder is a link")
            continue
        students.append(student)
        try:
            folders = _folders(Path(entry.path))
        except OSError as exc:
            found[(student, "?")] = _refused(student, only or "?", f"could not read the folder: {type(exc).__name__}")
            continue
        for folder in folders:
            if only and folder.name != only:
                continue
            if folder.is_symlink():
                found[(student, folder.name)] = _refused(student, folder.name, "refused: the assignment folder is a link")
            elif not folder.is_dir(follow_symlinks=False):
                continue
            elif folder.name not in by_name:
                found[(student, folder.name)] = _refused(student, folder.name,
                                                         f"unknown assignment folder {printable(folder.name)!r}")
            else:
                found[(student, folder.name)] = _hand_in(student, by_name[folder.name], Path(folder.path), known, times)
    for shown, why in collection_refused(root).items():  # an LMS zip's students with no safe key: unpack_zip's
        found.setdefault((shown, only or "?"), _refused(shown, only or "?", why))
    graded = {only} if only else {a for _, a in found if a in by_name}
    nothing = Note(NoteKind.NO_SUBMISSION, "no submission")
    for student in students:
        for assignment in sorted(graded):
            found.setdefault((student, assignment), Submission(student, assignment, problem=nothing))
    return [found[k] for k in sorted(found)]
