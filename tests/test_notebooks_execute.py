"""Every solution notebook runs top to bottom on CPU without an error."""

import nbformat
import pytest
from conftest import REPO, execute_solution

from labkit.runner import NotebookRunner

SOLUTIONS = sorted((REPO / "solutions").glob("*/*.ipynb"))


@pytest.mark.slow
@pytest.mark.parametrize("path", SOLUTIONS, ids=[p.stem for p in SOLUTIONS])
def test_solution_notebook_runs_top_to_bottom(path):
    seconds, errors = execute_solution(path)
    assert not errors, "\n".join(errors)
    print(f"{path.stem}: {seconds:.1f} s")


@pytest.mark.slow
def test_the_compile_deep_dive_runs_when_switched_on(monkeypatch):
    """06's torch.compile cell is off on every machine unless TML_COMPILE=1: run it the way a student switches it on."""
    path = REPO / "solutions" / "06_mixed_precision" / "06_mixed_precision.ipynb"
    nb = nbformat.read(path, as_version=4)
    monkeypatch.setenv("TML_COMPILE", "1")  # the kernel inherits it, as after `%env TML_COMPILE=1`
    NotebookRunner(nb, timeout=300, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    errors = [f"cell {i}: {o.ename}: {o.evalue}" for i, c in enumerate(nb.cells) if c.cell_type == "code"
              for o in c.outputs if o.output_type == "error"]
    assert not errors, "\n".join(errors)
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "claim_compile")
    text = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
    assert "SKIPPED" not in text and "Verdict (hook)" in text and "Verdict (clipping)" in text, text
