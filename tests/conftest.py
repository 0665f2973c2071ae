"""Shared paths and grading helpers for the test suite."""

import csv
import functools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

# the fast tier's guard: hooks around every test's set-up and call (tests/fast_tier.py)
from fast_tier import pytest_runtest_call, pytest_runtest_setup  # noqa: F401

from labkit.runner import NotebookRunner

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
# `./course test` runs the suite on every core (pytest-xdist, `--dist loadfile`): the tests of one file run in one
# worker, so a module's costly fixtures (a graded class, a JupyterLab server, a fork server) are built once, and
# the files that share conftest.executed's one run of every solution notebook form one group (the scheduler
# below). Groups go out longest first, so that no long one starts last; the order follows a measured run, except
# that the Colab- and Kaggle-like tests wait until their environments have had a few minutes to build in the
# background (below): started first, they held a worker idle for three minutes.
SHARED_GROUP = {"test_notebooks_execute.py": "solutions", "test_notebook_rules.py": "solutions",
                "test_browser.py": "solutions"}
LONGEST_FIRST = ["test_grading.py", "solutions", "test_browser_released.py", "test_class.py", "test_sandbox.py",
                 "test_colab_like.py", "test_kaggle_like.py", "test_edition.py", "test_gradescope.py",
                 "test_batch_stops.py", "test_compile_deep_dive.py", "test_helpers_distributed.py", "test_shards.py",
                 "test_slurm.py", "test_report.py", "test_gpu_check.py", "test_collection.py", "test_overrides.py",
                 "test_outflow.py", "test_grader_core.py", "test_feedback_browser.py"]


def _file(nodeid: str) -> str:
    return nodeid.split("::", 1)[0].rsplit("/", 1)[-1]


def _group(nodeid: str) -> str:
    return SHARED_GROUP.get(_file(nodeid), _file(nodeid))


def pytest_collection_modifyitems(config, items):
    def rank(item) -> int:
        group = _group(item.nodeid)
        return LONGEST_FIRST.index(group) if group in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: within a group, and among the short ones, the collection's order


