"""Shared paths and grading helpers for the test suite."""

import csv
import subprocess
import sys
from pathlib import Path


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
