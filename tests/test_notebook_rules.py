"""Every notebook states only what its cells print, and runs to the end for a student who has not started.

Rules in tests/notebook_rules.py: numbers in prose are definitions or printed by a cell; a released
notebook with blank answers fails only in its exercise cells, with NotImplementedError.
"""

import pytest
from conftest import REPO, executed
from notebook_rules import blank_run_problems, prose_number_problems

pytestmark = pytest.mark.slow
SOLUTIONS = sorted((REPO / "solutions").glob("*/*.ipynb"))
RELEASED = sorted((REPO / "notebooks").glob("*/*.ipynb"))


@pytest.mark.parametrize("path", SOLUTIONS, ids=[p.stem for p in SOLUTIONS])
def test_numbers_in_prose_are_defined_or_printed(path):
    _, nb = executed(path)
    assert prose_number_problems(nb) == []


@pytest.mark.parametrize("path", RELEASED, ids=[p.stem for p in RELEASED])
def test_a_blank_notebook_runs_to_the_end(path):
    _, nb = executed(path)
    assert blank_run_problems(nb) == []
