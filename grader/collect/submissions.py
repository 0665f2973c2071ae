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

import hashlib
import json
import os
import re
import stat
import zipfile
import zlib
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import NamedTuple

from grader.course import Assignment
from grader.results import Note, NoteKind, printable

MAX_ZIP_BYTES = 2 * 2**30
MAX_NOTEBOOK_BYTES = 128 * 2**20  # saved outputs make notebooks big; only the cells' sources are used
MAX_ENTRIES = 2000  # files looked at per hand-in folder
MAX_MEMBERS = 100_000  # files in an LMS zip: a class of a thousand, each with a hundred files
SHOWN_CHARS = 200  # of a member's name, in the list of members left out
# Canvas: <lastfirst>[_LATE]_<user id>_<submission id>_<original file name>
CANVAS_NAME = re.compile(r"^(?P<student>[^_/]+)(?P<late>_late)?_(?P<user>\d+)_\d+_(?P<file>.+)$", re.I)
# Moodle: one folder per participant and plugin, "<Full Name>_<participant>_assignsubmission_file_/<file>" (newer
# versions leave out the last "_"), or without "download as folders" flat "…_assignsubmission_file_<file>".
# Moodle writes a "_" in a name as " ", so the name holds none.
MOODLE_FOLDER = re.compile(r"^(?P<student>[^_/]+)_(?P<user>\d+)_assignsubmission_(?P<plugin>[a-z]+)_?$")
MOODLE_FLAT = re.compile(r"^(?P<student>[^_/]+)_(?P<user>\d+)_assignsubmission_(?P<plugin>[a-z]+)_(?P<file>.+)$")
# What people add to a file name when they upload it again: " (1)", "-2", "_final", "_v3", " copy".
RENAMED = re.compile(r"(?:\s*\(\d+\)|-\d+|_final|_v\d+|[ _-]copy)+$", re.I)
COPY_OF = re.compile(r"^copy[ _-]of[ _-]", re.I)  # Colab's "Save a copy in Drive"
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}$")
TIMESTAMP_FILE = "timestamp.txt"  # nbgrader's convention: when the hand-in arrived
SECRET_FILE = "submission_secret.txt"  # what nbgrader's submit writes beside it: the exchange's, no extra file
# Written by unpack_zip beside the student folders (a dot name: never a student): "student/assignment" -> time
COLLECTION_TIMES = ".collection-times.json"


@dataclass
class Submission:
    """One student's hand-in for one assignment, as collection found it."""

    student: str
    assignment: str
    notebook: Path | None = None  # the regular file to grade
    notes: list[Note] = field(default_factory=list)  # renamed, extra files, refused links …
    problem: Note | None = None  # set when there is nothing to grade; the row says why
    submitted_at: str = ""  # ISO time from the LMS zip or nbgrader's timestamp.txt, when known


def slug(name: str) -> str:
    """A student or folder name made safe for a path; '' when nothing safe is left."""
    cleaned = re.sub(r"-*\.-*", ".", re.sub(r"[^A-Za-z0-9._@+-]+", "-", name)).strip("-.")
    return cleaned if SAFE_NAME.match(cleaned) else ""


def _plain(stem: str) -> str:
    return re.sub(r"[\s_-]+", "_", stem).lower()


def notebook_for(file_name: str, known: list[Assignment]) -> Assignment | None:
    """The assignment a handed-in file name belongs to, allowing what re-uploads, Colab and Kaggle add."""
    stem = _plain(RENAMED.sub("", COPY_OF.sub("", PurePosixPath(file_name).stem)).strip())
    return next((a for a in known if _plain(a.name) == stem), None)


def assignment_in(data: bytes, known: list[Assignment]) -> Assignment | None:
    """The assignment a notebook's own metadata names (the release writes it), or None: not JSON, no such
    metadata, or an assignment not in `known`."""
    try:
        meta = json.loads(data[:MAX_NOTEBOOK_BYTES]).get("metadata", {})
        name = meta.get("tml", {}).get("assignment")
    except (ValueError, AttributeError, RecursionError):  # not JSON, or not shaped like a notebook
        return None
    return next((a for a in known if a.name == name), None)


def read_bounded(path: Path) -> bytes:
    """The start of a regular file, or b"" when it cannot be read (the worker then says why)."""
    try:
        with open(path, "rb") as f:
            return f.read(MAX_NOTEBOOK_BYTES + 1)
    except OSError:
        return b""


# --- LMS zips ---------------------------------------------------------------------------------------------

class CollectionError(ValueError):
    """The submissions cannot be collected at all (an unreadable zip, or one holding no hand-in): nothing is graded."""


@dataclass
class Unpacked:
    """Where unpack_zip put the hand-ins, every zip member it left out, as `name (why)`, and every student whose
    key was made unique because another student's name becomes the same key once made safe."""

    root: Path
    skipped: list[str] = field(default_factory=list)
    renamed: list[str] = field(default_factory=list)

    def report(self, archive: str) -> list[str]:
        """What `autograde` prints: every member left out (it may be a hand-in in a layout collection does not
        know), then every student keyed apart, one a line."""
        lines = [f"{len(self.skipped)} file(s) in {archive} not unpacked:"] if self.skipped else []
        lines += [f"  {line}" for line in self.skipped]
        lines += [f"{len(self.renamed)} student(s) in {archive} keyed apart:"] if self.renamed else []
        return lines + [f"  {line}" for line in self.renamed]


class _Placed(NamedTuple):
    student: str  # '' when the member is skipped
    assignment: str  # '' when neither its name nor its metadata says
    file_name: str
    why: str = ""  # why it was skipped
    timed: bool = True  # whether the layout's member time is a hand-in time (Moodle's is not)
    who: str = ""  # the student as the zip names them, before it is made safe (`student`)


def _skip(why: str) -> _Placed:
    return _Placed("", "", "", why)


def _path(member: zipfile.ZipInfo) -> str:
    """A member's path with "/" between folders: zips made on Windows may write "\\"."""
    return member.filename.replace("\\", "/")


def _unsafe_member(member: zipfile.ZipInfo) -> str:
    """Why a member is not unpacked, or '': its path, or what it is (only regular files are; a link never)."""
    name = _path(member)
    path = PurePosixPath(name)
    if name.startswith("__MACOSX"):
        return "macOS metadata"
    if path.is_absolute() or ".." in path.parts or re.match(r"^[A-Za-z]:", name):  # a drive letter: absolute too
        return "unsafe path"
    mode = member.external_attr >> 16  # Unix's st_mode, where the zip was made on Unix
    if stat.S_ISLNK(mode):
        return "a link: not followed"
    if stat.S_ISDIR(mode) or member.external_attr & 0x10:  # 0x10: MS-DOS's folder attribute
        return "a folder"
    return "a special file" if stat.S_IFMT(mode) and not stat.S_ISREG(mode) else ""


def _shown(member: zipfile.ZipInfo, why: str) -> str:
    """`name (why)`, a very long name cut short."""
    name = member.filename
    if len(name) > SHOWN_CHARS:
        name = f"{name[:SHOWN_CHARS - 50]}… ({len(name)} characters)"
    return f"{name} ({why})"


def unpack_zip(archive: Path, into: Path, known: list[Assignment], only: str | None = None) -> Unpacked:
    """Extract an LMS zip into `<student>/<assignment>/` folders under `into`.

    Understands a zip that already has the folder layout (optionally inside one top folder), Canvas's
    flat `<name>[_LATE]_<user id>_<submission id>_<file>` names and Moodle's `<Full Name>_<user id>_
    assignsubmission_file_/` folders (or, without "download as folders", flat `…_assignsubmission_file_<file>`
    names). A Moodle participant is always the LMS's own outermost folder: folders the student made inside
    the upload never name a student. Students are keyed by name *and* LMS user id, so two students with
    the same name stay two rows. A file whose name matches no notebook goes to the assignment its metadata
    names, or else to the only assignment the zip is for, when there is one. Every member left out is named
    in `skipped`; a zip that cannot be read, or holds no hand-in, raises CollectionError. The newest time the
    zip records for a hand-in's files is its hand-in time, written to `COLLECTION_TIMES` in `into` (read by
    `collect`) — except in Moodle's layouts, whose member times are the download's or the file store's, never
    the hand-in's (README): those hand-ins have no time.
    """
    into.mkdir(parents=True, exist_ok=True)
    try:
        with zipfile.ZipFile(archive) as zf:
            unpacked = _extract(zf, archive, into, known, only)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, zlib.error) as exc:
        raise CollectionError(f"{archive.name} is not a readable zip ({type(exc).__name__}: {exc}); "
                              "download it again") from None
    return unpacked


