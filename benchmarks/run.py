"""Benchmark: per-notebook run time and peak memory, and autograde throughput against plain nbgrader.

    .venv/bin/python benchmarks/run.py                 # every solution notebook + a class of 20
    .venv/bin/python benchmarks/run.py --copies 40 --skip-notebooks

Numbers are for the machine it runs on; nothing here is asserted by the test suite.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from grader.course import assignment_named, put_interpreter_on_path  # noqa: E402
from grader.mutants import reference_submission  # noqa: E402
from grader.selftest import put  # noqa: E402


def peak_rss_mib(pid: int) -> float:
    """Peak resident memory of a live process (VmHWM), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run_notebook(path: Path) -> dict[str, float]:
    """Execute a notebook cell by cell; wall time including kernel start, slowest demo cell, kernel peak RSS."""
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=600, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(path.parent)}})
    start = time.perf_counter()
    slowest_demo, slowest_any, errors = 0.0, 0.0, 0
    with client.setup_kernel():
        client.wait_for_reply(client.kc.kernel_info())
        for index, cell in enumerate(nb.cells):
            began = time.perf_counter()
            client.execute_cell(cell, index)
            took = time.perf_counter() - began
            slowest_any = max(slowest_any, took)
            if "demo" in cell.metadata.get("tags", []):
                slowest_demo = max(slowest_demo, took)
            errors += sum(o.get("output_type") == "error" for o in cell.get("outputs", []))
        peak = peak_rss_mib(client.km.provisioner.process.pid)
    return {"seconds": time.perf_counter() - start, "slowest_demo_cell": slowest_demo,
            "slowest_cell": slowest_any, "peak_mib": peak, "errors": errors}


def plain_nbgrader(assignment: str, students: list[str], workdir: Path) -> float:
    """Seconds for stock `nbgrader autograde` over the class, sequentially, with the course's directories."""
    course = workdir / "plain"
    shutil.copytree(REPO / "solutions" / assignment, course / "source" / assignment)
    for student in students:
        put(course / "submitted", student, assignment_named(assignment), reference_submission(assignment_named(assignment)))
    common = [f"--CourseDirectory.root={course}", "--Execute.skip_cells_with_tag=demo", "--Execute.timeout=120"]
    subprocess.run(["nbgrader", "generate_assignment", assignment, "--force", *common], check=True, cwd=course,
                   capture_output=True)
    start = time.perf_counter()
    subprocess.run(["nbgrader", "autograde", assignment, "--force", *common], check=True, cwd=course,
                   capture_output=True)
    return time.perf_counter() - start


def course_autograde(assignment: str, students: list[str], workdir: Path, jobs: int, *extra: str) -> float:
    """Seconds for `python -m grader autograde` over the same class (feedback HTML included)."""
    cls = workdir / "class"
    if not cls.exists():
        for student in students:
            put(cls, student, assignment_named(assignment), reference_submission(assignment_named(assignment)))
    out = Path(tempfile.mkdtemp(prefix="graded-", dir=workdir))
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "grader", "autograde", str(cls), "--out", str(out),
                    "--jobs", str(jobs), "--timeout", "120", *extra], check=True, cwd=REPO, capture_output=True)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--copies", type=int, default=20, help="submissions in the throughput class")
    parser.add_argument("--assignment", default="01_gradient_descent")
    parser.add_argument("--jobs", type=int, default=os.cpu_count())
    parser.add_argument("--skip-notebooks", action="store_true")
    parser.add_argument("--skip-grading", action="store_true")
    parser.add_argument("--skip-plain", action="store_true", help="do not time plain nbgrader")
    parser.add_argument("--compare-sandbox", action="store_true", help="also grade the class without the sandbox")
    args = parser.parse_args()
    put_interpreter_on_path()
    print(f"machine: {os.cpu_count()} cores, python {sys.version.split()[0]}")

    if not args.skip_notebooks:
        print(f"\n{'notebook':<28} {'run s':>7} {'slowest demo s':>15} {'slowest cell s':>15} {'peak MiB':>9} {'errors':>7}")
        for path in sorted((REPO / "solutions").glob("*/*.ipynb")):
            r = run_notebook(path)
            print(f"{path.stem:<28} {r['seconds']:>7.1f} {r['slowest_demo_cell']:>15.2f} {r['slowest_cell']:>15.2f} "
                  f"{r['peak_mib']:>9.0f} {r['errors']:>7}")

    if not args.skip_grading:
        students = [f"student{i:03d}" for i in range(args.copies)]
        with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
            # the grading template is cached per source version: build it first so no run pays for it
            course_autograde(args.assignment, students[:1], Path(tmp) / "warm", args.jobs)
            plain = None if args.skip_plain else plain_nbgrader(args.assignment, students, Path(tmp))
            ours = course_autograde(args.assignment, students, Path(tmp), args.jobs)
            bare = course_autograde(args.assignment, students, Path(tmp), args.jobs, "--unsandboxed") \
                if args.compare_sandbox else None
        print(f"\nautograde, {args.copies} copies of the {args.assignment} reference:")
        if plain:
            print(f"  plain sequential nbgrader autograde: {plain:6.1f} s  {60 * args.copies / plain:5.1f} submissions/min")
        print(f"  python -m grader autograde --jobs {args.jobs} (sandboxed): {ours:6.1f} s  "
              f"{60 * args.copies / ours:5.1f} submissions/min  (feedback HTML included)")
        if bare:
            print(f"  the same --unsandboxed: {bare:6.1f} s  {60 * args.copies / bare:5.1f} submissions/min  "
                  f"(sandboxed time {100 * (ours / bare - 1):+.1f} %: unsandboxed kernels start a fresh Python "
                  f"each, sandboxed ones fork from a server with torch imported)")
        if plain:
            print(f"  throughput ratio against plain nbgrader: {plain / ours:.2f}×")
    return 0


if __name__ == "__main__":
    sys.exit(main())
