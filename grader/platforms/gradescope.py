"""Gradescope: `python -m grader gradescope OUT.zip` writes an autograder zip as Gradescope specifies it.

Gradescope's autograder specification (gradescope-autograders.readthedocs.io, "specs"): a zip with `setup.sh` and
`run_autograder` at its root, unpacked into /autograder/source; setup.sh runs once when Gradescope builds the image
(Ubuntu 22.04 by default); run_autograder runs once per submission, in a fresh container, with the student's files
in /autograder/submission, and writes /autograder/results/results.json (`score`, and `tests`: name, score,
max_score, status, output, visibility). What students see of a test depends on its `visibility`: `visible`, or
`after_due_date` (shown once the due date, or the late due date, has passed); instructors see everything, and what
run_autograder prints goes to instructors only (`stdout_visibility`).

The zip holds this course's grader, helpers/, labkit/, solutions/ and the released notebooks (Gradescope keeps the
zip from students), the pins without the developers' tools, and gradescope.json: the assignments it grades, the
feedback mode and the per-cell timeout. run_autograder grades the one notebook handed in, whatever its name, through
`autograde` (the same grading as a class run: the sandbox, the canary, the trusted judge) and writes one test per
exercise:

- feedback "at-once": each test visible at once, with its points and "passed" / "not passed" only;
- feedback "after-release" (the default): each test's output is the hidden tests' message and the known mistake
  the answer looks like, with visibility `after_due_date`; the points per exercise are in the top-level output,
  visible at once.

A submission with no notebook, two notebooks, a file that is not a notebook, or a notebook of another assignment
or course gets score 0 and a visible message saying which; it never makes run_autograder fail. Where the grading
environment itself is broken (the reference solution does not earn full marks: `GradingEnvironmentBroken`)
run_autograder writes no results and exits 4, so that Gradescope reports a failed autograder, not a zero.

Student code runs in the kernel sandbox where the container allows user namespaces; elsewhere, run as root,
as the unprivileged user `tml-student` (grader/platforms/student_kernel.py) with the grader's files unreadable
to it; anywhere else it is refused.

    python -m grader.platforms.gradescope prepare          # setup.sh's last step
    python -m grader.platforms.gradescope run [--root R]   # run_autograder's (R defaults to /autograder)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import sys
import tempfile
import time
import traceback
import zipfile
from pathlib import Path

from grader.course import Assignment, assignment_named, assignments
from grader.paths import BUILD, REPO
from grader.platforms.student_kernel import NETWORK_ENV, stop_students_processes
from grader.results import Result, points
from labkit import cells

HERE = Path(__file__).resolve().parent
# Assignments whose kernels need network sockets: 07's gloo ranks meet over loopback TCP (helpers/distributed.py).
# In `user` isolation every other kernel may open AF_UNIX sockets only (grader/platforms/student_kernel.py).
NETWORK_ASSIGNMENTS = frozenset({"07_distributed"})
SETTINGS = "gradescope.json"
REQUIREMENTS = "requirements-gradescope.txt"
SHIPPED = ("grader", "helpers", "labkit", "solutions", "notebooks", "pyproject.toml")
DEVELOPERS_ONLY = {"pytest", "pytest-xdist", "hypothesis", "playwright", "ruff", "mypy", "sphinx", "myst-parser", "furo"}
SECRET = ("solutions", "build", "grader")  # never readable by the user who runs student code
MAX_BYTES = 128 * 2**20
HELD_BACK = "what the hidden tests found is shown after the due date"
STUDENT_KERNELS = BUILD / "gradescope-kernels"  # the `python3` kernelspec that runs kernels as tml-student


# --- the zip ----------------------------------------------------------------------------------------------

def _shipped_files() -> list[tuple[str, Path]]:
    found = []
    for top in SHIPPED:
        path = REPO / top
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        found += [(str(p.relative_to(REPO)), p) for p in files
                  if "__pycache__" not in p.parts and ".ipynb_checkpoints" not in p.parts and p.suffix != ".pyc"]
    return found


def _requirements() -> str:
    lines = (REPO / "requirements.txt").read_text(encoding="utf-8").splitlines()
    kept = [line for line in lines if line.split("==")[0].strip().lower() not in DEVELOPERS_ONLY]
    return "\n".join(kept) + "\n"


def build_zip(out: Path, chosen: list[Assignment], feedback: str = "after-release", timeout: int = 30) -> int:
    """Write the autograder zip for `chosen` (every assignment when empty); returns how many files it holds.

    The same course gives the same bytes (sorted members, fixed times)."""
    settings = {"assignments": [a.name for a in chosen or assignments()], "feedback": feedback, "timeout": timeout}
    members: list[tuple[str, bytes, int]] = [
        ("setup.sh", (HERE / "setup.sh").read_bytes(), 0o755),
        ("run_autograder", (HERE / "run_autograder").read_bytes(), 0o755),
        (SETTINGS, (json.dumps(settings, indent=1) + "\n").encode(), 0o644),
        (REQUIREMENTS, _requirements().encode(), 0o644),
    ]
    members += [(name, path.read_bytes(), 0o644) for name, path in _shipped_files()]
    out.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data, mode in sorted(members):
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = (stat.S_IFREG | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    return len(members)


# --- setup.sh: prepare the image once --------------------------------------------------------------------

def _settings() -> dict:
    return json.loads((REPO / SETTINGS).read_text(encoding="utf-8"))


def prepare() -> None:
    """What every submission would otherwise redo: the kernelspec, the grading templates, the reference records and
    the known mistakes of the zip's assignments; then hide the grader's files from the user who runs student code."""
    from grader.batch.autograde import grading_template
    from grader.judge.grading import known_mistakes, plain_kernel_factory, reference_records
    from grader.kernel import kernelspec

    settings = _settings()
    chosen = [assignment_named(n) for n in settings["assignments"]]
    kernelspec.install_kernelspec()
    grading_template(chosen)
    for assignment in chosen:
        reference_records(assignment, plain_kernel_factory(), settings["timeout"])
        known_mistakes(assignment, plain_kernel_factory(), settings["timeout"], os.cpu_count() or 1)
    _write_student_kernelspec()
    if os.geteuid() == 0:
        for name in SECRET:
            _hide(REPO / name)
    print(f"prepared {', '.join(a.name for a in chosen)} for Gradescope in {REPO}")


def _hide(path: Path) -> None:
    """No access for others (the student's user): files and folders keep their owner's and group's bits."""
    if path.exists():
        path.chmod(stat.S_IMODE(path.stat().st_mode) & ~0o007)


def _write_student_kernelspec() -> None:
    folder = STUDENT_KERNELS / "kernels" / "python3"
    folder.mkdir(parents=True, exist_ok=True)
    spec = {"argv": [sys.executable, str(HERE / "student_kernel.py"), "{connection_file}"],
            "display_name": "Python 3 (as tml-student)", "language": "python", "interrupt_mode": "signal"}
    (folder / "kernel.json").write_text(json.dumps(spec, indent=1) + "\n")


# --- run_autograder: one submission -------------------------------------------------------------------------

class Refused(Exception):
    """The submission cannot be graded; the message is what the student reads."""


def _files(folder: Path) -> list[Path]:
    """The submission's regular files (links are not followed), hidden folders and editors' leftovers left out."""
    found = []
    for path in sorted(folder.rglob("*")) if folder.is_dir() else []:
        parts = path.relative_to(folder).parts
        if any(p.startswith(".") or p == "__MACOSX" for p in parts) or path.is_symlink() or not path.is_file():
            continue
        found.append(path)
    return found


def _markers(path: Path) -> set[str]:
    """The nbgrader grade ids and the cell ids (as "cell:<id>": a tool that drops cell metadata keeps them) in a
    handed-in notebook; Refused when it is not a readable notebook."""
    try:
        if path.stat().st_size > MAX_BYTES:
            raise Refused(f"{path.name} is larger than {MAX_BYTES // 2**20} MB: hand in the notebook without its outputs")
        raw = json.loads(path.read_bytes().decode("utf-8"))
        cell_list = raw["cells"]
        return _cell_markers([c for c in cell_list if isinstance(c, dict) and isinstance(c.get("metadata"), dict)])
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError):
        raise Refused(f"{path.name} is not a readable notebook (Jupyter's .ipynb): download it again from your "
                      "notebook (File → Download) and hand that in") from None