def _extract(zf: zipfile.ZipFile, archive: Path, into: Path, known: list[Assignment], only: str | None) -> Unpacked:
    if len(zf.infolist()) > MAX_MEMBERS:
        raise CollectionError(f"{archive.name} holds more than {MAX_MEMBERS} files; refusing")
    members = [m for m in zf.infolist() if not m.is_dir()]
    unpacked = Unpacked(into, [_shown(m, why) for m in members if (why := _unsafe_member(m))])
    members = [m for m in members if not _unsafe_member(m)]
    if sum(m.file_size for m in members) > MAX_ZIP_BYTES:
        size = f"{MAX_ZIP_BYTES // 2**30} GiB" if MAX_ZIP_BYTES >= 2**30 else f"{MAX_ZIP_BYTES} bytes"
        raise CollectionError(f"{archive.name} unpacks to more than {size}; refusing")
    parts = [PurePosixPath(_path(m)).parts for m in members]
    tops = {p[0] for p in parts if len(p) > 1}
    wrapped = len(tops) == 1 and not MOODLE_FOLDER.match(next(iter(tops)))  # never a Moodle participant's folder
    # an instructor's zip of <student>/<assignment>/<file>, or of Moodle's download, inside one more folder
    moodle_inside = all(len(p) >= 3 and MOODLE_FOLDER.match(p[1]) for p in parts)
    strip = 1 if wrapped and (all(len(p) >= 4 for p in parts) or moodle_inside) else 0

    def content(member: zipfile.ZipInfo) -> Callable[[], bytes]:
        return lambda: zf.open(member).read(MAX_NOTEBOOK_BYTES + 1)

    # a member nearer the top of an upload comes first, so a same-named file in a folder below it is the one left out
    placed = sorted(((m, _place(p[strip:], known, content(m))) for m, p in zip(members, parts)),
                    key=lambda mp: _path(mp[0]).count("/"))
    targets = {p.assignment for _, p in placed if p.assignment}
    single = only or (next(iter(targets)) if len(targets) == 1 else None)
    keys = _unique_keys([p for _, p in placed], unpacked.renamed)
    times: dict[str, str] = {}
    kept = 0
    for member, (student, assignment, file_name, why, timed, who) in placed:
        student = keys.get((student, who), student)
        assignment = assignment or single or "unmatched-upload"
        target = into / student / assignment / file_name
        if not student:
            why = why or "unsafe name"
        elif target.exists():
            why = "another file of this name, nearer the top of the upload or earlier in the zip, is the one kept"
        elif not target.resolve().is_relative_to(into.resolve()):
            why = "unsafe path"
        if why:
            unpacked.skipped.append(_shown(member, why))
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        with zf.open(member) as src, open(target, "wb") as dst:
            dst.write(src.read(MAX_NOTEBOOK_BYTES + 1))
        kept += 1
        if timed:
            key = f"{student}/{assignment}"
            times[key] = max(times.get(key, ""), datetime(*member.date_time).isoformat())
    if not kept:
        raise CollectionError(_nothing_found(archive, unpacked.skipped))
    (into / COLLECTION_TIMES).write_text(json.dumps(times, indent=1, sort_keys=True))
    return unpacked


def _unique_keys(placed: list[_Placed], renamed: list[str]) -> dict[tuple[str, str], str]:
    """(key, name in the zip) -> a key of its own, for students whose names become one key once made safe (case,
    accents, NFC against NFD, invisible or RTL characters): each gets its name's hash after the key, and a line in
    `renamed`. Case counts as a collision too: on macOS and Windows "Ann" and "ann" are one folder."""
    names: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for p in placed:
        if p.student:
            names[p.student.casefold()].add((p.student, p.who))
    keys: dict[tuple[str, str], str] = {}
    for group in names.values():
        if len(group) < 2:
            continue
        for student, who in sorted(group):
            raw = who.encode("utf-8", errors="surrogatepass")
            keys[student, who] = f"{student[:118]}+{hashlib.sha256(raw).hexdigest()[:8]}"
            others = sorted(repr(w) for s, w in group if w != who)
            renamed.append(f"{who!r} keyed {keys[student, who]}: {' and '.join(others)} would have the same key "
                           f"{student}")
    return keys


