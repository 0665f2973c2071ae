"""autograde's first run of a new course version records the reference runs (about a minute): a progress bar says so
from the start and counts the assignments recorded; a quiet run (progress off) prints nothing. The recording itself is
faked here."""

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
    if progress:   # tqdm's bar on stderr: shown before the first assignment is done, then 1 of 1
        assert "new course version: recording reference runs:   0%" in err and "1/1" in err
    else:
        assert err == ""
