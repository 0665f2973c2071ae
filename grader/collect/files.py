"""Reading a file a student may have put there: the one way the grader opens a hand-in or anything beside it.

A student who can write their hand-in folder can swap the notebook for a link (to /dev/zero, to another student's
notebook, to the instructor's files), a FIFO (a plain open blocks forever) or a device, at any moment between
collection listing the folder and a reader opening the file. `read_regular` opens without following a link
(O_NOFOLLOW) and without blocking (O_NONBLOCK), checks on the open descriptor that it is a regular file, and reads
a bounded number of bytes; given the folder the path was listed under, it walks there one folder at a time with
O_NOFOLLOW too, so a folder swapped for a link on the way is refused as well.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

_FILE = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
_FOLDER = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)


class NotRegularFile(OSError):
    """The path names a FIFO, a device, a socket or a folder: nothing a hand-in is."""

    def __init__(self, path: Path) -> None:
        super().__init__(errno.EINVAL, "not a regular file", str(path))

    def __str__(self) -> str:
        return "not a regular file"


def _open(path: Path, under: Path | None) -> int:
    if under is None:
        return os.open(path, _FILE)
    parts = path.relative_to(under).parts
    fd = os.open(under, _FOLDER & ~os.O_NOFOLLOW)  # `under` itself is the caller's: listed, not the student's
    try:
        for part in parts[:-1]:
            inner = os.open(part, _FOLDER, dir_fd=fd)
            os.close(fd)
            fd = inner
        return os.open(parts[-1], _FILE, dir_fd=fd)
    finally:
        os.close(fd)


def read_regular(path: Path, limit: int = -1, under: Path | None = None) -> bytes:
    """The first `limit` bytes (-1: all) of the regular file `path`, never through a link, never blocking.

    `under`: a folder `path` lies in, whose sub-folders on the way may not be links either. Raises OSError
    (NotRegularFile for a FIFO, a device or a folder) when the file cannot be read so."""
    fd = _open(path, under)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFile(path)
        return f.read(limit)
