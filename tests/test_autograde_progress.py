"""autograde's first run of a new course version records the reference runs (about a minute): it says so first, then
one line per assignment recorded; a quiet run (progress off) prints nothing. The recording itself is faked here."""

from types import SimpleNamespace

import pytest

from grader.batch import autograde
from grader.course import assignment_named
from grader.judge import grading


@pytest.mark.parametrize("progress", [True, False])
def test_recording_the_reference_runs_is_announced(tmp_path, monkeypatch, capsys, progress):
    recorded = []
    monkeypatch.setattr(autograde, "records_path", lambda assignment, released, kind="": tmp_path / "missing.json")
    monkeypatch.setattr(grading, "plain_kernel_factory", lambda env: None)
    monkeypatch.setattr(grading, "reference_records", lambda assignment, kernels, timeout: recorded.append(assignment.name))
    monkeypatch.setattr(grading, "known_mistakes", lambda assignment, kernels, timeout, jobs: None)
    a = assignment_named("01")
    run = SimpleNamespace(known={a.name: a}, env={"OMP_NUM_THREADS": "1"}, sandboxed=False, jobs=1, timeout=30)
    autograde._prepare(run, [a.name], progress)
    err = capsys.readouterr().err
    assert recorded == [a.name]
    if progress:
        first, done = err.splitlines()
        assert "recording the reference runs" in first and a.name in first
        assert done.startswith(f"  {a.name}: recorded in ")
    else:
        assert err == ""
