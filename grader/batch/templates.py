"""nbgrader's release and gradebook that grading works from, generated once per version and shared by every run."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from grader.author.release import generate
from grader.course import Assignment
from grader.paths import BUILD, PYPROJECT

TEMPLATES = BUILD / "grading-templates"


def grading_template(chosen: list[Assignment]) -> Path:
    """nbgrader's release and gradebook for `chosen`, generated once per version of their sources.

    Kept under build/grading-templates/<hash>, shared by every grading run (workers only read it).
    """
    from grader.author import bootstrap, release

    digest = hashlib.sha256(release.NBGRADER_CONFIG.read_bytes())
    # The release puts grader/author/bootstrap.py's header (made from pyproject.toml) into every student notebook.
    for made_from in (Path(bootstrap.__file__), PYPROJECT):
        digest.update(made_from.read_bytes())
    for assignment in chosen:
        digest.update(assignment.name.encode() + assignment.source.read_bytes())
    folder = TEMPLATES / digest.hexdigest()[:16]
    for stale in TEMPLATES.glob("partial-*-*"):  # left by a run that was killed while it generated
        pid = stale.name.split("-")[1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(stale, ignore_errors=True)
    if not folder.exists():
        TEMPLATES.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=f"partial-{os.getpid()}-", dir=TEMPLATES))
        generate(partial, chosen)
        try:
            partial.rename(folder)
        except OSError:  # another run made it first
            shutil.rmtree(partial, ignore_errors=True)
    return folder
