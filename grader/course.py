"""Where the course lives and how nbgrader is configured for it."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat
from traitlets.config import Config
from traitlets.config.loader import PyFileConfigLoader

from helpers import cells

REPO = Path(__file__).resolve().parent.parent
SOLUTIONS = REPO / "solutions"
NOTEBOOKS = REPO / "notebooks"
NBGRADER_CONFIG = Path(__file__).resolve().parent / "nbgrader_config.py"


def load_config(**course_dirs: str) -> Config:
    """The course's nbgrader configuration, with CourseDirectory settings overridden by `course_dirs`."""
    config = PyFileConfigLoader(NBGRADER_CONFIG.name, path=str(NBGRADER_CONFIG.parent)).load_config()
    for key, value in course_dirs.items():
        config.CourseDirectory[key] = value
    return config


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


def assignments() -> list[Assignment]:
    """Every assignment in solutions/, sorted by name (NN_ prefixes give the course order)."""
    return [Assignment(p.name) for p in sorted(SOLUTIONS.iterdir()) if (p / f"{p.name}.ipynb").is_file()]


def assignment_named(name: str) -> Assignment:
    """The assignment called `name`, or a ValueError listing the ones that exist."""
    known = {a.name: a for a in assignments()}
    if name not in known:
        raise ValueError(f"unknown assignment {name!r}; known: {', '.join(known)}")
    return known[name]


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


def nbgrader_api(config: Config):
    """An NbGraderAPI for `config`, with this interpreter's tools (alembic, the kernel) on PATH."""
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory

    put_interpreter_on_path()
    return NbGraderAPI(CourseDirectory(config=config), config=config)
