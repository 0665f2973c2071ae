"""Where the course lives on disk, spelled once; imports nothing but pathlib, so any module may use it."""

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SOLUTIONS = REPO / "solutions"
NOTEBOOKS = REPO / "notebooks"
BUILD = REPO / "build"
GRADER = REPO / "grader"
MUTANTS = GRADER / "mutants"  # realistic wrong answers and cribs, one TOML file per notebook (grader/author/mutants.py)
VARIANTS = GRADER / "variants"  # correct answers written differently, one TOML file per notebook (same module)
# What ships to every kernel and to students: the lesson helpers and the course's own plumbing.
KERNEL_PACKAGES = (REPO / "helpers", REPO / "labkit")
PYPROJECT = REPO / "pyproject.toml"
