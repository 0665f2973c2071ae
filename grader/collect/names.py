"""What collection calls things: a student key made safe for a path, and the assignment a handed-in file belongs to
(by its name, allowing what re-uploads, Colab and Kaggle add, or by the metadata the release wrote into it). Shared
by the folder collector (submissions.py) and the LMS zips' (lms_zip.py)."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import PurePosixPath

from grader.course import Assignment

MAX_NOTEBOOK_BYTES = 128 * 2**20  # saved outputs make notebooks big; only the cells' sources are used
# What people add to a file name when they upload it again: " (1)", "-2", "_final", "_v3", " copy".
RENAMED = re.compile(r"(?:\s*\(\d+\)|-\d+|_final|_v\d+|[ _-]copy)+$", re.I)
COPY_OF = re.compile(r"^copy[ _-]of[ _-]", re.I)  # Colab's "Save a copy in Drive"
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}$")


def hashed_key(name: str) -> str:
    """The key of a student whose name is no safe key as it is: what is safe of it (or `unsafe-name`), `~` and the
    name's hash. '~' is not in SAFE_NAME, so such a row never takes the place of another student's."""
    raw = name.encode(errors="surrogateescape")
    return f"{slug(name) or 'unsafe-name'}~{hashlib.sha256(raw).hexdigest()[:8]}"


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
