"""The frame of every student notebook: badges and a set-up cell at the top, a check and hand-in at the end.

The release (grader/author/release.py) puts two cells right below each student notebook's title:
- a markdown cell (id `course-kernel`): Colab and Kaggle badges for the public student edition at its release
  tag (while the setting is still the placeholder, a sentence saying it is not published instead), what the
  notebook needs (from `NEEDS`) and how to turn on a GPU runtime;
- a read-only code cell (grade_id `course_bootstrap`, tag `bootstrap`; grading skips it), folded to its first line
  (JupyterLab's hidden source, Colab's form title) so that a notebook opens on its own words: where `helpers`
  imports it does nothing but say so; otherwise it pip-installs the course package from one spec — the
  edition's archive at the release tag, or the environment variable TML_INSTALL_SPEC (a path, wheel or URL) —
  with every package the kernel already has held at its version by a pip constraint (torch, numpy, matplotlib,
  ipywidgets …). On a torch outside the supported range it says which versions work.
and two after its last: how to check, download and hand in (id `course-hand-in`), and a read-only cell that
runs the check on the open notebook (grade_id `course_check`, labkit/validate.py). The notebook's metadata
records its assignment (`metadata.tml.assignment`): collection grades a renamed hand-in by it.

Everything comes from pyproject.toml: `[tool.training-mechanics-lab]` (student-edition, kernel-extras) and the
supported torch range, `[project.optional-dependencies].torch`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import nbformat
import tomllib

from grader.paths import PYPROJECT
from labkit import cells

MARKDOWN_ID = "course-kernel"
CELL_ID = "course-bootstrap"
GRADE_ID = "course_bootstrap"
HAND_IN_ID = "course-hand-in"
CHECK_ID = "course-check"
CHECK_GRADE_ID = "course_check"
TAG = cells.BOOTSTRAP  # grading skips it (labkit/cells.py)

# What each notebook needs: one of the keys of NEEDS_TEXT. A new notebook gets an entry here.
NEEDS = {
    "00_setup": "gpu-optional",
    "01_gradient_descent": "cpu",
    "02_autograd_graph": "gpu-optional",
    "03_minibatch_noise": "cpu",
    "04_custom_function": "cpu",
    "05_training_step": "cpu",
    "06_mixed_precision": "gpu-helps",
    "07_distributed": "two-gpus",
}
NEEDS_TEXT = {
    "cpu": "a CPU is enough; nothing in this notebook uses a GPU.",
    "gpu-optional": "a CPU is enough. On a GPU runtime the cells that look at the GPU use it too; on a CPU they "
                    "say what they skipped.",
    "gpu-helps": "runs on a CPU; **one GPU helps**: the GPU measurements (the precision table's CUDA rows, timing "
                 "with synchronize, pinned memory, the caching allocator) run only on a GPU — on a CPU they say "
                 "they were skipped.",
    "two-gpus": "runs on a CPU (2 processes over gloo). **The nccl part needs 2 GPUs**, one per process — e.g. "
                "Kaggle's *GPU T4 ×2*; with one GPU or none it stays on gloo and says so.",
}
GPU_HOWTO = ("**A GPU runtime:** Colab: *Runtime → Change runtime type → T4 GPU*. Kaggle: *Settings → Accelerator → "
             "GPU T4 ×2*, and *Settings → Internet → on* (the set-up cell installs the course with pip). "
             "A JupyterHub: pick a GPU server or image when you start yours, if your hub offers one.")


PLACEHOLDER_OWNER = "YOUR-ORG"  # pyproject's student-edition until the instructor names the real one
SETTING = "[tool.training-mechanics-lab] student-edition"
# Where Colab and Kaggle can open a notebook from: GitHub alone. An https, ssh or scp-like (git@github.com:O/N) URL.
GITHUB = re.compile(r"(?:https://|ssh://git@|git@)github\.com[/:](?P<owner>[\w.-]+)/(?P<name>[\w.-]+?)(?:\.git)?/?")
SCP_LIKE = re.compile(r"(?P<user>[\w.-]+)@(?P<host>[\w.-]+):(?P<path>.+)")  # git's user@host:path
RELEASE_TAG = re.compile(r"[\w.+-]+(?:/[\w.+-]+)*")


class SettingsError(ValueError):
    """A course setting in pyproject.toml that cannot work; the message is one line that says how to fix it."""


@dataclass(frozen=True)
class CourseSettings:
    """The course's settings in pyproject.toml that the student notebooks' header is made from."""

    version: str
    repository: str  # the public student edition (never the instructor's): a git URL, or an absolute local path
    release_tag: str
    torch_range: str  # e.g. ">=2.11,<2.15"
    kernel_extras: tuple[str, ...]

    @property
    def github(self) -> str | None:
        """OWNER/NAME where the edition is on GitHub (then Colab and Kaggle can open its notebooks), else None."""
        found = GITHUB.fullmatch(self.repository)
        return f"{found.group('owner')}/{found.group('name')}" if found else None

    @property
    def published(self) -> bool:
        """False while the student edition's setting is still the placeholder: there is nowhere to link to."""
        return (self.github or "").split("/")[0].upper() != PLACEHOLDER_OWNER

    @property
    def git_url(self) -> str:
        """What `git clone` and `git remote add` take."""
        return f"https://github.com/{self.github}.git" if self.github else self.repository

    @property
    def torch_minimum(self) -> tuple[int, int]:
        return _bound(self.torch_range, ">=")

    @property
    def torch_below(self) -> tuple[int, int] | None:
        found = re.search(r"<\s*(\d+)\.(\d+)", self.torch_range)
        return (int(found.group(1)), int(found.group(2))) if found else None

    @property
    def install_spec(self) -> str:
        """What the set-up cell installs by default: on GitHub the edition's archive at the release tag (no git
        needed); elsewhere pip's git+URL@TAG (the kernel needs git, and a local path only works on that machine)."""
        if not self.published:
            return ""
        if self.github:
            return f"https://github.com/{self.github}/archive/refs/tags/{self.release_tag}.zip"
        scp = SCP_LIKE.fullmatch(self.repository)
        url = (f"ssh://{scp['user']}@{scp['host']}/{scp['path']}" if scp and "://" not in self.repository
               else Path(self.repository).as_uri() if self.repository.startswith("/") else self.repository)
        return f"git+{url}@{self.release_tag}"

    def blob(self, path: str) -> str:
        """`path` in a GitHub edition at the release tag, as GitHub shows it (what Colab and Kaggle open)."""
        return f"https://github.com/{self.github}/blob/{self.release_tag}/{path}"


def _bound(spec: str, op: str) -> tuple[int, int]:
    found = re.search(re.escape(op) + r"\s*(\d+)\.(\d+)", spec)
    if not found:
        raise ValueError(f"the torch range {spec!r} in pyproject.toml has no {op} bound")
    return int(found.group(1)), int(found.group(2))


@cache
def settings(pyproject: Path = PYPROJECT) -> CourseSettings:
    """The course's settings, read from pyproject.toml."""
    data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    tool = data["tool"]["training-mechanics-lab"]
    (torch_req,) = data["project"]["optional-dependencies"]["torch"]
    torch_range = torch_req.split("torch", 1)[1].strip()
    value = tool.get("student-edition", "")
    where, _, tag = value.rpartition("@") if isinstance(value, str) else ("", "", "")
    if not where or not RELEASE_TAG.fullmatch(tag) or re.search(r"\s", where):
        raise SettingsError(f"{SETTING} in {pyproject} must be the public student edition's git URL or local path, "
                            f"then @ and its release tag (https://gitlab.com/ORG/NAME@v1.0, /srv/git/edition@v1.0), "
                            f"not {value!r}")
    if "://" not in where and not SCP_LIKE.fullmatch(where):   # a local path, from pyproject.toml's folder
        where = str((pyproject.parent / where).resolve())
    return CourseSettings(version=data["project"]["version"], repository=where, release_tag=tag,
                          torch_range=torch_range, kernel_extras=tuple(tool.get("kernel-extras", ())))


def needs(assignment: str) -> str:
    """What `assignment` needs, as its header says it."""
    if assignment not in NEEDS:
        raise KeyError(f"grader/author/bootstrap.py NEEDS has no entry for {assignment}: say whether it needs a GPU "
                       f"(one of {', '.join(NEEDS_TEXT)})")
    return NEEDS_TEXT[NEEDS[assignment]]


def _badges(assignment: str, s: CourseSettings) -> str:
    """The Colab and Kaggle badges for `assignment` in the student edition, or why there are none yet."""
    if not s.published:
        return ("**Open in Colab or Kaggle:** not yet — this course's student edition is not published, so there "
                "is nothing for Colab or Kaggle to open. Open this notebook where the course is installed "
                "(`./course lab`), or ask your instructor for the edition's address.")
    if not s.github:
        return (f"**Open in Colab or Kaggle:** they open notebooks from GitHub only, and this course's student edition "
                f"is at `{s.repository}` (release `{s.release_tag}`): clone it and open this notebook there "
                f"(`./course lab`).")
    path = f"notebooks/{assignment}/{assignment}.ipynb"
    colab = f"https://colab.research.google.com/github/{s.github}/blob/{s.release_tag}/{path}"
    kaggle = f"https://kaggle.com/kernels/welcome?src={s.blob(path)}"
    return (f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({colab}) "
            f"[![Open in Kaggle](https://kaggle.com/static/images/open-in-kaggle.svg)]({kaggle})")


