"""Unpacking an LMS zip into `<student>/<assignment>/` folders for collection (submissions.py reads them)."""

from __future__ import annotations

import hashlib
import json
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

from grader.collect.names import MAX_NOTEBOOK_BYTES, assignment_in, hashed_key, notebook_for, slug
from grader.course import Assignment
from grader.results import printable

MAX_ZIP_BYTES = 2 * 2**30
MAX_MEMBERS = 100_000  # files in an LMS zip: a class of a thousand, each with a hundred files
SHOWN_CHARS = 200  # of a member's name, in the list of members left out
# Canvas: <lastfirst>[_LATE]_<user id>_<submission id>_<original file name>. The LMS's part holds no "/" or "\\":
# whatever follows "_<submission id>_" is the student's own file name, "\\" and all.
CANVAS_NAME = re.compile(r"^(?P<student>[^_/\\]+)(?P<late>_late)?_(?P<user>\d+)_\d+_(?P<file>.+)$", re.I)
# Moodle: one folder per participant and plugin, "<Full Name>_<participant>_assignsubmission_file_/<file>" (newer
# versions leave out the last "_"), or without "download as folders" flat "…_assignsubmission_file_<file>".
# Moodle writes a "_" in a name as " ", so the name holds none.
MOODLE_FOLDER = re.compile(r"^(?P<student>[^_/\\]+)_(?P<user>\d+)_assignsubmission_(?P<plugin>[a-z]+)_?$")
MOODLE_FLAT = re.compile(r"^(?P<student>[^_/\\]+)_(?P<user>\d+)_assignsubmission_(?P<plugin>[a-z]+)_(?P<file>.+)$")
# Written by unpack_zip beside the student folders (a dot name: never a student): "student/assignment" -> time
COLLECTION_TIMES = ".collection-times.json"
# … and the students whose names have no safe key: hashed key -> why their row is `refused` (submissions.hashed_key)
COLLECTION_REFUSED = ".collection-refused.json"


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
    refused: bool = False  # the name has no safe key: `student` is its hashed key, the row `refused`, nothing unpacked


def _skip(why: str) -> _Placed:
    return _Placed("", "", "", why)


def _path(member: zipfile.ZipInfo) -> str:
    """A member's path with "/" between folders. Zips made on Windows may write "\\", but a "\\" is a separator
    only in a name that fits no LMS layout as the zip spells it: in a Canvas or flat Moodle name (or below a Moodle
    participant's folder) it is a character of the student's own file name (Linux and macOS allow it), so
    `eve_5_6_x\\bob_999_1_….ipynb` stays Eve's. The student is always the LMS's own part of the name."""
    name = member.filename
    last = name.rpartition("/")[2]
    if CANVAS_NAME.match(last) or MOODLE_FLAT.match(last) or ("/" in name and MOODLE_FOLDER.match(name.split("/")[0])):
        return name
    return name.replace("\\", "/")


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
    tops = {p[0] for p in parts}
    # every member in one folder, never a Moodle participant's
    wrapped = len(tops) == 1 and all(len(p) > 1 for p in parts) and not MOODLE_FOLDER.match(next(iter(tops)))
    # an instructor's zip of <student>/<assignment>/<file>, of Moodle's download or of Canvas's flat names, inside
    # one more folder (only then is <folder>/<Canvas name> read as Canvas's: its folder names nobody)
    moodle_inside = all(len(p) >= 3 and MOODLE_FOLDER.match(p[1]) for p in parts)
    flat_inside = all(len(p) == 2 for p in parts)
    strip = 1 if wrapped and (all(len(p) >= 4 for p in parts) or moodle_inside or flat_inside) else 0

    def content(member: zipfile.ZipInfo) -> Callable[[], bytes]:
        return lambda: zf.open(member).read(MAX_NOTEBOOK_BYTES + 1)

    # a member nearer the top of an upload comes first, so a same-named file in a folder below it is the one left out
    placed = sorted(((m, _place(p[strip:], known, content(m))) for m, p in zip(members, parts)),
                    key=lambda mp: _path(mp[0]).count("/"))
    targets = {p.assignment for _, p in placed if p.assignment}
    single = only or (next(iter(targets)) if len(targets) == 1 else None)
    keys = _unique_keys([p for _, p in placed], unpacked.renamed)
    times: dict[str, str] = {}
    refused: dict[str, str] = {}
    kept = 0
    for member, (student, assignment, file_name, why, timed, who, unsafe) in placed:
        if unsafe:  # one `refused` row for the student, as folder collection gives such a folder
            refused.setdefault(student, f"refused: unsafe student name {printable(who)!r}")
            unpacked.skipped.append(_shown(member, f"unsafe student name: the row {student} says refused"))
            continue
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
    if not kept and not refused:
        raise CollectionError(_nothing_found(archive, unpacked.skipped))
    (into / COLLECTION_TIMES).write_text(json.dumps(times, indent=1, sort_keys=True))
    if refused:
        (into / COLLECTION_REFUSED).write_text(json.dumps(refused, indent=1, sort_keys=True))
    return unpacked


def _unique_keys(placed: list[_Placed], renamed: list[str]) -> dict[tuple[str, str], str]:
    """(key, name in the zip) -> a key of its own, for students whose names become one key once made safe (case,
    accents, NFC against NFD, invisible or RTL characters): each gets its name's hash after the key, and a line in
    `renamed`. Case counts as a collision too: on macOS and Windows "Ann" and "ann" are one folder."""
    names: dict[str, set[tuple[str, str]]] = defaultdict(set)
    for p in placed:
        if p.student and not p.refused:
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


def collection_refused(root: Path) -> dict[str, str]:
    """The students unpack_zip refused for `root` (hashed key -> why); {} when none, or not an unpacked zip."""
    try:
        refused = json.loads((root / COLLECTION_REFUSED).read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in refused.items()} if isinstance(refused, dict) else {}


def collection_times(root: Path) -> dict[str, str] | None:
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
    # Canvas's names are flat (a wrapping folder all members share is taken off first); a file inside a Moodle
    # participant's folder, or inside any other folder, is never a Canvas name, whatever its name
    canvas = CANVAS_NAME.match(part[0]) if len(part) == 1 else None
    if moodle and not canvas:  # the participant is Moodle's own folder (or name prefix); whatever the student put below it is not
        if moodle.group("plugin") != "file":
            return _skip(f"Moodle {moodle.group('plugin')} submission, not an uploaded file")
        name = part[-1] if len(part) >= 2 else moodle.group("file")
        who = f"{moodle.group('student')}_{moodle.group('user')}"
        return _Placed(slug(who), assignment(name), slug(name), timed=False, who=who) if slug(who) else _unsafe(who)
    if len(part) >= 3:  # <student>/<assignment>/<file>
        student, folder = slug(part[0]), slug(part[1])
        if not student:
            return _unsafe(part[0])
        return _Placed(student, folder, file_name, who=part[0]) if folder else _skip("unsafe name")
    if not canvas:
        return _skip("fits no known layout")
    who = f"{canvas.group('student')}_{canvas.group('user')}"
    if not slug(who):
        return _unsafe(who)
    return _Placed(slug(who), assignment(canvas.group("file")), slug(canvas.group("file")), who=who)


def _unsafe(who: str) -> _Placed:
    """A student whose name has no safe key (`张伟`): keyed as folder collection keys such a folder, row `refused`."""
    return _Placed(hashed_key(who), "", "", who=who, refused=True)