def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile` whose files in SHARED_GROUP go to one worker together (xdist's own `loadgroup` reads
    groups from test ids it can no longer change under pytest 9)."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FileGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid)

    return FileGroups(config, log)



# The runtime tests' base environments (tests/colab_like.py: a CUDA build of torch each, about 5 and 7 GB) take a
# minute or two each to build on a fresh machine, nearly all of it downloading from the registry. A run that will
# use them starts building them in one background process as soon as its tests are collected, so that the download
# overlaps the other tests instead of adding to the run; the runtime test then finds its environment built, or
# waits on the build's lock. Built ones are reused (a no-op here); the build is stopped when the run ends.
RUNTIME_TESTS = {"test_colab_like.py": "colab", "test_kaggle_like.py": "kaggle"}  # in the order they are needed
_building: list[subprocess.Popen] = []


def _build_runtimes_for(nodeids) -> None:
    wanted = {RUNTIME_TESTS[_file(n)] for n in nodeids if _file(n) in RUNTIME_TESTS}
    if not wanted or _building:
        return
    log = REPO / "build" / "runtime-environments.log"
    log.parent.mkdir(exist_ok=True)
    with open(log, "a") as out:
        _building.append(subprocess.Popen(
            [sys.executable, str(REPO / "tests" / "colab_like.py"), *(n for n in RUNTIME_TESTS.values() if n in wanted)],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True))


def pytest_collection_finish(session):
    # without xdist; under xdist its controller does it (below)
    if not hasattr(session.config, "workerinput") and not session.config.option.collectonly:
        _build_runtimes_for(item.nodeid for item in session.items)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    if not node.config.option.collectonly:
        _build_runtimes_for(ids)


def pytest_sessionfinish(session):
    for process in _building:
        if process.poll() is None:  # its pip too: the build runs in a process group of its own
            os.killpg(process.pid, signal.SIGTERM)
            process.wait()

def autograde(submissions, out, *extra, check=True):
    """Run `python -m grader autograde` as an instructor would; unless `check` is False it must exit 0."""
    run = subprocess.run([PYTHON, "-m", "grader", "autograde", str(submissions), "--out", str(out), *extra],
                         cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 0 or not check, run.stdout + run.stderr
    return run


def read_rows(out):
    """A graded class as (student, assignment) → (points, status, message and known mistake per failed exercise).

    Points (of the autograded tests; written answers are graded by hand) and status come from grades.csv (what the
    instructor gets); the rest from results.json.
    """
    with open(out / "grades.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    details = {(r["student"], r["assignment"]): r for r in json.loads((out / "results.json").read_text())}
    fixed = {"student", "assignment", "total", "max_total", "late_by", "penalty", "status"}
    written = {k for r in details.values() for k in r.get("by_hand_max", {})}
    return {
        (r["student"], r["assignment"]): ({k: float(v) for k, v in r.items() if k not in fixed | written and v != ""},
                                          r["status"],
                                          details.get((r["student"], r["assignment"]), {}).get("messages", {}),
                                          details.get((r["student"], r["assignment"]), {}).get("mistakes", {}))
        for r in rows
    }


CHROMIUM = Path("/usr/bin/chromium")


def require_chromium() -> None:
    """Skip a browser test where Debian's chromium is missing, saying why — and fail it in CI (CI=true)."""
    if not CHROMIUM.exists():
        message = f"{CHROMIUM} is missing: `./course setup` installs Debian's chromium (apt-get install chromium)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


def shown_lines(page: str) -> set[str]:
    """The text lines a feedback page shows (tags dropped, entities decoded), stripped."""
    import html
    import re

    return {line.strip() for line in html.unescape(re.sub(r"<[^>]+>", "\n", page)).splitlines() if line.strip()}


def artifacts(kind: str) -> Path:
    """test-artifacts/<kind>/, created: where a test leaves what a person may want to look at (screenshots, timings)."""
    folder = REPO / "test-artifacts" / kind
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _save_cell_timings(stem: str, nb, started_at: float, seconds: float) -> None:
    """test-artifacts/nbclient/<stem>.json: when each cell started and got its reply, in seconds from the start.

    nbclient records the kernel's timestamps in each cell's metadata; kept so that a slow run shows where it waited.
    """
    from datetime import datetime

    def offset(stamp):
        return round(datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() - started_at, 2) if stamp else None

    cells = [{"index": i, "grade_id": c.metadata.get("nbgrader", {}).get("grade_id"),
              "input": offset(c.metadata.get("execution", {}).get("iopub.execute_input")),
              "reply": offset(c.metadata.get("execution", {}).get("shell.execute_reply"))}
             for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    (artifacts("nbclient") / f"{stem}.json").write_text(json.dumps({"seconds": round(seconds, 2), "cells": cells}, indent=1))


@functools.cache
def executed(path: Path) -> tuple[float, nbformat.NotebookNode]:
    """A notebook run top to bottom with nbclient, once per test session: (seconds, the executed notebook)."""
    nb = nbformat.read(path, as_version=4)
    start, started_at = time.perf_counter(), time.time()
    NotebookRunner(nb, timeout=300, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    seconds = time.perf_counter() - start
    _save_cell_timings(f"{path.parent.parent.name}-{path.stem}", nb, started_at, seconds)
    return seconds, nb


def execute_solution(path: Path) -> tuple[float, tuple[str, ...]]:
    """Run a solution notebook top to bottom (once per session): (seconds, error lines).

    Shared by the execution test and the browser test (which compares its own run time with this one).
    """
    seconds, nb = executed(path)
    errors = tuple(
        f"cell {i} ({c.metadata.get('nbgrader', {}).get('grade_id', '?')}): {o.ename}: {o.evalue}"
        for i, c in enumerate(nb.cells) if c.cell_type == "code"
        for o in c.outputs if o.output_type == "error"
    )
    return seconds, errors
