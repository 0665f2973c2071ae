"""The browser test's own rules, without a browser: the student-experience rule, cropped SVGs, bound names."""

import re

import torch

from browser_lab import CellRun, bound_names, is_not_implemented, student_experience_problems, svg_clipping


def test_names_a_cell_binds_at_top_level_only():
    source = ("import torch.nn as nn\nfor i, (a, b) in pairs:\n    c = 1\ndef f():\n    inner = 2\n"
              "with open(p) as fh:\n    pass\n%matplotlib inline\nif (n := 3):\n    pass")
    assert bound_names(source) == {"nn", "i", "a", "b", "c", "f", "fh", "n"}
    assert bound_names("%%writefile x.py\nx = 1") == set()


def test_not_implemented_includes_a_workers_quoted_traceback():
    quoted = ("torchrun exited with status 1; last output:\n[rank 1] [rank1]: Traceback (most recent call last):\n"
              "[rank 1] [rank1]:     raise NotImplementedError()\n[rank 1] [rank1]: NotImplementedError")
    assert is_not_implemented("NotImplementedError", "")
    assert is_not_implemented("LaunchError", quoted)
    assert not is_not_implemented("LaunchError", "torchrun exited with status 1; last output: ValueError: x")
    assert not is_not_implemented("ValueError", "Traceback (most recent call last):\n  raise NotImplementedError()\nValueError")


def test_student_experience_rule():
    nie = [("NotImplementedError", "")]
    cells = [
        CellRun(0, "other", "setup", "x = 1", True),
        CellRun(1, "answer", "f_answer", "def f():\n    raise NotImplementedError()", True),
        CellRun(2, "test", "f", "f()", True, nie),
        CellRun(3, "other", "demo", "lr = f()\nplot(lr)", True, nie),
        CellRun(4, "other", "demo2", "w = lr * 2", True, [("NameError", "name 'lr' is not defined")]),
        CellRun(5, "other", "demo3", "print(w)", True, [("NameError", "name 'w' is not defined")]),
    ]
    assert student_experience_problems(cells) == []
    bad = cells + [
        CellRun(6, "other", "typo", "print(zz)", True, [("NameError", "name 'zz' is not defined")]),
        CellRun(7, "test", "g", "g()", True),
        CellRun(8, "test", "h", "h()", True, [("NameError", "name 'lr' is not defined")]),
        CellRun(9, "other", "late", "1 / 0", False),
    ]
    problems = student_experience_problems(bad)
    assert [re.match(r"cell (\d+)", p).group(1) for p in problems] == ["6", "7", "8", "9"]
    assert student_experience_problems([CellRun(0, "other", "setup", "import torch", True, [("ImportError", "x")])])


def test_a_graphviz_svg_drawn_beyond_its_viewbox_is_cropped():
    from helpers.graphs import require_dot
    try:
        require_dot()
    except RuntimeError:
        import pytest
        pytest.skip("graphviz's dot is not installed")
    from torchviz import make_dot

    w = torch.randn(3, requires_grad=True)
    graph = make_dot(torch.tanh(w @ torch.randn(3)), params={"w": w})
    assert svg_clipping(graph._repr_image_svg_xml()) is None
    graph.graph_attr.update(dpi="110")
    clipped = svg_clipping(graph._repr_image_svg_xml())
    if clipped is None:   # a graphviz that scales the viewBox along with the drawing is fine too
        assert 'viewBox="0.00 0.00 ' in graph._repr_image_svg_xml()
    else:
        assert "crops" in clipped
