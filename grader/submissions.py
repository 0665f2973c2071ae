"""Finding submissions in a folder (`<student>/<assignment>/<notebook>.ipynb`) or an LMS zip."""

from __future__ import annotations

import re
import shutil
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from grader.course import Assignment

MAX_ZIP_BYTES = 2 * 2**30
# Canvas-style flat names: <student>[_LATE]_<id>_<id>_<original file name>
LMS_NAME = re.compile(r"^(?P<student>[^_/]+)(?:_late)?_\d+_\d+_(?P<file>.+)$", re.I)


@dataclass
class Submission:
    """One student's hand-in for one assignment: every file found in its folder."""

    student: str
    assignment: str
    files: list[Path] = field(default_factory=list)
    problem: str = ""  # set when the hand-in cannot be graded at all


def _safe_member(name: str) -> bool:
    path = PurePosixPath(name)
    return not path.is_absolute() and ".." not in path.parts and not name.startswith("__MACOSX")


def unpack_zip(archive: Path, into: Path, known: list[Assignment]) -> Path:
    """Extract an LMS zip into `<student>/<assignment>/` folders under `into`; returns that root.

    Accepts a zip that already has the folder layout (optionally inside one top folder) and the flat
    `<student>_<id>_<id>_<notebook>.ipynb` names LMSs export. Unsafe paths are skipped.
    """
    into.mkdir(parents=True, exist_ok=True)
    by_notebook = {a.notebook: a.name for a in known}
    with zipfile.ZipFile(archive) as zf:
        members = [m for m in zf.infolist() if not m.is_dir() and _safe_member(m.filename)]
        if sum(m.file_size for m in members) > MAX_ZIP_BYTES:
            raise ValueError(f"{archive} unpacks to more than {MAX_ZIP_BYTES // 2**30} GiB; refusing")
        parts = [PurePosixPath(m.filename).parts for m in members]
        tops = {p[0] for p in parts if len(p) > 1}
        strip = 1 if len(tops) == 1 and all(len(p) >= 4 for p in parts) else 0
        for member, part in zip(members, parts):
            part = part[strip:]
            if len(part) >= 3:
                target = into.joinpath(*part)
            else:
                match = LMS_NAME.match(part[-1])
                original = re.sub(r"-\d+(\.ipynb)$", r"\1", match.group("file")) if match else ""
                if not match or original not in by_notebook:
                    continue
                target = into / match.group("student") / by_notebook[original] / original
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(member) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
    return into


def collect(root: Path, known: list[Assignment], only: str | None = None) -> list[Submission]:
    """One Submission per student and graded assignment, including students who handed nothing in."""
    names = {a.name for a in known}
    found: dict[tuple[str, str], Submission] = {}
    students = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    for student in students:
        for folder in sorted(p for p in (root / student).iterdir() if p.is_dir()):
            if only and folder.name != only:
                continue
            files = sorted(p for p in folder.rglob("*") if p.is_file() and ".ipynb_checkpoints" not in p.parts)
            sub = Submission(student, folder.name, files)
            if folder.name not in names:
                sub.problem = f"unknown assignment folder {folder.name!r}"
            found[(student, folder.name)] = sub
    graded = {only} if only else {a for _, a in found if a in names}
    for student in students:
        for assignment in sorted(graded):
            found.setdefault((student, assignment), Submission(student, assignment, [], "no submission"))
    return [found[k] for k in sorted(found)]