def _nothing_found(archive: Path, skipped: list[str]) -> str:
    if not skipped:
        return f"{archive.name} is empty: no hand-in to grade"
    shown = "; ".join(printable(s) for s in skipped[:3]) + (f" and {len(skipped) - 3} more" if len(skipped) > 3 else "")
    return (f"{archive.name} holds no hand-in: none of its {len(skipped)} file(s) fits a layout collection knows "
            f"(Canvas, Moodle, <student>/<assignment>/<file>): {shown}")


def _collection_times(root: Path) -> dict[str, str] | None:
    """The hand-in times unpack_zip recorded for `root`; None when `root` is not an unpacked zip."""
    try:
        times = json.loads((root / COLLECTION_TIMES).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in times.items()} if isinstance(times, dict) else {}


def _place(part: tuple[str, ...], known: list[Assignment], content: Callable[[], bytes]) -> _Placed:
    """Where one zip member goes. A flat or Moodle member's assignment comes from its file name, or else from
    its metadata (`content` reads it); the folder layout names it."""
    file_name = slug(part[-1]) if part else ""
    if not file_name:
        return _skip("unsafe name")

    def assignment(name: str) -> str:
        found = notebook_for(name, known) or (assignment_in(content(), known) if name.endswith(".ipynb") else None)
        return found.name if found else ""

    moodle = MOODLE_FOLDER.match(part[0]) if len(part) >= 2 else MOODLE_FLAT.match(part[0])
    # A file inside a Moodle participant's folder is that participant's, whatever its name (a Canvas-like name too)
    canvas = CANVAS_NAME.match(part[-1]) if len(part) == 1 or (len(part) == 2 and not moodle) else None
    if moodle and not canvas:  # the participant is Moodle's own folder (or name prefix); whatever the student put below it is not
        if moodle.group("plugin") != "file":
            return _skip(f"Moodle {moodle.group('plugin')} submission, not an uploaded file")
        name = part[-1] if len(part) >= 2 else moodle.group("file")
        who = f"{moodle.group('student')}_{moodle.group('user')}"
        return _Placed(slug(who), assignment(name), slug(name), timed=False, who=who)
    if len(part) >= 3:  # <student>/<assignment>/<file>
        student, folder = slug(part[0]), slug(part[1])
        return _Placed(student, folder, file_name, who=part[0]) if student and folder else _skip("unsafe name")
    if not canvas:
        return _skip("fits no known layout")
    who = f"{canvas.group('student')}_{canvas.group('user')}"
    return _Placed(slug(who), assignment(canvas.group("file")), slug(canvas.group("file")), who=who)


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
                  and assignment_in(read_bounded(n[0]), [assignment]) is not None]
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
    other = assignment_in(read_bounded(path), known)
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
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as f:
            return f.read(64).decode("utf-8", errors="replace").strip()
    except OSError:
        return ""


def collect(root: Path, known: list[Assignment], only: str | None = None) -> list[Submission]:
    """One Submission per student and graded assignment, including students who handed nothing in."""
    by_name = {a.name: a for a in known}
    times = _collection_times(root)
    found: dict[tuple[str, str], Submission] = {}
    students: list[str] = []
    for entry in _folders(root):
        student = slug(entry.name)
        if not student or student != entry.name:
            # a key no safe folder name can have ('~' is not in SAFE_NAME): the row never takes another's place
            raw = entry.name.encode(errors="surrogateescape")
            shown = f"{student or 'unsafe-name'}~{hashlib.sha256(raw).hexdigest()[:8]}"
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
    graded = {only} if only else {a for _, a in found if a in by_name}
    nothing = Note(NoteKind.NO_SUBMISSION, "no submission")
    for student in students:
        for assignment in sorted(graded):
            found.setdefault((student, assignment), Submission(student, assignment, problem=nothing))
    return [found[k] for k in sorted(found)]
