"""Every solution notebook runs top to bottom on CPU without an error."""

import pytest
from conftest import REPO, execute_solution

SOLUTIONS = sorted((REPO / "solutions").glob("*/*.ipynb"))


@pytest.mark.slow
@pytest.mark.parametrize("path", SOLUTIONS, ids=[p.stem for p in SOLUTIONS])
def test_solution_notebook_runs_top_to_bottom(path):
    seconds, errors = execute_solution(path)
    assert not errors, "\n".join(errors)
    print(f"{path.stem}: {seconds:.1f} s")
