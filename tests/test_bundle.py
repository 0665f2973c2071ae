"""What students receive holds no solution, hidden test or mutant."""

import subprocess

import pytest
from conftest import PYTHON, REPO

from grader.author.bundle import bundle, bundle_leaks


@pytest.mark.integration  # the CLI
def test_student_bundle_holds_no_solution(tmp_path):
    files = bundle(tmp_path / "bundle")
    names = {p.relative_to(tmp_path / "bundle").parts[0] for p in files}
    assert names == {"notebooks", "helpers", "labkit", "course", "requirements.txt", "environment.yml", "pyproject.toml",
                     "README.md"}
    assert bundle_leaks(tmp_path / "bundle") == []
    run = subprocess.run([PYTHON, "-m", "grader", "bundle", str(tmp_path / "second")], cwd=REPO,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout
