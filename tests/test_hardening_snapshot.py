"""Issue 36 item 5: a cell below a test changes nothing for it — a module-level dict an answer reads included.

Each test's place keeps the notebook's names with plain data (dicts, lists, sets, tuples of numbers, strings and
such, up to places.MAX_COPIED_ITEMS items) copied deep; other objects are shared, as README says.
"""

import sys

import nbformat
import pytest
import torch
from factories import own_cell

from grader.author.mutants import reference_submission
from grader.course import assignment_named
from grader.judge.rebuild import ADDED, rebuild
from grader.kernel import harness, places, probe


@pytest.fixture
def place(monkeypatch):
    """The names a test's place keeps of `names` (position_code, run here as the kernel runs it)."""
    monkeypatch.delitem(sys.modules, probe.STATE, raising=False)

    def kept(names: dict) -> dict:
        exec(harness.position_code("t"), names)
        return sys.modules[probe.STATE].positions["t"][0]

    return kept


def test_plain_data_is_copied_deep_and_aliases_stay_one_object(place):
    config = {"scale": 2.0, "steps": [1, 2], "tags": {"a"}, "pair": ([1], "x")}
    weights = torch.zeros(2)
    names = {"CONFIG": config, "ALIAS": config, "weights": weights, "mixed": {"w": weights}}
    kept = place(names)
    config["scale"], config["steps"][0] = 3.0, 9
    config["tags"].add("b")
    config["pair"][0].append(2)
    assert kept["CONFIG"] == {"scale": 2.0, "steps": [1, 2], "tags": {"a"}, "pair": ([1], "x")}
    assert kept["ALIAS"] is kept["CONFIG"]
    assert kept["weights"] is weights and kept["mixed"] is names["mixed"]  # not plain data: the same object


def test_plain_data_beyond_the_budget_is_shared(place):
    big = list(range(places.MAX_COPIED_ITEMS + 1))
    small = [1, 2]
    kept = place({"big": big, "small": small})
    assert kept["big"] is big and kept["small"] == small and kept["small"] is not small


@pytest.mark.integration  # grades notebook 01 in a kernel
def test_a_dict_an_answer_reads_changed_by_a_cell_below_the_tests_costs_nothing():
    from grader.judge.grading import grade_notebook, plain_kernel_factory, reference_records

    one = assignment_named("01_gradient_descent")
    nb, _ = rebuild(reference_submission(one), nbformat.read(one.release, as_version=4))
    at = next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == "mse_grad_answer")
    nb.cells[at].source = ("SETTINGS = {'factor': 2.0}\n\n"
                           "def mse_grad(w, X, y):\n    return SETTINGS['factor'] / X.shape[0] * X.T @ (X @ w - y)")
    nb.cells.append(own_cell("SETTINGS['factor'] = 3.0  # trying something out", **{ADDED: True}))
    graded = grade_notebook(nb, one, plain_kernel_factory(), 30, reference_records(one, plain_kernel_factory(), 120))
    assert graded.verdicts["mse_grad"].passed, graded.verdicts["mse_grad"].message
