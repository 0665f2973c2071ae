"""Shared paths and grading helpers for the test suite."""

import csv
import functools
import subprocess
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient


REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


def autograde(submissions, out, *extra):
    """Run `python -m grader autograde` as an instructor would; it must exit 0."""
    run = subprocess.run([PYTHON, "-m", "grader", "autograde", str(submissions), "--out", str(out), *extra],
                         cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    return run


def read_rows(out):
    """grades.csv as (student, assignment) → (points per exercise, status)."""
    with open(out / "grades.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    fixed = {"student", "assignment", "total", "max_total", "status"}
    return {
        (r["student"], r["assignment"]): ({k: float(v) for k, v in r.items() if k not in fixed and v != ""}, r["status"])
        for r in rows
    }


@functools.cache
def execute_solution(path: Path) -> tuple[float, tuple[str, ...]]:
    """Run a solution notebook top to bottom with nbclient, once per test session: (seconds, error lines).

    Shared by the execution test and the browser test (which compares its own run time with this one).
    """
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    seconds = time.perf_counter() - start
    errors = tuple(
        f"cell {i} ({c.metadata.get('nbgrader', {}).get('grade_id', '?')}): {o.ename}: {o.evalue}"
        for i, c in enumerate(nb.cells) if c.cell_type == "code"
        for o in c.outputs if o.output_type == "error"
    )
    return seconds, errors