def identify(submission: Path, chosen: list[Assignment]) -> tuple[Path, Assignment]:
    """The one notebook handed in and the assignment it is (one of `chosen`, any when it is empty); Refused, with
    the reason, otherwise."""
    chosen = chosen or assignments()
    files = _files(submission)
    notebooks = [p for p in files if p.suffix.lower() == ".ipynb"]
    names = ", ".join(str(p.relative_to(submission)) for p in (notebooks or files)[:5])
    expected = " or ".join(a.notebook for a in chosen)
    if not notebooks:
        raise Refused(f"No notebook (.ipynb) in your submission ({'found: ' + names if files else 'it is empty'}): "
                      f"hand in {expected}.")
    if len(notebooks) > 1:
        raise Refused(f"Your submission has {len(notebooks)} notebooks ({names}): hand in one, {expected}.")
    ids = _markers(notebooks[0])
    overlap = {a.name: len(ids & _cell_markers(_source_cells(a))) for a in assignments()}
    best = max(overlap, key=lambda name: overlap[name])
    if not overlap[best]:
        raise Refused(f"{notebooks[0].name} is not one of the course's notebooks (none of its exercise cells is in "
                      f"it): hand in the {expected} you worked in, downloaded with File → Download.")
    if best not in [a.name for a in chosen]:
        raise Refused(f"{notebooks[0].name} is notebook {best}; this assignment grades {expected}.")
    return notebooks[0], assignment_named(best)


