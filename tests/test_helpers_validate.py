"""labkit.validate: one line per exercise; an unanswered exercise fails a submission check, not the set-up check."""

import nbformat
import pytest
from factories import graded_cell, notebook, own_cell, read_only

from labkit import validate


@pytest.mark.integration  # starts a kernel
def test_validate_notebook_runs_tests_and_skips_demo_and_claim_cells(tmp_path):
    nb = notebook(
        own_cell("passes = True"),
        read_only("demo", "raise RuntimeError('a demo')", tags=("demo",)),  # read-only, as the course's demos are
        read_only("claim", "passes = False", tags=("claim",)),
        graded_cell("good", "assert passes", points=1),
        graded_cell("blank", "raise NotImplementedError()", points=1),
        graded_cell("wrong", "assert 1 == 2, 'off by one'", points=1),
    )
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)
    results = validate.validate_notebook(path)
    assert results["good"] == "" and results["blank"].startswith("not answered yet")
    assert results["wrong"] == "AssertionError: off by one"


def test_report_marks(monkeypatch, capsys):
    canned = {"good": "", "blank": "not answered yet (the answer cell still raises NotImplementedError)"}
    monkeypatch.setattr(validate, "validate_notebook", lambda path: dict(canned))
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
    canned["wrong"] = "AssertionError: off by one"
    assert validate.report("nb.ipynb", unanswered_ok=True) is False
    assert "✗ wrong: AssertionError" in capsys.readouterr().out
