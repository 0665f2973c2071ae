"""labkit.validate: one line per exercise; an unanswered exercise fails a submission check, not the set-up check."""

import nbformat
from nbformat.v4 import new_code_cell, new_notebook

from labkit import validate


def grade_cell(source, grade_id, tags=()):
    cell = new_code_cell(source)
    cell.metadata["nbgrader"] = {"grade": True, "grade_id": grade_id, "locked": True, "points": 1,
                                 "schema_version": 3, "solution": False, "task": False}
    cell.metadata["tags"] = list(tags)
    return cell


def test_validate_notebook_runs_tests_and_skips_demo_and_claim_cells(tmp_path):
    demo, claim = new_code_cell("raise RuntimeError('a demo')"), new_code_cell("passes = False")
    for cell, tag in ((demo, "demo"), (claim, "claim")):  # read-only cells, as the course's demos and claims are
        cell.metadata.update(tags=[tag], nbgrader={"grade": False, "solution": False, "locked": True, "grade_id": tag})
    nb = new_notebook(cells=[
        new_code_cell("passes = True"), demo, claim,
        grade_cell("assert passes", "good"),
        grade_cell("raise NotImplementedError()", "blank"),
        grade_cell("assert 1 == 2, 'off by one'", "wrong"),
    ])
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)
    results = validate.validate_notebook(path)
    assert results["good"] == "" and results["blank"].startswith("not answered yet")
    assert results["wrong"] == "AssertionError: off by one"


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
    canned["wrong"] = "AssertionError: off by one"
    assert validate.report("nb.ipynb", unanswered_ok=True) is False
    assert "✗ wrong: AssertionError" in capsys.readouterr().out
