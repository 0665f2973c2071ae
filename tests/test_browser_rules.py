"""The browser test's own rules, without a browser: the student-experience rule and cropped SVGs."""

import re

import torch
from browser_lab import CellRun, is_not_implemented, student_experience_problems, svg_clipping


def test_not_implemented_includes_a_workers_quoted_traceback():
    quoted = ("torchrun exited with status 1; last output:\n[rank 1] [rank1]: Traceback (most recent call last):\n"
              "[rank 1] [rank1]:     raise NotImplementedError()\n[rank 1] [rank1]: NotImplementedError")
    assert is_not_implemented("NotImplementedError", "")
    assert is_not_implemented("LaunchError", quoted)
    assert not is_not_implemented("LaunchError", "torchrun exited with status 1; last output: ValueError: x")
    assert not is_not_implemented("ValueError", "Traceback (most recent call last):\n  raise NotImplementedError()\nValueError")


def test_student_experience_rule():
    nie = [("NotImplementedError", "")]
    named = [("ExerciseNotAnswered", "exercise 1 (`f`) is not answered yet: …")]
    cells = [
        CellRun(0, "other", "setup", "x = 1", True),
        CellRun(1, "answer", "f_answer", "def f():\n    raise NotImplementedError()", True),
        CellRun(2, "test", "f", "with exercise_test(1, 'f'):\n    f()", True, named),
        CellRun(3, "other", "demo", "with needs_exercise(1, 'f'):\n    plot(f())", True),
    ]
    assert student_experience_problems(cells) == []
    bad = cells + [
        CellRun(4, "other", "demo2", "lr = f()", True, nie),  # should say "finish exercise 1 first"
        CellRun(5, "other", "typo", "print(zz)", True, [("NameError", "name 'zz' is not defined")]),
        CellRun(6, "test", "g", "g()", True),
        CellRun(7, "test", "h", "h()", True, [("NameError", "name 'lr' is not defined")]),
        CellRun(8, "other", "late", "1 / 0", False),
        CellRun(9, "test", "k", "k()", True, nie),  # a bare NotImplementedError shows a traceback: not named
    ]
    problems = student_experience_problems(bad)
    assert [re.match(r"cell (\d+)", p).group(1) for p in problems] == ["4", "5", "6", "7", "8", "9"]
    assert student_experience_problems([CellRun(0, "other", "setup", "import torch", True, [("ImportError", "x")])])


SVG = ('<svg width="{w}pt" height="{h}pt" viewBox="0.00 0.00 {w}.00 {h}.00" xmlns="http://www.w3.org/2000/svg">'
       '<g id="graph0" class="graph" transform="scale({s} {s}) rotate(0) translate(4 {t})"></g></svg>')


def test_a_graphviz_svg_drawn_beyond_its_viewbox_is_cropped():
    # graphviz 2.42 with dpi=110: the drawing is scaled by 110/72 but the viewBox stays at the 72-dpi size.
    assert svg_clipping(SVG.format(w=120, h=200, s=1, t=196)) is None
    assert "crops" in svg_clipping(SVG.format(w=120, h=200, s=round(110 / 72, 4), t=196))
    assert svg_clipping("<svg viewBox='0 0 10 10'></svg>") is None  # not graphviz's layout: nothing to say


def test_torchviz_drawings_fit_their_viewbox():
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
