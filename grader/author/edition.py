"""`edition OUT [--git]`: the student edition — a repository for students, public, with nothing secret in it.

It holds the released notebooks, `helpers/` and `labkit/`, its own README (open a notebook on Colab, Kaggle or
locally; check it; hand it in), its own pyproject (what the notebooks need, as ranges; torch only as the declared
extra, never installed), its own `course` script (the instructor's without the blocks marked `>>> instructor`:
no tests, grader, demo, grading kernel or browser) with pins that leave out the instructor's tools (no nbgrader:
no Nbgrader menu or second Validate button), and the licence. No solutions, hidden tests, grader, mutants or
reference records: `edition_leaks` looks for each, and for any distinctive solution or hidden-test line.

Refused: a release that is stale against solutions/ (the reason is `grader check`'s); files in helpers/, labkit/
or notebooks/ that git does not track (a draft there would be published); a symbolic link anywhere in what it ships
(a link is published as the file it points to, which may be a solution); an OUT that is not new, empty or a clone of
the edition (the instructor repository, or anything with its folders, is never emptied); with --git, a clone that
already has the tag; an edition with a leak. Every refusal comes before OUT is touched: the edition is built and
checked in a fresh temporary folder, and only then replaces OUT's files (its .git stays). Warned: a
`student-edition` setting still at its placeholder, and a checkout without a LICENSE.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import nbformat
import tomllib

from grader.author.bootstrap import SETTING, CourseSettings, settings
from grader.author.markers import ANY_MARKER, secret_and_public
from grader.course import assignments
from grader.paths import KERNEL_PACKAGES, NOTEBOOKS, PYPROJECT, REPO

# The instructor's tools among the pins: tests, lint, types, the browser driver, nbgrader (and the notebook
# server it needs for its menu). A student's environment is the rest.
INSTRUCTOR_ONLY = {"nbgrader", "notebook", "pytest", "pytest-xdist", "hypothesis", "playwright", "ruff", "mypy",
                   "sphinx", "myst-parser", "furo"}
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


def course_project() -> dict:
    """pyproject.toml's [project] table."""
    return tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]


def pyproject(s: CourseSettings) -> str:
    """The edition's pyproject: the course's metadata and ranges; helpers, labkit, and the notebooks inside labkit."""
    project = course_project()
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
    rows = "\n".join(
        f"| `{n}` | [Colab](https://colab.research.google.com/github/{s.github}/blob/{s.release_tag}/notebooks/{n}/{n}.ipynb)"
        f" · [Kaggle](https://kaggle.com/kernels/welcome?src={s.blob(f'notebooks/{n}/{n}.ipynb')}) |"
        if s.published and s.github else
        f"| `{n}` | not on Colab or Kaggle (they open GitHub only): open it locally |" if s.published else
        f"| `{n}` | not yet: this edition's address is not set, open it locally |" for n in names)
    folder = s.git_url.rstrip("/").rsplit("/", 1)[-1].rsplit(":", 1)[-1].removesuffix(".git")
    clone = (f"git clone {s.git_url} && cd {folder}" if s.published
             else "cd THIS-REPOSITORY  # a clone or copy of it (its address is not set yet)")
    return f"""\
# Training Mechanics Lab — student edition ({s.release_tag})

Jupyter notebooks that show what happens in one PyTorch training step, with exercises that check themselves.
Work through them in order, starting with `00_setup`.

## Open a notebook

| notebook | open it in one click |
| --- | --- |
{rows}

**Colab or Kaggle:** click its link (or the badges under the notebook's title), then run the **set-up cell** under
them first (folded to one line: *Course set-up: run this cell first*): it installs this course's `helpers` with pip
and changes no package the kernel already has (torch, numpy, matplotlib, ipywidgets …). On Kaggle, turn on
*Settings → Internet* first. The course runs on `torch{s.torch_range}`; the set-up cell says so when the kernel's
torch is outside that.

**On your computer** (Python {course_project()['requires-python'].removeprefix('>=')} or newer):

```bash
{clone}
./course lab      # sets up .venv on the first run (a few minutes), then opens JupyterLab
```

## Check, then hand in

Each notebook ends with a **Check and hand in** section. Its cell runs the notebook's visible tests again in a
fresh kernel — on Colab the notebook as the editor holds it, elsewhere as last saved — and prints ✓ or ✗ per
exercise. Then download the notebook (Colab: *File → Download → Download .ipynb*; Kaggle: *File → Download
notebook*) and hand in that file. Its name does not matter: the notebook itself says which assignment it is.
From a terminal: `./course validate notebooks/01_gradient_descent/01_gradient_descent.ipynb` (exit code 1 unless
every exercise passes). Hidden tests with more cases run when your instructor grades.

**On a JupyterHub where your instructor uses nbgrader** you need none of the above: open *Nbgrader →
Assignment List* in JupyterLab, press *Fetch* beside the notebook (it lands in a folder of its name in your
home), work in it, run its check cell, save, then press *Submit* beside it — submit again as often as you like
before the deadline; the last one counts. From a terminal there: `nbgrader fetch_assignment 01_gradient_descent`
and `nbgrader submit 01_gradient_descent`. Graded feedback comes back through *Fetch Feedback* in the same list.

Add whatever helps you — scratch cells, prints, plots, your own functions: only what your exercise functions
return decides the grade.
"""


