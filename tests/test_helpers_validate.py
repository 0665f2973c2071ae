"""labkit.validate: one line per exercise; an unanswered exercise fails a submission check, not the set-up check."""

import sys

import nbformat
import pytest
from factories import graded_cell, notebook, own_cell, read_only

from labkit import validate


@pytest.mark.integration  # starts a kernel
def test_validate_notebook_runs_tests_and_skips_demo_and_claim_cells(tmp_path, monkeypatch):
    # a `python3` kernelspec that names another program (a hub's, a user's): the check must not start it
    decoy = tmp_path / "jupyter" / "kernels" / "python3"
    decoy.mkdir(parents=True)
    (decoy / "kernel.json").write_text('{"argv": ["/bin/false", "{connection_file}"], "display_name": "decoy", '
                                       '"language": "python"}')
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    nb = notebook(
        own_cell("passes = True"),
        read_only("demo", "raise RuntimeError('a demo')", tags=("demo",)),  # read-only, as the course's demos are
        read_only("claim", "passes = False", tags=("claim",)),
        graded_cell("good", "assert passes", points=1),
        graded_cell("blank", "raise NotImplementedError()", points=1),
        graded_cell("wrong", "assert 1 == 2, 'off by one'", points=1),
        graded_cell("waiting", "from helpers.checks import earlier_exercise\n"
                    "with earlier_exercise(1, 'mse_grad'):\n    raise NotImplementedError()", points=1),
        graded_cell("same_python", "import sys\nassert sys.executable == " + repr(sys.executable), points=1),
    )
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)
    results = validate.validate_notebook(path)
    assert results["good"] == "" and results["blank"].startswith("not answered yet")
    assert results["wrong"] == "AssertionError: off by one"
    assert results["waiting"].startswith(validate.WAITING + ": exercise 1 (`mse_grad`) is not written yet")
    assert results["same_python"] == "", "the check's fresh kernel runs this Python, not the python3 kernelspec's"


def test_report_marks(monkeypatch, capsys):
    canned = {"good": "", "blank": "not answered yet (the answer cell still raises NotImplementedError)"}
    monkeypatch.setattr(validate, "validate_notebook", lambda path, **_: dict(canned))
    assert validate.report("nb.ipynb") is False  # before submitting, an unanswered exercise is a failure
    out = capsys.readouterr().out
    assert "✓ good" in out and "✗ blank: not answered yet" in out and "some visible tests fail" in out
    assert validate.report("nb.ipynb", unanswered_ok=True) is True
    out = capsys.readouterr().out
    assert "– blank: not answered yet" in out and "✗" not in out
    assert "1 of 2 exercises answered; every answered one passes" in out
    canned["good"] = canned["blank"]
    assert validate.report("nb.ipynb", unanswered_ok=True) is True
    assert "0 of 2 exercises answered\n" in capsys.readouterr().out
    canned["waits"] = "waits for an earlier exercise: exercise 1 (`mse_grad`) is not written yet — finish it first"
    assert validate.report("nb.ipynb", unanswered_ok=True) is True  # 00 on a blank 01: no ✗
    out = capsys.readouterr().out
    assert "– waits: waits for an earlier exercise" in out and "✗" not in out and "0 of 3 exercises answered" in out
    assert validate.report("nb.ipynb") is False and "✗ waits" in capsys.readouterr().out
    canned["wrong"] = "AssertionError: off by one"
    assert validate.report("nb.ipynb", unanswered_ok=True) is False
    assert "✗ wrong: AssertionError" in capsys.readouterr().out


def test_report_lists_written_answers_as_graded_by_hand(monkeypatch, capsys, tmp_path):
    """A written answer is no exercise the check can pass or fail: it is listed as graded by hand, written or not."""
    monkeypatch.setattr(validate, "validate_notebook", lambda path, **_: {"mse_grad": ""})
    nb = _released("01_gradient_descent")
    written = [c for c in nb.cells if validate.cells.kind(c) == validate.cells.WRITTEN]
    assert len(written) == 1
    nbformat.write(nb, tmp_path / "blank.ipynb")
    written[0].source = "The step is too large for the curvature here."
    nbformat.write(nb, tmp_path / "written.ipynb")
    grade_id = validate.cells.grade_id(written[0])
    assert validate.report(tmp_path / "blank.ipynb") is True
    assert f"– {grade_id}: graded by hand — not answered yet" in capsys.readouterr().out
    assert validate.report(tmp_path / "written.ipynb") is True
    assert f"✎ {grade_id}: graded by hand — written; your instructor grades it" in capsys.readouterr().out


def _released(name):
    from grader.course import assignment_named

    return nbformat.read(assignment_named(name).release, as_version=4)


def test_the_open_notebook_comes_from_colab_then_the_disk_never_from_another_assignment(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for variable in ("JPY_SESSION_NAME", "KAGGLE_KERNEL_RUN_TYPE"):
        monkeypatch.delenv(variable, raising=False)
    one, two = _released("01_gradient_descent"), _released("02_autograd_graph")
    monkeypatch.setenv("COLAB_RELEASE_TAG", "test")
    nb, source = validate.open_notebook("01_gradient_descent", colab=lambda: one)
    assert nb is one and "Colab's editor" in source
    nbformat.write(two, tmp_path / "02_autograd_graph.ipynb")  # another assignment's, in the same folder
    assert validate.open_notebook("01_gradient_descent", colab=lambda: two)[0] is None
    nbformat.write(one, tmp_path / "Copy of 01_gradient_descent.ipynb")  # renamed by a download: its metadata says 01
    nb, source = validate.open_notebook("01_gradient_descent", colab=lambda: None)
    assert validate.assignment_of(nb) == "01_gradient_descent"
    assert source.endswith("Copy of 01_gradient_descent.ipynb, as last saved")
    monkeypatch.delenv("COLAB_RELEASE_TAG")
    assert validate.platform() == "jupyter"


def test_the_live_kernel_answers_fill_the_course_copy():
    from grader.author.mutants import reference_answers
    from grader.course import assignment_named

    answers = reference_answers(assignment_named("01_gradient_descent"))
    history = ["", "import torch", *answers.values(), "def mse_grad(w, X, y):\n    return 0  # a later experiment"]
    nb = validate.live_notebook("01_gradient_descent", history)
    got = {validate.cells.grade_id(c): c.source for c in nb.cells if validate.cells.kind(c) == validate.cells.ANSWER}
    assert got.keys() == answers.keys()
    assert [got[k] == answers[k] for k in answers].count(False) == 1  # the last definition of mse_grad wins
    assert any(source.endswith("a later experiment") for source in got.values())
    assert validate.live_notebook("01_gradient_descent", ["x = 1"]) is None
