"""The course's assignments: one folder and notebook each in solutions/, released into notebooks/."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat

from grader.paths import NOTEBOOKS, SOLUTIONS
from labkit import cells


@dataclass(frozen=True)
class Assignment:
    """One assignment: a folder in solutions/ holding one notebook of the same name."""

    name: str

    @property
    def notebook(self) -> str:
        return f"{self.name}.ipynb"

    @property
    def source(self) -> Path:
        return SOLUTIONS / self.name / self.notebook

    @property
    def release(self) -> Path:
        return NOTEBOOKS / self.name / self.notebook

    def grade_cells(self) -> dict[str, float]:
        """grade_id → points of every graded test cell, in notebook order."""
        return cells.points(nbformat.read(self.source, as_version=4).cells)

    def written_cells(self) -> dict[str, float]:
        """grade_id → points of every written answer (graded by hand, apart from the tests), in notebook order."""
        return cells.points(nbformat.read(self.source, as_version=4).cells, of=cells.WRITTEN)


def assignments() -> list[Assignment]:
    """Every assignment in solutions/, sorted by name (NN_ prefixes give the course order)."""
    return [Assignment(p.name) for p in sorted(SOLUTIONS.iterdir()) if (p / f"{p.name}.ipynb").is_file()]


def assignment_named(name: str) -> Assignment:
    """The assignment called `name` — in full (`06_mixed_precision`) or by number (`06`, `6`) — or a ValueError
    listing the ones that exist."""
    known = {a.name: a for a in assignments()}
    prefix = f"{int(name):02d}_" if name.isdigit() else None
    found = [a for n, a in known.items() if n == name or (prefix and n.startswith(prefix))]
    if len(found) != 1:
        raise ValueError(f"unknown assignment {name!r}; known: {', '.join(known)} (or their numbers)")
    return found[0]


def read_json(path: Path) -> dict:
    """A JSON file as a dict (used for notebooks before nbformat validation)."""
    return json.loads(path.read_text(encoding="utf-8"))


def put_interpreter_on_path() -> None:
    """Put this interpreter's bin/ first on PATH: nbgrader runs `alembic` and kernels from there.

    Lets `.venv/bin/python -m grader` work without activating the environment.
    """
    bindir = str(Path(sys.executable).parent)
    if os.environ.get("PATH", "").split(os.pathsep)[0] != bindir:
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")