def _git(folder: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True, text=True).stdout


def _tracked(package: Path) -> list[Path]:
    """The files of `package` that git tracks; refused when it holds others (an instructor's draft or scratch
    file would be published). Without git (an exported checkout) every file but caches."""
    try:
        listed = _git(REPO, "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--",
                      str(package.relative_to(REPO)))
        untracked = _git(REPO, "ls-files", "-z", "--others", "--exclude-standard", "--", str(package.relative_to(REPO)))
    except (OSError, subprocess.CalledProcessError):
        return [p for p in package.rglob("*") if (p.is_file() or p.is_symlink()) and p.suffix != ".pyc"
                and not {"__pycache__", ".ipynb_checkpoints"} & set(p.parts)]
    if untracked.strip("\0"):
        names = ", ".join(sorted(untracked.strip("\0").split("\0"))[:5])
        raise EditionRefused(f"files that git does not track would be published: {names} — commit or remove them")
    return [REPO / name for name in listed.strip("\0").split("\0") if name]


def _refuse_links(paths: list[Path]) -> None:
    """A link (or a path through a linked folder) is published as what it points to, which may be anything the
    instructor can read — a solution notebook: refused, by name, whatever it points to."""
    for path in paths:
        inside = path.relative_to(REPO)
        link = next((REPO / Path(*inside.parts[:n]) for n in range(1, len(inside.parts) + 1)
                     if (REPO / Path(*inside.parts[:n])).is_symlink()), None)
        if link is not None:
            raise EditionRefused(f"{link.relative_to(REPO)} is a symbolic link (to {link.readlink()}): the edition "
                                 "ships no links — replace it with the file itself")


def _refuse_unsafe_out(out: Path) -> None:
    """OUT must be new, empty, or a git clone of the edition: never the instructor repository or a folder above it,
    never a folder with the instructor's folders in it (its contents are replaced)."""
    here = out.resolve()
    if REPO.is_relative_to(here):
        raise EditionRefused(f"{out} is the instructor repository or holds it: choose a folder outside it")
    if here.exists() and not here.is_dir():
        raise EditionRefused(f"{out} is a file: choose a new folder")
    if not here.exists() or not any(p.name != ".git" for p in here.iterdir()):
        return
    if not (here / ".git").is_dir():
        raise EditionRefused(f"{out} is not empty and not a git clone of the edition: choose a new folder")
    instructor = sorted(p.name for p in here.iterdir() if p.name in SECRET_PATHS)
    if instructor:
        raise EditionRefused(f"{out} holds {', '.join(instructor)}: it is not a clone of the edition (its files "
                             "would be replaced); choose a new folder")