def _cell_markers(cell_list: list) -> set[str]:
    return ({gid for c in cell_list if (gid := cells.nbgrader(c).get("grade_id"))}
            | {f"cell:{c['id']}" for c in cell_list if isinstance(c.get("id"), str) and c["id"]})


def _source_cells(assignment: Assignment) -> list:
    import nbformat

    return nbformat.read(assignment.source, as_version=4).cells


def _isolation() -> str:
    """'sandbox', 'user' (kernels as tml-student) or why neither can run student code here."""
    from grader.kernel import sandbox

    chosen = os.environ.get("TML_GRADESCOPE_ISOLATION", "")
    if chosen in ("sandbox", "user"):
        return chosen
    if not sandbox.why_unavailable():
        return "sandbox"
    return "user" if os.geteuid() == 0 else "the sandbox cannot be built here and run_autograder is not root"


def grade(root: Path) -> dict:
    """Grade root/submission; results.json's content (a refusal when there is nothing to grade)."""
    settings = _settings()
    chosen = [assignment_named(n) for n in settings["assignments"]]
    started = time.monotonic()
    try:
        notebook, assignment = identify(root / "submission", chosen)
    except Refused as why:
        return {"score": 0, "output": str(why), "output_format": "text", "visibility": "visible",
                "stdout_visibility": "hidden", "tests": []}
    from grader.batch.autograde import autograde  # after the refusals: they need neither torch nor a kernel

    isolation = _isolation()
    if isolation not in ("sandbox", "user"):
        raise RuntimeError(f"refusing to run student code: {isolation}")
    if isolation == "user":
        os.environ["JUPYTER_PATH"] = str(STUDENT_KERNELS)
        os.environ[NETWORK_ENV] = "inet" if assignment.name in NETWORK_ASSIGNMENTS else ""
        for path in (root / "results", root / "submission", root / "submission_metadata.json"):
            _hide(path)
    work = Path(tempfile.mkdtemp(prefix="gradescope-"))
    hand_in = work / "class" / "submission" / assignment.name / notebook.name
    hand_in.parent.mkdir(parents=True)
    shutil.copyfile(notebook, hand_in)
    try:
        (result,) = autograde(work / "class", work / "graded", jobs=1, timeout=settings["timeout"], progress=False,
                              sandboxed=isolation == "sandbox", feedback=settings["feedback"], report=False)
    finally:  # a daemon the kernel started outlives it (setsid); run_autograder leaves none of the student's
        if isolation == "user" and not stop_students_processes():
            print("some processes of the student's user would not stop")
        shutil.rmtree(work, ignore_errors=True)
    spent = ", ".join(f"{stage} {seconds:.1f} s" for stage, seconds in result.seconds.items())
    print(f"graded {notebook.name} as {assignment.name} ({isolation}) in {time.monotonic() - started:.1f} s; "
          f"the hand-in itself: {spent or 'not graded'}")  # for instructors: Gradescope shows stdout to them only
    return results_json(result, assignment, settings["feedback"], time.monotonic() - started)


