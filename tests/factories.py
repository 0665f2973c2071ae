"""Builders the tests share: nbgrader cells and notebooks in memory, and hypothesis strategies.

Not a test module. A cell is built the way the course's notebooks carry it (CONTRIBUTING.md): an answer
cell, a test cell, a read-only cell (tagged `demo` or `claim` when it is one), or a cell of the student's own.
"""

import copy

import nbformat
from hypothesis import strategies as st

BLANK_ANSWER = "def f(x):\n    raise NotImplementedError()"


def answer(grade_id: str, source: str = BLANK_ANSWER) -> nbformat.NotebookNode:
    """An answer cell (`<exercise>_answer`): solution, not graded, editable."""
    return nbformat.v4.new_code_cell(source, metadata={"nbgrader": {
        "grade": False, "solution": True, "locked": False, "grade_id": grade_id}})


def graded_cell(grade_id: str, source: str = "assert f(1) == 2", points: int = 2, tags: tuple[str, ...] = ()
                ) -> nbformat.NotebookNode:
    """A test cell: graded, locked, worth `points`."""
    metadata: dict = {"nbgrader": {"grade": True, "solution": False, "locked": True, "points": points,
                                   "grade_id": grade_id}}
    if tags:
        metadata["tags"] = list(tags)
    return nbformat.v4.new_code_cell(source, metadata=metadata)


def read_only(grade_id: str, source: str = "import torch", tags: tuple[str, ...] = ()) -> nbformat.NotebookNode:
    """A locked cell that is neither an answer nor a test: set-up, or a demo or claim cell with its tag."""
    return nbformat.v4.new_code_cell(source, metadata={"tags": list(tags), "nbgrader": {
        "grade": False, "solution": False, "locked": True, "grade_id": grade_id}})


def own_cell(source: str, **metadata: object) -> nbformat.NotebookNode:
    """A code cell the student added: no nbgrader metadata (unless `metadata` says otherwise)."""
    return nbformat.v4.new_code_cell(source, metadata=metadata)


def markdown(source: str, **metadata: object) -> nbformat.NotebookNode:
    return nbformat.v4.new_markdown_cell(source, metadata=metadata)


def notebook(*cells: nbformat.NotebookNode) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = list(cells)
    return nb


# A release with one exercise: set-up, its markdown, the blank answer, the test.
RELEASED = notebook(read_only("setup"), markdown("# Exercise"), answer("f_answer"), graded_cell("f"))


def released() -> nbformat.NotebookNode:
    """A fresh copy of RELEASED (cell ids kept, as a student's saved copy keeps them)."""
    return copy.deepcopy(RELEASED)


# --- hypothesis strategies ------------------------------------------------------------------------------------

# What a scenario may send back as plain data: None, bools, ints beyond 64 bits, floats, text, nested sequences.
scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**30, 10**30), st.floats(allow_nan=False),
                    st.text(max_size=20))
plain_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4), st.tuples(inner, inner)),
                            max_leaves=8)
# Small tensor shapes, and the factors a wrong answer is typically off by.
tensor_shapes = st.lists(st.integers(1, 5), min_size=1, max_size=3)
wrong_factors = st.sampled_from([-1.0, 0.5, 2.0, 3.0, -4.0, 10.0])
seeds = st.integers(0, 10_000)
