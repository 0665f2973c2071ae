"""Every solution notebook runs top to bottom on CPU without an error."""

import os
import time

import nbformat
import pytest
from nbclient import NotebookClient

from conftest import REPO

SOLUTIONS = sorted((REPO / "solutions").glob("*/*.ipynb"))


@pytest.mark.slow
@pytest.mark.parametrize("path", SOLUTIONS, ids=[p.stem for p in SOLUTIONS])
def test_solution_notebook_runs_top_to_bottom(path):
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    errors = [
        f"cell {i} ({c.metadata.get('nbgrader', {}).get('grade_id', '?')}): {o.ename}: {o.evalue}"
        for i, c in enumerate(nb.cells) if c.cell_type == "code"
        for o in c.outputs if o.output_type == "error"
    ]
    assert not errors, "\n".join(errors)
    print(f"{path.stem}: {time.perf_counter() - start:.1f} s")