def results_json(result: Result, assignment: Assignment, feedback: str, seconds: float) -> dict:
    """Gradescope's results.json for one graded row: one test per exercise, the total, the notes."""
    from grader.author.mutants import load_mutants
    from grader.judge.grading import two_digits

    whys = {m.name: m.why for m in load_mutants(assignment)}
    later = feedback == "after-release"
    tests, lines = [], []
    for number, (test, top) in enumerate(assignment.grade_cells().items(), 1):
        score = result.scores.get(test, 0.0)
        passed = score == top
        said = "passed" if passed else (result.messages.get(test) or "not passed") if later else f"not passed — {HELD_BACK}"
        if later and not passed and test in result.mistakes:
            said += f"\nThis looks like a known mistake: {whys.get(result.mistakes[test], result.mistakes[test])}."
        tests.append({"name": test, "number": str(number), "score": score, "max_score": top,
                      "status": "passed" if passed else "failed", "output": said,
                      "visibility": "after_due_date" if later else "visible"})
        lines.append(f"  {test}: {points(score)} / {points(top)}")
    total, maximum = result.total, sum(assignment.grade_cells().values())
    notes = [f"  {note.text}" for note in result.status]
    output = "\n".join([f"{assignment.name}: {points(total)} / {points(maximum)} points", *lines]
                       + (["Notes:", *notes] if notes else [])
                       + ([f"Per exercise, {HELD_BACK}."] if later else []))
    # the whole run's time, which a hand-in's scenarios can stretch: as coarse as the other timings
    return {"score": total, "execution_time": two_digits(seconds), "output": output, "output_format": "text",
            "visibility": "visible", "stdout_visibility": "hidden", "tests": tests}


def run(root: Path) -> int:
    """run_autograder: grade, write results.json; 4 (no results) when the grading environment is broken."""
    from grader.judge.grading import GradingEnvironmentBroken

    try:
        results = grade(root)
    except GradingEnvironmentBroken as err:
        print(f"grading environment broken, no result written: {err}")
        return 4
    except Exception:  # the grader's own failure: Gradescope reports a failed autograder, never a zero
        traceback.print_exc(file=sys.stdout)
        return 1
    (root / "results").mkdir(parents=True, exist_ok=True)
    (root / "results" / "results.json").write_text(json.dumps(results, indent=1, ensure_ascii=False), encoding="utf-8")
    print(f"score {points(results['score'])}; results in {root / 'results' / 'results.json'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    from grader.course import put_interpreter_on_path

    parser = argparse.ArgumentParser(prog="python -m grader.platforms.gradescope", description=__doc__.split("\n")[0])
    step = parser.add_subparsers(dest="step", required=True)
    step.add_parser("prepare", help="setup.sh's last step: build once what every submission needs")
    graded = step.add_parser("run", help="run_autograder's step: grade one submission")
    graded.add_argument("--root", type=Path, default=Path("/autograder"))
    args = parser.parse_args(argv)
    put_interpreter_on_path()
    if args.step == "prepare":
        prepare()
        return 0
    return run(args.root)


if __name__ == "__main__":
    sys.exit(main())
