"""The release a submission is graded against, and the reference solution filled into it.

Production grading needs both — the reference run records what every observation must be, and the
canary hands the reference in the student's way — so they live here, not with the self-test data
(grader/author/mutants.py). Every grading step takes the released notebook it is given, so the canary,
the reference records and the students' rebuilds use one and the same release.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import sys
from importlib import metadata
from pathlib import Path

import nbformat

from grader.author.markers import SOLUTION_MARKER
from grader.course import Assignment
from grader.paths import BUILD, KERNEL_PACKAGES, MUTANTS
from labkit import cells

REFERENCE_CACHE = BUILD / "reference-records"
JUDGE, KERNEL = Path(__file__).resolve().parent, Path(__file__).resolve().parent.parent / "kernel"
# The code that plans and runs the scenarios, whose records are cached (read as files: importing grading.py here
# would import torch, and `autograde` must not pay for that just to find its records cached)
RECORDING_CODE = (KERNEL / "probe.py", KERNEL / "harness.py", JUDGE / "scenarios.py", JUDGE / "reference.py",
                  JUDGE / "grading.py")


class GradingEnvironmentBroken(RuntimeError):
    """The reference solution does not pass in this environment: no student grade would mean anything."""


def reference_answers(assignment: Assignment) -> dict[str, str]:
    """Answer cell grade_id → the reference solution's source, without the BEGIN/END markers."""
    nb = nbformat.read(assignment.source, as_version=4)
    return {cells.grade_id(c): SOLUTION_MARKER.sub("", c.source) for c in nb.cells if cells.kind(c) == cells.ANSWER}


def released_notebook(assignment: Assignment) -> nbformat.NotebookNode:
    """The student edition in notebooks/ (what `grader release` wrote and students downloaded)."""
    return nbformat.read(assignment.release, as_version=4)


def build_submission(assignment: Assignment, answers: dict[str, str],
                     released: nbformat.NotebookNode | None = None) -> nbformat.NotebookNode:
    """`released` (default: notebooks/'s) with the given answer cells filled in, as a student would hand it in."""
    nb = copy.deepcopy(released) if released is not None else released_notebook(assignment)
    for cell in nb.cells:
        if cells.grade_id(cell) in answers:
            cell.source = answers[cells.grade_id(cell)]
    return nb


def reference_submission(assignment: Assignment, released: nbformat.NotebookNode | None = None) -> nbformat.NotebookNode:
    """Every answer cell filled with the reference solution."""
    return build_submission(assignment, reference_answers(assignment), released)


def torch_version() -> str:
    """The installed torch's version, read without importing torch where it can be: its distribution's metadata or,
    for a torch installed without one (built in place), its version file."""
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        spec = importlib.util.find_spec("torch")
        version_file = Path(spec.origin).parent / "version.py" if spec is not None and spec.origin else None
        if version_file is not None and version_file.exists():
            return version_file.read_text()
        import torch

        return str(torch.__version__)


def records_path(assignment: Assignment, released: nbformat.NotebookNode, kind: str = "") -> Path:
    """Where the reference run's records (`kind` "") or the known mistakes' ("mutants") of `assignment` against
    `released` are cached: a name that changes with anything they depend on — the source, the release, the
    mutants, the code that plans and runs the scenarios, helpers and labkit, torch, Python."""
    digest = hashlib.sha256(assignment.source.read_bytes())
    digest.update(nbformat.writes(released).encode())
    kernel_side = sorted(path for package in KERNEL_PACKAGES for path in package.glob("*.py"))
    mutants = MUTANTS / f"{assignment.name}.toml"
    for path in [*kernel_side, *RECORDING_CODE, *([mutants] if mutants.exists() else [])]:
        digest.update(path.name.encode() + path.read_bytes())
    digest.update(f"{torch_version()} {sys.version}".encode())
    return REFERENCE_CACHE / f"{assignment.name}-{kind + '-' if kind else ''}{digest.hexdigest()[:16]}.json"
