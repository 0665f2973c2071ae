"""`release`: generate notebooks/ from solutions/ with nbgrader (`grader/author/check.py` proves notebooks/ is right)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import nbformat

from grader.author.bootstrap import add_frame
from grader.course import Assignment, assignments, put_interpreter_on_path
from grader.paths import NOTEBOOKS

NBGRADER_CONFIG = Path(__file__).resolve().parent / "nbgrader_config.py"


def load_config(**course_dirs: str):
    """The course's nbgrader configuration, with CourseDirectory settings overridden by `course_dirs`."""
    from traitlets.config.loader import PyFileConfigLoader

    config = PyFileConfigLoader(NBGRADER_CONFIG.name, path=str(NBGRADER_CONFIG.parent)).load_config()
    for key, value in course_dirs.items():
        config.CourseDirectory[key] = value
    return config


def nbgrader_api(config):
    """An NbGraderAPI for `config`, with this interpreter's tools (alembic, the kernel) on PATH."""
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory

    put_interpreter_on_path()
    return NbGraderAPI(CourseDirectory(config=config), config=config)


def normalize(path: Path) -> None:
    """Rewrite a notebook deterministically: no outputs, no execution counts, nbformat's layout."""
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        cell.metadata.pop("execution", None)
    nbformat.write(nb, path)


def generate(into: Path, only: list[Assignment] | None = None) -> Path:
    """Run nbgrader generate_assignment for each assignment into `into/release`; returns `into` (for grading too).

    Each student notebook gets grader/author/bootstrap.py's frame: badges, what it needs and the set-up cell on
    top, the check and how to hand in at the end, its assignment id in its metadata.
    """
    into.mkdir(parents=True, exist_ok=True)
    config = load_config(release_directory=str(into / "release"))
    config.CourseDirectory.db_url = f"sqlite:///{into / 'gradebook.db'}"
    api = nbgrader_api(config)
    for assignment in only or assignments():
        result = api.generate_assignment(assignment.name, force=True, create=True)
        if not result["success"]:
            raise RuntimeError(f"nbgrader could not generate {assignment.name}:\n{result['log']}\n{result.get('error', '')}")
        for nb in (into / "release" / assignment.name).rglob("*.ipynb"):
            normalize(nb)
            add_frame(nb, assignment.name)  # badges, what it needs, the set-up cell; the check; its assignment id
    return into


def release(only: list[Assignment] | None = None) -> list[str]:
    """Regenerate notebooks/<assignment>/ from solutions/ (all assignments, or `only`); returns those written."""
    chosen = only or assignments()
    with tempfile.TemporaryDirectory() as tmp:
        generated = generate(Path(tmp), chosen) / "release"
        for assignment in chosen:
            shutil.rmtree(NOTEBOOKS / assignment.name, ignore_errors=True)
            shutil.copytree(generated / assignment.name, NOTEBOOKS / assignment.name)
    known = {a.name for a in assignments()}
    for orphan in (p for p in NOTEBOOKS.iterdir() if p.is_dir() and p.name not in known):
        shutil.rmtree(orphan)  # its source was removed from solutions/
    return [a.name for a in chosen]
