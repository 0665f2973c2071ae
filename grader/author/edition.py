"""`edition OUT [--git]`: the student edition — a repository for students, public, with nothing secret in it.

It holds the released notebooks, `helpers/` and `labkit/`, its own README (open a notebook on Colab, Kaggle or
locally; check it; hand it in), its own pyproject (what the notebooks need, as ranges; torch only as the declared
extra, never installed), its own `course` script (the instructor's without the blocks marked `>>> instructor`:
no tests, grader, demo, grading kernel or browser) with pins that leave out the instructor's tools (no nbgrader:
no Nbgrader menu or second Validate button), and the licence. No solutions, hidden tests, grader, mutants or
reference records: `edition_leaks` looks for each, and for any distinctive solution or hidden-test line.

Refused: a release that is stale against solutions/ (the reason is `grader check`'s). Warned: a
`student-edition` setting still at its placeholder, and a checkout without a LICENSE.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import nbformat
import tomllib

from grader.author.bootstrap import SETTING, CourseSettings, settings
from grader.author.markers import ANY_MARKER, secret_and_public
from grader.course import assignments
from grader.paths import KERNEL_PACKAGES, NOTEBOOKS, PYPROJECT, REPO

IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints")
# The instructor's tools among the pins: tests, lint, types, the browser driver, nbgrader (and the notebook
# server it needs for its menu). A student's environment is the rest.
INSTRUCTOR_ONLY = {"nbgrader", "notebook", "pytest", "pytest-xdist", "hypothesis", "playwright", "ruff", "mypy"}
INSTRUCTOR_BLOCK = re.compile(r"^[ \t]*# >>> instructor.*?^[ \t]*# <<< instructor[^\n]*\n", re.M | re.S)
# What may never be in the edition, by name.
SECRET_PATHS = ("solutions", "grader", "tests", "build", "benchmarks", "scripts", ".ci", "mutants", "variants",
                "reference-records", "gradebook.db")
GITIGNORE = ".venv/\n__pycache__/\n*.egg-info/\n.ipynb_checkpoints/\n"


class EditionRefused(Exception):
    """The edition cannot be built from this checkout (the message says why and what to do)."""


def warnings_for(s: CourseSettings) -> list[str]:
    """What an instructor should fix before publishing; the edition is still written."""
    found = []
    if not s.published:
        found.append(f"{SETTING} is still the placeholder ({s.repository}@{s.release_tag}): the notebooks have "
                     "no Colab/Kaggle badges and their set-up cell has nothing to install from. Set it to the "
                     "edition's public repository and tag, run `python -m grader release`, then build again.")
    if not (REPO / "LICENSE").is_file():
        found.append("there is no LICENSE in this repository: the edition is published without one (add LICENSE "
                     "here and build again).")
    return found


PINS_HEADER = {
    "requirements.txt": "# The pins `./course setup` installs (torch first, then the rest); environment.yml holds the same.\n",
    "environment.yml": "# Conda environment with the same pins as requirements.txt:\n"
                       "#   conda env create -f environment.yml && conda activate training-mechanics-lab\n",
}


def _without_instructor_pins(text: str) -> str:
    """requirements.txt or environment.yml with the instructor's tools' lines (and its opening comments) left out."""
    lines = text.splitlines()
    while lines and lines[0].startswith("#"):
        lines.pop(0)
    kept = []
    for line in lines:
        name = re.match(r"\s*(?:-\s+)?([A-Za-z0-9_.-]+)==", line)
        if not (name and name.group(1).lower() in INSTRUCTOR_ONLY):
            kept.append(line)
    return "\n".join(kept) + "\n"


def course_script() -> str:
    """The instructor's `course` script without its instructor blocks."""
    return INSTRUCTOR_BLOCK.sub("", (REPO / "course").read_text())


def pyproject(s: CourseSettings) -> str:
    """The edition's pyproject: the course's metadata and ranges; helpers, labkit, and the notebooks inside labkit."""
    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    deps = ",\n".join(f"    {json.dumps(d)}" for d in project["dependencies"])
    return f"""\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = {json.dumps(project["name"])}
version = {json.dumps(project["version"])}
description = "Notebooks that show what happens inside one PyTorch training step (student edition, {s.release_tag})."
requires-python = {json.dumps(project["requires-python"])}
# What the notebooks need beyond torch and a stock kernel, as ranges wide enough for Colab's and Kaggle's own
# versions: the notebooks' set-up cell installs this package and changes nothing the kernel already has.
dependencies = [
{deps},
]

[project.optional-dependencies]
# The torch versions this release supports: declared, never installed by installing the course.
torch = {json.dumps(project["optional-dependencies"]["torch"])}

[tool.setuptools]
packages = ["helpers", "labkit", "labkit.notebooks"]
package-dir = {{"labkit.notebooks" = "notebooks"}}  # the blank notebooks, for the pre-submission check

[tool.setuptools.package-data]
"labkit.notebooks" = ["*/*.ipynb"]
"""


