"""No function or class a student can see earns an exercise's points when handed in as its answer.

Apart from tests/test_grading.py so that pytest-xdist (`--dist loadfile`) runs it beside the self-test class.
"""

import pytest

from grader.author.cribs import crib_problems
from grader.course import assignments
from grader.judge.grading import plain_kernel_factory, reference_records

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("assignment", [a for a in assignments() if a.grade_cells()], ids=lambda a: a.name)
def test_no_visible_function_earns_an_exercise(assignment):
    kernels = plain_kernel_factory()
    assert crib_problems(assignment, kernels, 60, reference_records(assignment, kernels, 120)) == []
