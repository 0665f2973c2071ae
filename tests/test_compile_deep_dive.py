"""06's optional torch.compile deep-dive, switched on as a student switches it on, runs without an error.

A module of its own, not beside tests/test_notebooks_execute.py: its cold compiles take a minute or more on 2 cores,
and that module shares a worker with the browser test (tests/conftest.py SHARED_GROUP).
"""

import nbformat
import pytest
from conftest import REPO

from labkit.runner import NotebookRunner


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