def readme(s: CourseSettings) -> str:
    """The edition's README, for students."""
    names = [a.name for a in assignments()]
    owner_name = s.repository.removeprefix("https://github.com/")
    rows = "\n".join(
        f"| `{n}` | [Colab](https://colab.research.google.com/github/{owner_name}/blob/{s.release_tag}/notebooks/{n}/{n}.ipynb)"
        f" · [Kaggle](https://kaggle.com/kernels/welcome?src={s.blob(f'notebooks/{n}/{n}.ipynb')}) |"
        if s.published else f"| `{n}` | not yet: this edition's address is not set, open it locally |" for n in names)
    return f"""\
# Training Mechanics Lab — student edition ({s.release_tag})

Jupyter notebooks that show what happens in one PyTorch training step, with exercises that check themselves.
Work through them in order, starting with `00_setup`.

## Open a notebook

| notebook | open it in one click |
| --- | --- |
{rows}

**Colab or Kaggle:** click its link (or the badges at the top of the notebook), then run the **set-up cell** at the
top first: it installs this course's `helpers` with pip and changes no package the kernel already has (torch,
numpy, matplotlib, ipywidgets …). On Kaggle, turn on *Settings → Internet* first. The course runs on
`torch{s.torch_range}`; the set-up cell says so when the kernel's torch is outside that.

**On your computer** (Python 3.10 or newer):

```bash
git clone {s.repository}.git && cd {owner_name.split("/")[1]}
./course lab      # sets up .venv on the first run (a few minutes), then opens JupyterLab
```

## Check, then hand in

Each notebook ends with a **Check and hand in** section. Its cell runs the notebook's visible tests again in a
fresh kernel — on Colab the notebook as the editor holds it, elsewhere as last saved — and prints ✓ or ✗ per
exercise. Then download the notebook (Colab: *File → Download → Download .ipynb*; Kaggle: *File → Download
notebook*) and hand in that file. Its name does not matter: the notebook itself says which assignment it is.
From a terminal: `./course validate notebooks/01_gradient_descent/01_gradient_descent.ipynb` (exit code 1 unless
every exercise passes). Hidden tests with more cases run when your instructor grades.

Add whatever helps you — scratch cells, prints, plots, your own functions: only what your exercise functions
return decides the grade.
"""


def _refuse_stale() -> None:
    from grader.author.check import stale_problems

    stale = stale_problems()
    if stale:
        raise EditionRefused(f"the release is stale, so the edition would not be what `release` makes: {stale[0]}"
                             + (f" (and {len(stale) - 1} more)" if len(stale) > 1 else ""))


def write_edition(out: Path) -> list[Path]:
    """Write the student edition into `out` (new or empty, or a git clone of an earlier edition whose files it
    replaces); returns the files written. Refuses a stale release."""
    if out.exists() and any(p.name != ".git" for p in out.iterdir()) and not (out / ".git").is_dir():
        raise EditionRefused(f"{out} is not empty and not a git clone of the edition: choose a new folder")
    _refuse_stale()
    s = settings()
    out.mkdir(parents=True, exist_ok=True)
    for old in (p for p in out.iterdir() if p.name != ".git"):
        shutil.rmtree(old) if old.is_dir() else old.unlink()
    shutil.copytree(NOTEBOOKS, out / "notebooks", ignore=IGNORED)
    for package in KERNEL_PACKAGES:
        shutil.copytree(package, out / package.name, ignore=IGNORED)
    for pins, header in PINS_HEADER.items():
        (out / pins).write_text(header + _without_instructor_pins((REPO / pins).read_text()))
    (out / "course").write_text(course_script())
    (out / "course").chmod(0o755)
    (out / "pyproject.toml").write_text(pyproject(s))
    (out / "README.md").write_text(readme(s))
    (out / ".gitignore").write_text(GITIGNORE)
    if (REPO / "LICENSE").is_file():
        shutil.copy2(REPO / "LICENSE", out / "LICENSE")
    leaks = edition_leaks(out)
    if leaks:
        raise EditionRefused(f"{len(leaks)} leak(s) in the edition, first: {leaks[0]}")
    return sorted(p for p in out.rglob("*") if p.is_file() and ".git" not in p.relative_to(out).parts)


def commit_and_tag(out: Path, s: CourseSettings | None = None) -> str:
    """Make `out` a git repository (or add a commit to the clone it is) with the edition's release tag."""
    s = s or settings()

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(out), *args], check=True, capture_output=True, text=True).stdout

    if not (out / ".git").is_dir():
        git("init", "--quiet", "--initial-branch=main")
    if git("tag", "--list", s.release_tag).strip():
        raise EditionRefused(f"{out} already has the tag {s.release_tag}: a new version needs a new tag in {SETTING}")
    git("add", "--all")
    identity = ["-c", "user.name=Training Mechanics Lab", "-c", "user.email=edition@invalid"]
    git(*identity, "commit", "--quiet", "--allow-empty", "-m", f"Student edition {s.release_tag}")
    git(*identity, "tag", "-a", s.release_tag, "-m", f"Student edition {s.release_tag}")
    return s.release_tag


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


def edition_leaks(out: Path) -> list[str]:
    """Instructor folders and files, distinctive solution/hidden-test lines, or runs of 3 such lines, in an edition."""
    files = sorted(p for p in out.rglob("*") if p.is_file() and ".git" not in p.relative_to(out).parts)
    problems = [f"{p.relative_to(out)} must not be in the edition" for p in files
                if set(p.relative_to(out).parts) & set(SECRET_PATHS) or (p.suffix == ".toml" and p.parent != out)]
    lines, runs = _secret_patterns()
    for path in files:
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
