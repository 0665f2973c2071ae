"""Every notebook states only what its cells print.

The rule in tests/notebook_rules.py: a number in prose is a definition or printed by a cell. (That a released
notebook with blank answers runs to the end, failing only in its exercise cells, is checked where a student
meets it: tests/test_browser_released.py runs every released notebook in JupyterLab,
browser_lab.student_experience_problems.)
"""

import pytest
from conftest import REPO, executed
from notebook_rules import prose_number_problems

pytestmark = pytest.mark.slow
SOLUTIONS = sorted((REPO / "solutions").glob("*/*.ipynb"))


@pytest.mark.parametrize("path", SOLUTIONS, ids=[p.stem for p in SOLUTIONS])
def test_numbers_in_prose_are_defined_or_printed(path):
    _, nb = executed(path)
    assert prose_number_problems(nb) == []
