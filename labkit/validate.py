"""Pre-submission check: run a notebook's visible tests in a fresh kernel and say which exercises fail.

`python -m labkit.validate NOTEBOOK` (or `./course validate NOTEBOOK`) exits 1 unless every exercise is
answered and passes its visible test — unlike `nbgrader validate`, whose exit code is 0 either way. The fresh
kernel is this Python's own ipykernel (not whatever the `python3` kernelspec names), so it has this kernel's packages.

From inside a notebook, `check_open_notebook(ASSIGNMENT)` (the last cell of every student notebook) checks the
notebook that is open, wherever it runs:
- on Colab it is not on disk: Colab's front end hands it over (`google.colab._message.blocking_request
  ("get_ipynb")`, unsaved edits included);
- on Kaggle, the copy Kaggle keeps beside the kernel (`/kaggle/working/…__notebook_source__.ipynb`);
- elsewhere the file on disk: the notebook Jupyter started this kernel for (`JPY_SESSION_NAME`), VS Code's
  (`__vsc_ipynb_file__`), `ASSIGNMENT.ipynb` in the working folder, or a notebook there whose metadata names
  ASSIGNMENT (a renamed copy);
- where none of these is found, the course's blank copy with the answers this kernel ran last (IPython's `In`).
A notebook whose metadata names another assignment is never taken for this one. It then says how to
download the notebook for hand-in on that platform.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import nbformat
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager

from labkit import cells
from labkit.runner import NotebookRunner

NOT_ANSWERED = "not answered yet"
WAITING = "waits for an earlier exercise"  # a test that uses an unfinished earlier exercise (helpers.checks)
KAGGLE_COPIES = (Path("/kaggle/working/.virtual_documents/__notebook_source__.ipynb"),
                 Path("/kaggle/working/__notebook_source__.ipynb"))
DOWNLOAD = {
    "colab": "download it with File → Download → Download .ipynb",
    "kaggle": "download it with File → Download notebook",
    "jupyter": "hand in the file {path} (JupyterLab: right-click it in the file browser → Download)",
}


def validate_notebook(path: str | Path, timeout: int = 120, cwd: str | Path | None = None) -> dict[str, str]:
    """Execute a notebook (demo and claim cells skipped) in `cwd` (default: its folder); returns test grade_id →
    "" when it passed, else the error (notebook 00)."""
    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    nb.cells = [c for c in nb.cells if cells.kind(c) not in cells.SKIPPED]  # as grading skips them
    # A kernel on ipc sockets in a private folder: over TCP, ipykernel warns on its stderr (which a kernel
    # started from a notebook cell shares with that notebook) that the channel is not encrypted.
    with tempfile.TemporaryDirectory(prefix="validate-") as work:
        manager = AsyncKernelManager(kernel_name=_KERNEL, kernel_spec_manager=_this_python(work), transport="ipc",
                                     ip=os.path.join(work, "kernel"))
        manager.connection_file = os.path.join(work, "connection.json")
        client = NotebookRunner(nb, km=manager, timeout=timeout, allow_errors=True, kernel_name=_KERNEL,
                                resources={"metadata": {"path": str(cwd or path.parent)}})
        client.execute(cleanup_kc=True)  # nbclient keeps alive a kernel whose manager it was handed
    results = {}
    for cell in nb.cells:
        if cells.kind(cell) != cells.TEST:
            continue
        info = cells.nbgrader(cell)
        errors = [o for o in cell.outputs if o.output_type == "error"]
        if not errors:
            results[info["grade_id"]] = ""
        elif errors[0].ename in ("NotImplementedError", "ExerciseNotAnswered"):  # helpers.checks.exercise_test
            results[info["grade_id"]] = f"{NOT_ANSWERED} (the answer cell still raises NotImplementedError)"
        elif errors[0].ename == "ExerciseNotImplementedError":  # helpers.checks.earlier_exercise
            results[info["grade_id"]] = f"{WAITING}: {errors[0].evalue}"
        else:
            results[info["grade_id"]] = f"{errors[0].ename}: {errors[0].evalue}"
    return results


_KERNEL = "tml-check"


def _this_python(folder: str) -> KernelSpecManager:
    """Kernelspecs holding one: this Python's ipykernel. The `python3` kernelspec may name another Python (a user's
    or a hub's), and Colab's runs its own launcher."""
    spec = Path(folder) / "kernels" / _KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "pre-submission check", "language": "python"}))
    return KernelSpecManager(kernel_dirs=[str(spec.parent)])


def report(path: str | Path, *, unanswered_ok: bool = False, cwd: str | Path | None = None) -> bool:
    """Print ✓/✗ per exercise of a notebook; True when every visible test passes (notebook 00).

    Before you submit, an exercise not answered yet is a ✗ like any failure. With `unanswered_ok=True`
    (notebook 00 checks the tool on a notebook you have not started) it is marked – and is not a failure, nor is
    one whose test waits for an earlier exercise not answered yet: True when every answered exercise passes.
    """
    results = validate_notebook(path, cwd=cwd)
    unanswered = {name for name, problem in results.items() if problem.startswith((NOT_ANSWERED, WAITING))}
    failed = {name for name, problem in results.items() if problem and not (unanswered_ok and name in unanswered)}
    for exercise, problem in results.items():
        mark = "✓" if not problem else ("–" if unanswered_ok and exercise in unanswered else "✗")
        print(f"{mark} {exercise}" + (f": {problem}" if problem else ""))
    if not results:
        verdict = "no graded exercises"
    elif unanswered_ok:
        answered = len(results) - len(unanswered)
        verdict = (f"{answered} of {len(results)} exercises answered"
                   + ("" if not answered else "; every answered one passes its visible test" if not failed
                      else f"; {len(failed)} answered exercise(s) fail their visible test"))
    else:
        verdict = "all visible tests pass" if not failed else "some visible tests fail"
    print(f"{Path(path).name}: {verdict}")
    try:
        written(nbformat.read(path, as_version=4))
    except (OSError, ValueError):  # the notebook went away (or was never a file) after it ran: nothing to add
        pass
    return not failed


def written(nb: nbformat.NotebookNode) -> None:
    """Print each written answer of `nb`: graded by hand, so no check can say more than whether it is written."""
    release = released_notebook(assignment_of(nb) or "")
    stubs = {cells.grade_id(c): c for c in nbformat.read(release, as_version=4).cells} if release else {}
    for cell in nb.cells:
        if cells.kind(cell) != cells.WRITTEN:
            continue
        grade_id = cells.grade_id(cell)
        answered = cells.is_answered(cell, stubs.get(grade_id, {"source": "YOUR ANSWER HERE"}))
        print(f"{'✎' if answered else '–'} {grade_id}: graded by hand — "
              + ("written; your instructor grades it" if answered else f"{NOT_ANSWERED} (the cell still says YOUR ANSWER HERE)"))


# --- the notebook that is open ----------------------------------------------------------------------------

def platform() -> str:
    """Where this kernel runs: "kaggle", "colab" or "jupyter" (Kaggle first: its image is built on Colab's)."""
    if os.environ.get("KAGGLE_KERNEL_RUN_TYPE"):
        return "kaggle"
    if os.environ.get("COLAB_RELEASE_TAG") or "google.colab" in sys.modules:
        return "colab"
    return "jupyter"


def _from_json(raw: dict) -> nbformat.NotebookNode:
    """A notebook from the JSON a front end hands over: Colab's cells may lack ids (it keeps its own in metadata)."""
    raw = dict(raw, nbformat=4, nbformat_minor=max(5, int(raw.get("nbformat_minor", 5))))
    raw["cells"] = [dict(cell, id=cell.get("id") or f"cell-{i}") for i, cell in enumerate(raw.get("cells", []))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return nbformat.reads(json.dumps(raw), as_version=4)


def _colab_notebook(timeout: int = 60) -> nbformat.NotebookNode | None:
    """The notebook as Colab's front end holds it now (unsaved edits included), or None when it does not answer."""
    try:
        from google.colab import _message

        reply = _message.blocking_request("get_ipynb", timeout_sec=timeout)  # None on timeout
    except Exception:  # any failure of the front end means "not available here"
        return None
    return _from_json(reply["ipynb"]) if isinstance(reply, dict) and isinstance(reply.get("ipynb"), dict) else None


def _candidate_files(assignment: str) -> list[tuple[Path, bool]]:
    """Files that may hold the open notebook, most likely first, each with whether its metadata must name
    `assignment` (any notebook in the working folder, renamed or not, may be the one)."""
    named = [Path(p) for p in (os.environ.get("JPY_SESSION_NAME"), _user_variable("__vsc_ipynb_file__"))
             if isinstance(p, str) and p]
    named += [Path.cwd() / f"{assignment}.ipynb"] + [p for p in KAGGLE_COPIES if p.is_file()]
    others = sorted(Path.cwd().glob("*.ipynb"), key=lambda p: -p.stat().st_mtime)[:20]
    return [(p, False) for p in named] + [(p, True) for p in others if p not in named]


def _user_variable(name: str) -> object:
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        return None
    return shell.user_ns.get(name) if shell is not None else None


def assignment_of(nb: nbformat.NotebookNode) -> str | None:
    """The assignment a notebook says it is (`metadata.tml.assignment`, written by the release)."""
    tml = nb.metadata.get("tml")
    value = tml.get("assignment") if isinstance(tml, dict) else None
    return value if isinstance(value, str) else None


def open_notebook(assignment: str, colab: Callable[[], nbformat.NotebookNode | None] = _colab_notebook
                  ) -> tuple[nbformat.NotebookNode | None, str]:
    """The open notebook of `assignment` and where it came from, or (None, why it was not found)."""
    if platform() == "colab":
        nb = colab()
        if nb is not None and assignment_of(nb) in (assignment, None):
            return nb, "the notebook as Colab's editor holds it now"
    for path, strict in _candidate_files(assignment):
        try:
            nb = nbformat.read(path, as_version=4)
        except (OSError, ValueError):  # not there, not JSON, not a notebook
            continue
        if assignment_of(nb) == assignment or (assignment_of(nb) is None and not strict):
            return nb, f"{path}, as last saved"
    live = _user_variable("In")
    nb = live_notebook(assignment, live) if isinstance(live, list) else None
    if nb is not None:
        return nb, ("the answers this kernel ran last, in the course's copy of the notebook (no copy of yours was "
                    "found to read; cells of your own are left out)")
    return None, (f"found no copy of {assignment} to check: save it, download it and run "
                  f"`python -m labkit.validate {assignment}.ipynb` where the course is installed")


def live_notebook(assignment: str, history: list[str]) -> nbformat.NotebookNode | None:
    """The course's blank copy of `assignment` with each answer cell replaced by the last code this kernel ran that
    defines the same names (`history`: IPython's `In`); None without that copy or without any such code."""
    path = released_notebook(assignment)
    if path is None:
        return None
    nb = nbformat.read(path, as_version=4)
    found = 0
    for cell in nb.cells:
        names = set(cells.defined_names(cell.source, imports=False)) if cells.kind(cell) == cells.ANSWER else set()
        ran = [code for code in history if names and names <= set(cells.defined_names(code, imports=False))]
        if ran:
            cell.source = ran[-1]
            found += 1
    return nb if found else None


def check_open_notebook(assignment: str) -> None:
    """Run the open notebook's visible tests in a fresh kernel, print ✓/✗ per exercise and how to hand it in.
    Returns nothing: a notebook's last cell would show a bare True or False under the verdict."""
    nb, source = open_notebook(assignment)
    if nb is None:
        print(f"– {source}")
        return
    print(f"Checking {source}, in a fresh kernel:")
    with tempfile.TemporaryDirectory(prefix="check-") as folder:
        path = Path(folder) / f"{assignment}.ipynb"
        nbformat.write(nb, path)
        ok = report(path, cwd=Path.cwd())
    where = platform()
    saved = source.removesuffix(", as last saved")
    print(("✓ ready to hand in: " if ok else "Fix the ✗ above, then run this cell again. To hand in: ")
          + DOWNLOAD[where].format(path=saved) + "; any file name will do.")


def released_notebook(assignment: str) -> Path | None:
    """The course's blank copy of `assignment` beside this package: shipped inside it (an installed student
    edition) or in the checkout it lies in (notebook 00)."""
    here = Path(__file__).resolve().parent
    for root in (here / "notebooks", here.parent / "notebooks"):
        if (root / assignment / f"{assignment}.ipynb").is_file():
            return root / assignment / f"{assignment}.ipynb"
    return None


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m labkit.validate NOTEBOOK.ipynb")
    sys.exit(0 if report(sys.argv[1]) else 1)