def badges_markdown(assignment: str, s: CourseSettings | None = None) -> str:
    """The header's markdown: badges, what the notebook needs, how to get a GPU runtime, what the set-up cell does."""
    s = s or settings()
    gpu = "" if NEEDS.get(assignment) == "cpu" else "\n\n" + GPU_HOWTO
    return (f"{_badges(assignment, s)}\n\n"
            f"**What this notebook needs:** {needs(assignment)}{gpu}\n\n"
            f"**Run the set-up cell below first.** Where the course is installed (`./course lab`) it does "
            f"nothing; on Colab, Kaggle or a hub it installs the course's `helpers` package with pip and changes no "
            f"package the kernel already has — not torch (the course supports `torch{s.torch_range}`), numpy, "
            f"matplotlib or ipywidgets.")


def bootstrap_source(s: CourseSettings | None = None) -> str:
    """The set-up cell's code. Cheap when the course is there: two metadata look-ups and one import."""
    s = s or settings()
    low = ".".join(map(str, s.torch_minimum))
    below = s.torch_below
    newer = (f'_newer = f"; torch {{_torch}} is newer than the versions this release was tested on" '
             f'if _have >= {below!r} else ""' if below else '_newer = ""')
    extras = "".join(f", {json.dumps(e)}" for e in s.kernel_extras)
    return f'''\
# @title Course set-up: run this cell first {{ display-mode: "form" }}
# Where the course is installed it does nothing. On a kernel without it (Colab, Kaggle, a hub)
# it pip-installs the course's `helpers` package and what the notebooks need beyond a stock kernel, and changes
# no package the kernel already has: a pip constraint holds every one of them (torch, numpy, matplotlib,
# ipywidgets …) at its version. TML_INSTALL_SPEC (a path, wheel or URL) replaces where it installs from.
import importlib, importlib.metadata, importlib.util, os, re, site, subprocess, sys, tempfile

TML_TORCH = "{s.torch_range}"  # the torch versions this release supports
try:
    _torch = importlib.metadata.version("torch")
except importlib.metadata.PackageNotFoundError:
    raise RuntimeError(f"This kernel has no torch. Install a torch{{TML_TORCH}} build for your machine "
                       "(pytorch.org, Get Started), then run this cell again.") from None
_have = tuple(int(n) for n in re.findall(r"\\d+", _torch)[:2])
if _have < {s.torch_minimum!r}:
    raise RuntimeError(f"torch {{_torch}} is older than this course supports: it runs on torch{{TML_TORCH}} "
                       "(torch {low} or newer). On Colab or Kaggle pick a current runtime; elsewhere install a newer "
                       "torch for your machine (pytorch.org), restart the kernel and run this cell again.")
{newer}
if importlib.util.find_spec("helpers") is not None:
    print(f"Course set-up: the course is installed; nothing to do (torch {{_torch}}{{_newer}}).")
else:
    _spec = os.environ.get("TML_INSTALL_SPEC") or "{s.install_spec}"
    if not _spec:
        raise RuntimeError("Course set-up: this course's student edition is not published yet, so there is nothing "
                           "to install it from. Open the notebook where the course is installed (./course lab), or "
                           "set TML_INSTALL_SPEC to a copy of the course (%env TML_INSTALL_SPEC=...).")

    def _installed():
        found = {{}}
        for dist in importlib.metadata.distributions():
            name = re.sub(r"[-_.]+", "-", dist.metadata.get("Name") or "").lower()
            if name and re.fullmatch(r"[0-9][0-9A-Za-z.+!_-]*", dist.version or ""):
                found.setdefault(name, dist.version)
        return found

    _kept = _installed()
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as _hold:
        _hold.write("".join(f"{{n}}=={{v}}\\n" for n, v in sorted(_kept.items())))  # pip may change none of them
    _pip = subprocess.run([sys.executable, "-m", "pip", "install", "--constraint", _hold.name, _spec{extras}],
                          capture_output=True, text=True)
    os.unlink(_hold.name)
    if _pip.returncode:
        raise RuntimeError(f"Course set-up: pip could not install the course from {{_spec}} without changing a "
                           "package this kernel already has:\\n" + (_pip.stdout + _pip.stderr)[-3000:])
    importlib.invalidate_caches()
    if importlib.util.find_spec("helpers") is None:  # pip fell back to a user install (site-packages read-only)
        site.addsitedir(site.getusersitepackages())
    import helpers  # noqa: F401  (fails here, not deep in a later cell, if the install did not take)
    _shown = ", ".join(f"{{n}} {{_kept[n]}}" for n in ("torch", "numpy", "matplotlib", "ipywidgets") if n in _kept)
    print(f"Course set-up: installed the course from {{_spec}} with pip ({{len(set(_installed()) - set(_kept))}} new "
          f"packages) and changed none of the kernel's {{len(_kept)}} packages ({{_shown}}){{_newer}}.")'''


