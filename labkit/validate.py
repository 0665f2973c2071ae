"""Pre-submission check: run a notebook's visible tests and say which exercises fail.

`python -m labkit.validate NOTEBOOK` (or `./course validate NOTEBOOK`) exits 1 unless every exercise is
answered and passes its visible test — unlike `nbgrader validate`, whose exit code is 0 either way.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import nbformat
from jupyter_client.manager import AsyncKernelManager

from labkit import cells
from labkit.runner import NotebookRunner

NOT_ANSWERED = "not answered yet"


def validate_notebook(path: str | Path, timeout: int = 120) -> dict[str, str]:
    """Execute a notebook (demo and claim cells skipped); returns test grade_id → "" when it passed,
    else the error (notebook 00)."""
    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    nb.cells = [c for c in nb.cells if cells.kind(c) not in cells.SKIPPED]  # as grading skips them
    # A kernel on ipc sockets in a private folder: over TCP, ipykernel warns on its stderr (which a kernel
    # started from a notebook cell shares with that notebook) that the channel is not encrypted.
    with tempfile.TemporaryDirectory(prefix="validate-") as work:
        manager = AsyncKernelManager(kernel_name="python3", transport="ipc", ip=os.path.join(work, "kernel"))
        manager.connection_file = os.path.join(work, "connection.json")
        client = NotebookRunner(nb, km=manager, timeout=timeout, allow_errors=True, kernel_name="python3",
                                resources={"metadata": {"path": str(path.parent)}})
        client.execute(cleanup_kc=True)  # nbclient keeps alive a kernel whose manager it was handed
    results = {}
    for cell in nb.cells:
        if cells.kind(cell) != cells.TEST:
            continue
        info = cells.nbgrader(cell)
        errors = [o for o in cell.outputs if o.output_type == "error"]
        if not errors:
            results[info["grade_id"]] = ""
        elif errors[0].ename == "NotImplementedError":
            results[info["grade_id"]] = f"{NOT_ANSWERED} (the answer cell still raises NotImplementedError)"
        else:
            results[info["grade_id"]] = f"{errors[0].ename}: {errors[0].evalue}"
    return results


def report(path: str | Path, *, unanswered_ok: bool = False) -> bool:
    """Print ✓/✗ per exercise of a notebook; True when every visible test passes (notebook 00).

    Before you submit, an exercise not answered yet is a ✗ like any failure. With `unanswered_ok=True`
    (notebook 00 checks the tool on a notebook you have not started) it is marked – and is not a failure:
    True when every answered exercise passes.
    """
    results = validate_notebook(path)
    unanswered = {name for name, problem in results.items() if problem.startswith(NOT_ANSWERED)}
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
    return not failed


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m labkit.validate NOTEBOOK.ipynb")
    sys.exit(0 if report(sys.argv[1]) else 1)