def refuse_existing_tag(out: Path, s: CourseSettings | None = None) -> None:
    """With --git: a clone that already has the release tag is refused before anything is written."""
    s = s or settings()
    if (out / ".git").is_dir() and _git(out, "tag", "--list", s.release_tag).strip():
        raise EditionRefused(f"{out} already has the tag {s.release_tag}: a new version needs a new tag in {SETTING}")


def _refuse_stale() -> None:
    from grader.author.check import stale_problems

    stale = stale_problems()
    if stale:
        raise EditionRefused("the release is stale (notebooks/ is not what `release` makes now from solutions/ and the "
                             f"settings in pyproject.toml, student-edition included): {stale[0]}"
                             + (f" (and {len(stale) - 1} more)" if len(stale) > 1 else ""))


def write_edition(out: Path) -> list[Path]:
    """Write the student edition into `out` (new or empty, or a git clone of an earlier edition whose files it
    replaces); returns the files written. Built and leak-checked in a temporary folder first: a refusal leaves
    `out` exactly as it was."""
    _refuse_unsafe_out(out)
    _refuse_stale()
    shipped = [path for folder in (NOTEBOOKS, *KERNEL_PACKAGES) for path in [folder, *_tracked(folder)]]
    pins = [REPO / name for name in (*PINS_HEADER, "course", "LICENSE")]
    _refuse_links(shipped + pins)
    s = settings()
    with tempfile.TemporaryDirectory(prefix="tml-edition-") as staging:
        built = Path(staging)
        for path in (p for p in shipped if p.is_file()):
            (built / path.relative_to(REPO)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, built / path.relative_to(REPO))
        for name, header in PINS_HEADER.items():
            (built / name).write_text(header + _without_instructor_pins((REPO / name).read_text()))
        (built / "course").write_text(course_script())
        (built / "course").chmod(0o755)
        (built / "pyproject.toml").write_text(pyproject(s))
        (built / "README.md").write_text(readme(s))
        (built / ".gitignore").write_text(GITIGNORE)
        if (REPO / "LICENSE").is_file():
            shutil.copy2(REPO / "LICENSE", built / "LICENSE")
        leaks = edition_leaks(built)
        if leaks:
            raise EditionRefused(f"{len(leaks)} leak(s) in the edition, first: {leaks[0]}")
        out.mkdir(parents=True, exist_ok=True)
        for old in (p for p in out.iterdir() if p.name != ".git"):
            shutil.rmtree(old) if old.is_dir() and not old.is_symlink() else old.unlink()
        for new in built.iterdir():
            shutil.move(new, out / new.name)
    return sorted(p for p in out.rglob("*") if p.is_file() and ".git" not in p.relative_to(out).parts)


def commit_and_tag(out: Path, s: CourseSettings | None = None) -> str:
    """Make `out` a git repository (or add a commit to the clone it is) with the edition's release tag."""
    s = s or settings()
    if not (out / ".git").is_dir():
        _git(out, "init", "--quiet", "--initial-branch=main")
    refuse_existing_tag(out, s)
    _git(out, "add", "--all")
    identity = ["-c", "user.name=Training Mechanics Lab", "-c", "user.email=edition@invalid"]
    _git(out, *identity, "commit", "--quiet", "--allow-empty", "-m", f"Student edition {s.release_tag}")
    _git(out, *identity, "tag", "-a", s.release_tag, "-m", f"Student edition {s.release_tag}")
    return s.release_tag


def branch(out: Path) -> str:
    """The branch the edition's commit is on (main for a new repository; a clone keeps its own)."""
    return _git(out, "rev-parse", "--abbrev-ref", "HEAD").strip()


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