def _locked_cell(source: str, cell_id: str, grade_id: str, folded: bool = False) -> nbformat.NotebookNode:
    """A read-only code cell that runs only in Jupyter (grading and the pre-submission check skip its tag);
    `folded`: its code hidden behind its first line, in JupyterLab (source_hidden) and in Colab (a form's title)."""
    from nbgrader.utils import compute_checksum

    code = nbformat.v4.new_code_cell(source, id=cell_id)
    code.metadata = nbformat.from_dict({
        "deletable": False, "editable": False, "tags": [TAG],
        **({"jupyter": {"source_hidden": True}, "cellView": "form"} if folded else {}),
        "nbgrader": {"cell_type": "code", "grade": False, "grade_id": grade_id, "locked": True,
                     "schema_version": 3, "solution": False, "task": False}})
    code.metadata.nbgrader["checksum"] = compute_checksum(code)
    return code


def header_cells(assignment: str) -> list[nbformat.NotebookNode]:
    """The two cells the release puts at the top of `assignment`'s student notebook."""
    text = nbformat.v4.new_markdown_cell(badges_markdown(assignment), id=MARKDOWN_ID)
    return [text, _locked_cell(bootstrap_source(), CELL_ID, GRADE_ID, folded=True)]


HAND_IN = """\
## Check and hand in

1. **Check:** run the cell below. It runs this notebook's visible tests again in a fresh kernel — on the notebook
   as you have it now on Colab, as Kaggle last stored it, or as last saved elsewhere (save first) — and prints ✓
   or ✗ per exercise. An answer that needs a name only your kernel has fails here too, as it would at grading.
2. **Download:** Colab: *File → Download → Download .ipynb*. Kaggle: *File → Download notebook*. Jupyter: the
   file itself (JupyterLab: right-click it in the file browser → *Download*).
3. **Hand in** that file as it is. A name changed on the way (`Copy of …`, `-` for `_`, ` (1)`) does not matter:
   the notebook itself says which assignment it is."""


def footer_cells(assignment: str) -> list[nbformat.NotebookNode]:
    """The two cells the release puts at the end of `assignment`'s student notebook: check it, then hand it in."""
    text = nbformat.v4.new_markdown_cell(HAND_IN, id=HAND_IN_ID)
    source = ("# Runs this notebook's visible tests in a fresh kernel; labkit/validate.py says where it finds the notebook.\n"
              "from labkit.validate import check_open_notebook\n\n"
              f"check_open_notebook({assignment!r})")
    return [text, _locked_cell(source, CHECK_ID, CHECK_GRADE_ID)]


FRAME_IDS = (MARKDOWN_ID, CELL_ID, HAND_IN_ID, CHECK_ID)


def add_frame(path: Path, assignment: str) -> None:
    """Put the header cells below the student notebook's title (`# …`, its first cell) and the footer cells at its
    end (replacing older ones), and record which assignment it is in its metadata, so that a renamed hand-in is
    still graded as that assignment."""
    nb = nbformat.read(path, as_version=4)
    body = [c for c in nb.cells if c.get("id") not in FRAME_IDS]
    graded = bool(cells.points(body))  # notebook 00 has nothing to check or hand in
    title = body[:1] if body and body[0].cell_type == "markdown" and body[0].source.startswith("# ") else []
    nb.cells = title + header_cells(assignment) + body[len(title):] + (footer_cells(assignment) if graded else [])
    nb.metadata.setdefault("tml", {})["assignment"] = assignment
    nbformat.write(nb, path)


def with_bootstrap(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """A copy of a solution notebook with the set-up cell in front (to run it on a kernel without the course)."""
    import copy

    out = copy.deepcopy(nb)
    out.cells = [nbformat.v4.new_code_cell(bootstrap_source(), id=CELL_ID)] + out.cells
    return out
