"""`bundle OUT`: what students receive — the student notebooks, helpers, the set-up — and nothing else."""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat

from grader.author.markers import ANY_MARKER, secret_and_public
from grader.course import assignments
from grader.paths import KERNEL_PACKAGES, NOTEBOOKS, REPO

SHIPPED_FILES = ["course", "requirements.txt", "environment.yml"]
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints")

PYPROJECT = """\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "training-mechanics-lab"
version = "0.1.0"
description = "Notebooks that show what happens inside one PyTorch training step (student edition)."
requires-python = ">=3.10"
dependencies = []

[tool.setuptools]
packages = ["helpers", "labkit"]
"""

README = """\
# Training Mechanics Lab — student edition

```bash
./course lab                     # first run sets everything up (about 2 minutes), then opens JupyterLab
./course validate notebooks/01_gradient_descent/01_gradient_descent.ipynb   # before you hand in
```

Start with `notebooks/00_setup/00_setup.ipynb`: it checks torch, your device, CPU cores and graphviz.
Each exercise cell raises `NotImplementedError` until you fill it in; the test cell under it checks your
answer and says what is wrong. `./course validate NOTEBOOK` runs a notebook's visible tests in a fresh
kernel and exits non-zero when any fails (save the notebook first). Hand in the `.ipynb` file with its
name unchanged.

Set-up needs Python 3.10+ with venv; on Debian/Ubuntu it installs graphviz with apt-get (root or sudo).
Conda: `conda env create -f environment.yml`. On a Linux GPU machine the set-up installs the CUDA build
of torch 2.13; without a GPU every notebook still runs and says which GPU measurements it skipped.
"""


def bundle(out: Path) -> list[Path]:
    """Write the student bundle into `out` (which must not exist yet); returns the files written."""
    if out.exists():
        raise FileExistsError(f"{out} exists; choose a new folder")
    out.mkdir(parents=True)
    shutil.copytree(NOTEBOOKS, out / "notebooks", ignore=IGNORED)
    for package in KERNEL_PACKAGES:
        shutil.copytree(package, out / package.name, ignore=IGNORED)
    for name in SHIPPED_FILES:
        shutil.copy2(REPO / name, out / name)
    (out / "pyproject.toml").write_text(PYPROJECT)
    (out / "README.md").write_text(README)
    return sorted(p for p in out.rglob("*") if p.is_file())


def _code_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


def _secret_patterns(min_chars: int = 40, run: int = 3) -> tuple[set[str], set[tuple[str, ...]]]:
    """Distinctive solution/hidden-test lines (long, and public in no notebook) and runs of `run` consecutive ones."""
    def windows(blocks: list[list[str]]) -> set[tuple[str, ...]]:
        # runs with some substance: `try: / yield / finally:` is every context manager, not a solution
        return {tuple(block[i:i + run]) for block in blocks for i in range(len(block) - run + 1)
                if sum(map(len, block[i:i + run])) >= min_chars}

    public: list[list[str]] = []
    secret: list[list[str]] = []
    for assignment in assignments():
        for cell in nbformat.read(assignment.source, as_version=4).cells:
            blocks, shown = secret_and_public(cell.source + "\n")
            secret += [_code_lines(b) for b in blocks]
            public.append(_code_lines(shown))
    public_lines = {line for block in public for line in block}
    lines = {line for block in secret for line in block if len(line) >= min_chars} - public_lines
    return lines, windows(secret) - windows(public)


def bundle_leaks(out: Path) -> list[str]:
    """Instructor folders, distinctive solution/hidden-test lines, or runs of 3 such lines, found in a bundle."""
    problems = [f"{name}/ must not be in the bundle" for name in ("solutions", "grader", "tests") if (out / name).exists()]
    lines, runs = _secret_patterns()
    for path in sorted(p for p in out.rglob("*") if p.is_file()):
        if path.suffix == ".ipynb":
            chunks = [c.source for c in nbformat.read(path, as_version=4).cells]
        else:
            chunks = [path.read_text(encoding="utf-8", errors="replace")]
        for chunk in chunks:
            code = _code_lines(chunk)
            problems += [f"{path.relative_to(out)}: {line!r}" for line in code if line in lines]
            problems += [f"{path.relative_to(out)}: lines {' / '.join(code[i:i + 3])!r}"
                         for i in range(len(code) - 2) if tuple(code[i:i + 3]) in runs]
            if ANY_MARKER.search(chunk):
                problems.append(f"{path.relative_to(out)}: an nbgrader solution/hidden-test marker")
    return problems
