"""Pre-submission check: run a notebook's visible tests and say which exercises fail (notebook 00).

`python -m helpers.validate NOTEBOOK` (or `./course validate NOTEBOOK`) exits 1 when any test cell
fails — unlike `nbgrader validate`, whose exit code is 0 either way.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient


def validate_notebook(path: str | Path, timeout: int = 120) -> dict[str, str]:
    """Execute a notebook (demo cells skipped); returns test grade_id → "" when it passed, else the error (notebook 00)."""
    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, allow_errors=True, kernel_name="python3",
                            skip_cells_with_tag="demo", resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    results = {}
    for cell in nb.cells:
        info = cell.metadata.get("nbgrader", {})
        if cell.cell_type != "code" or not info.get("grade"):
            continue
        errors = [o for o in cell.outputs if o.output_type == "error"]
        if not errors:
            results[info["grade_id"]] = ""
        elif errors[0].ename == "NotImplementedError":
            results[info["grade_id"]] = "not answered yet (the answer cell still raises NotImplementedError)"
        else:
            results[info["grade_id"]] = f"{errors[0].ename}: {errors[0].evalue}"
    return results


def report(path: str | Path) -> bool:
    """Print ✓/✗ per exercise of a notebook; True when every visible test passes (notebook 00)."""
    results = validate_notebook(path)
    for exercise, problem in results.items():
        print(f"{'✓' if not problem else '✗'} {exercise}" + (f": {problem}" if problem else ""))
    passed = not any(results.values())
    print(f"{Path(path).name}: {'all visible tests pass' if passed else 'some visible tests fail'}"
          + ("" if results else " (no graded exercises)"))
    return passed


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m helpers.validate NOTEBOOK.ipynb")
    sys.exit(0 if report(sys.argv[1]) else 1)
