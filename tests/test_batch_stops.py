"""Ctrl-C and SIGTERM stop a batch within seconds and leave nothing behind (issue 21, item 5 and 7).

`autograde` runs under a small subreaper (so every process it started stays visible even after its parent
dies), on an LMS zip of a class where some hand-ins hang in a cell; it is interrupted while it grades.
"""

import json
import signal
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import nbformat
import pytest
from conftest import REPO, read_rows

from grader.author.mutants import reference_submission
from grader.course import assignment_named

pytestmark = pytest.mark.slow
A = assignment_named("01")
HANG = "import time\ntime.sleep(1000)  # interrupted at --timeout"

# Runs autograde as its child, as a subreaper: sends `signal` once `ready` (a file) exists, then reports how long
# autograde took to exit, its status and every process still alive below this one.
SUBREAPER = """
import ctypes, json, os, signal, subprocess, sys, time
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
argv, ready, sig = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])
signal.signal(signal.SIGINT, signal.SIG_DFL)  # as a terminal's shell starts it: a suite run in the background ignores SIGINT
run = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
while not (ready == "-" or os.path.exists(ready)) and run.poll() is None:
    time.sleep(0.2)
sent = time.monotonic()
if run.poll() is None and sig:
    run.send_signal(sig)
out, err = run.communicate()
took = time.monotonic() - sent
time.sleep(1)
left = []
for pid in [int(p) for p in os.listdir("/proc") if p.isdigit()]:
    try:
        status = open(f"/proc/{pid}/status").read()
    except OSError:
        continue
    ppid = int(status.split("PPid:")[1].split()[0])
    if ppid == os.getpid() and "State:\\tZ" not in status:
        left.append(open(f"/proc/{pid}/cmdline").read().replace("\\0", " "))
print(json.dumps({"code": run.returncode, "took": took, "left": left, "err": err[-3000:]}))
"""


def _class_zip(path: Path) -> Path:
    """Four hand-ins in the folder layout: two correct, two that hang in a cell of their own."""
    reference = reference_submission(A)
    hanging = nbformat.from_dict(nbformat.from_dict(reference))
    hanging.cells.append(nbformat.v4.new_code_cell(HANG))
    with zipfile.ZipFile(path, "w") as zf:
        for student, notebook in (("ann", reference), ("bob", reference), ("hang1", hanging), ("hang2", hanging)):
            zf.writestr(f"{student}/{A.name}/{A.notebook}", nbformat.writes(notebook))
    return path


def _autograde(archive: Path, out: Path, ready: str, sig: int) -> dict:
    argv = [sys.executable, "-m", "grader", "autograde", str(archive), "--out", str(out), "--jobs", "2",
            "--timeout", "20"]
    done = subprocess.run([sys.executable, "-c", SUBREAPER, json.dumps(argv), ready, str(sig)], cwd=REPO,
                          capture_output=True, text=True, timeout=900, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _stale_forkserver_folders() -> list[str]:
    """Fork-server folders (named forkserver-<worker pid>-…) whose worker is gone."""
    return [p.name for p in Path(tempfile.gettempdir()).glob("forkserver-*-*")
            if p.name.split("-")[1].isdigit() and not Path(f"/proc/{p.name.split('-')[1]}").exists()]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_interrupted_batch_stops_at_once_keeps_what_it_graded_and_leaves_nothing(tmp_path, sig):
    archive, out = _class_zip(tmp_path / "class.zip"), tmp_path / "out"
    # stop it once the first hand-in is graded: the others are being graded (or hang) right then
    first = _autograde(archive, out, str(out / ".work" / "results" / "ann" / f"{A.name}.fingerprint"), sig)
    print(f"{signal.Signals(sig).name}: the batch stopped {first['took']:.1f} s after the signal")
    assert first["code"] == 130 and "stopped" in first["err"], first
    assert first["took"] < 10, f"the batch took {first['took']:.1f} s to stop"
    assert first["left"] == [], f"still running after the batch stopped: {first['left']}"
    assert not (out / ".work" / "unpacked").exists(), "the unpacked zip was left behind"
    assert _stale_forkserver_folders() == [], "a killed worker's fork-server folder was left behind"
    kept = sorted(p.parent.name for p in (out / ".work" / "results").glob(f"*/{A.name}.fingerprint"))
    assert "ann" in kept and not (out / "grades.csv").exists()
    for student in ("hang1", "hang2"):  # abandoned: no row, never a zero
        assert student in kept or not (out / ".work" / "results" / student / f"{A.name}.json").exists()
    if sig == signal.SIGTERM:
        return  # how a stopped batch is continued does not depend on the signal that stopped it: once is enough
    stamps = {s: (out / ".work" / "results" / s / f"{A.name}.fingerprint").stat().st_mtime_ns for s in kept}
    again = _autograde(archive, out, "-", 0)  # the next run continues from the cache
    assert again["code"] == 0 and again["left"] == [], again
    assert {s: (out / ".work" / "results" / s / f"{A.name}.fingerprint").stat().st_mtime_ns for s in kept} == stamps
    rows = read_rows(out)
    assert {s: sum(rows[s, A.name][0].values()) for s in ("ann", "bob", "hang1", "hang2")} == dict.fromkeys(
        ("ann", "bob", "hang1", "hang2"), 10.0)
    assert not (out / ".work" / "unpacked").exists()
