"""`python -m grader nbgrader init DIR`: an nbgrader course directory for this course, graded by its grader.

DIR gets
- `nbgrader_config.py`: the course id, the exchange, and the course's grading plugged into nbgrader
  (grader/nbgrader/plugin.py);
- `source/<assignment>/<assignment>.ipynb`: each solution notebook with the student notebook's frame (set-up cell,
  check and hand-in) already in place, so `nbgrader generate_assignment` writes exactly the course's release;
- `student_nbgrader_config.py`: what students' servers need (course id and exchange), for a hub admin to put in
  `/etc/jupyter/nbgrader_config.py`.
Running it again rewrites those files and nothing else: the gradebook, releases, submissions, grades and
feedback stay.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from grader.author.bootstrap import add_frame
from grader.course import assignments

COURSE_ID = "training-mechanics-lab"
HUB_EXCHANGE = "/srv/nbgrader/exchange"  # nbgrader's own default: what a hub admin has usually set up
CONFIG = "nbgrader_config.py"
STUDENT_CONFIG = "student_nbgrader_config.py"
MARK = "# Written by `python -m grader nbgrader init`"
COURSE_ID_FORM = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class InitError(ValueError):
    """The course directory cannot be written as asked; the message says what to change."""


@dataclass(frozen=True)
class Written:
    """What `init` wrote, for the command line to say."""

    root: Path
    course_id: str
    exchange: Path
    assignments: list[str]
    exchange_note: str  # what a hub admin must still do for the exchange, or ""


def instructor_config(root: Path, course_id: str, exchange: Path) -> str:
    return f'''{MARK} (running it again rewrites this file; the gradebook
# and every submission stay). nbgrader keeps its workflow (exchange, gradebook, due dates, late penalties, manual
# grading, feedback, export); the course's grader decides every autograded point (grader/nbgrader/plugin.py).
from grader.nbgrader.plugin import use_course_grading

c = get_config()  # noqa: F821  (traitlets provides it)
c.CourseDirectory.course_id = {course_id!r}
c.CourseDirectory.root = {str(root)!r}
c.Exchange.root = {str(exchange)!r}
use_course_grading(c)
'''


def student_config(course_id: str, exchange: Path) -> str:
    return f'''{MARK}: the settings students' servers need to fetch and
# submit this course through the exchange (JupyterLab's Assignment List). A hub admin puts them in
# /etc/jupyter/nbgrader_config.py (or a student's ~/.jupyter/nbgrader_config.py).
c = get_config()  # noqa: F821  (traitlets provides it)
c.CourseDirectory.course_id = {course_id!r}
c.Exchange.root = {str(exchange)!r}
'''


def _check_ours(path: Path) -> None:
    """Refuse to overwrite a config file somebody else wrote."""
    if path.exists() and not path.read_text(encoding="utf-8", errors="replace").startswith(MARK):
        raise InitError(f"{path} exists and was not written by this command; move it away or pick another folder")


def _exchange_note(exchange: Path) -> str:
    """Make the exchange if this user may (world-writable with the sticky bit, as nbgrader needs), else say how."""
    try:
        exchange.mkdir(parents=True, exist_ok=True)
        mode = exchange.stat().st_mode
        if mode & 0o1777 != 0o1777:
            os.chmod(exchange, 0o1777)
    except OSError as err:
        return (f"could not prepare the exchange {exchange} ({err.strerror}); a hub admin runs: "
                f"mkdir -p {exchange} && chmod 1777 {exchange}")
    return "" if stat.S_IMODE(exchange.stat().st_mode) & 0o1777 == 0o1777 else \
        f"the exchange {exchange} is not world-writable with the sticky bit: chmod 1777 {exchange}"


def _write(path: Path, text: str) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text, encoding="utf-8")
    partial.replace(path)


def init(root: Path, course_id: str = COURSE_ID, exchange: Path | None = None) -> Written:
    """Write (or update) the nbgrader course directory `root` for this course; see the module docstring."""
    if not COURSE_ID_FORM.match(course_id):
        raise InitError(f"course id {course_id!r}: use letters, digits, '.', '_' or '-' (nbgrader puts it in paths)")
    root = root.expanduser().resolve()
    exchange = (exchange or Path(HUB_EXCHANGE)).expanduser().resolve()
    if root.exists() and not root.is_dir():
        raise InitError(f"{root} is a file, not a folder")
    root.mkdir(parents=True, exist_ok=True)
    for name in (CONFIG, STUDENT_CONFIG):
        _check_ours(root / name)
    names = []
    for assignment in assignments():
        folder = root / "source" / assignment.name
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            framed = Path(tmp) / assignment.notebook
            shutil.copyfile(assignment.source, framed)
            add_frame(framed, assignment.name)
            framed.replace(folder / assignment.notebook)
        names.append(assignment.name)
    _write(root / CONFIG, instructor_config(root, course_id, exchange))
    _write(root / STUDENT_CONFIG, student_config(course_id, exchange))
    return Written(root, course_id, exchange, names, _exchange_note(exchange))
