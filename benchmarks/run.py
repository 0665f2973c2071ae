"""Benchmark: per-notebook run time and peak memory; autograde throughput, where its time goes, and its floor.

    .venv/bin/python benchmarks/run.py                      # every solution notebook + a class of 100 copies of 01
    .venv/bin/python benchmarks/run.py --skip-notebooks --copies 20 --compare-unsandboxed

The floor is what grading cannot beat: the same steps (set-up cells, answers, hidden-test scenarios) run
again and again in one warm kernel, with no kernel start, no sandbox and no judging. Numbers are for the
machine it runs on; nothing here is asserted by the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import nbformat
from jupyter_client import AsyncKernelManager

from labkit.runner import NotebookRunner

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from grader.author.bootstrap import bootstrap_source  # noqa: E402
from grader.author.mutants import reference_submission  # noqa: E402
from grader.author.selftest import put  # noqa: E402
from grader.course import assignment_named, put_interpreter_on_path  # noqa: E402
from grader.judge import grading  # noqa: E402
from grader.judge.grading import known_mistakes, plain_kernel_factory, plan, reference_records  # noqa: E402
from grader.judge.judge import behaves_like  # noqa: E402


def peak_rss_mib(pid: int) -> float:
    """Peak resident memory of a live process (VmHWM), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run_notebook(path: Path) -> dict[str, float]:
    """Execute a notebook cell by cell; wall time including kernel start, slowest demo cell, kernel peak RSS."""
    nb = nbformat.read(path, as_version=4)
    sockets = tempfile.mkdtemp(prefix="bench-kernel-")
    # ipc, as a lecturer's JupyterLab kernel would: over TCP the kernel warns into this table
    manager = AsyncKernelManager(kernel_name="python3", transport="ipc", ip=os.path.join(sockets, "kernel"))
    client = NotebookRunner(nb, km=manager, timeout=600, allow_errors=True,
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
            if {"demo", "claim"} & set(cell.metadata.get("tags", [])):
                slowest_demo = max(slowest_demo, took)
            errors += sum(o.get("output_type") == "error" for o in cell.get("outputs", []))
        peak = peak_rss_mib(client.km.provisioner.process.pid)
    shutil.rmtree(sockets, ignore_errors=True)
    return {"seconds": time.perf_counter() - start, "slowest_demo_cell": slowest_demo,
            "slowest_cell": slowest_any, "peak_mib": peak, "errors": errors}


def autograde_class(assignment: str, copies: int, workdir: Path, jobs: int, *extra: str) -> tuple[float, Path]:
    """Seconds for `python -m grader autograde` over `copies` reference hand-ins (feedback included), and its output."""
    cls = workdir / "class"
    if not cls.exists():
        for i in range(copies):
            put(cls, f"student{i:03d}", assignment_named(assignment), reference_submission(assignment_named(assignment)))
    out = Path(tempfile.mkdtemp(prefix="graded-", dir=workdir))
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "grader", "autograde", str(cls), "--out", str(out), "--jobs", str(jobs),
                    "--timeout", "120", *extra], check=True, cwd=REPO, capture_output=True)
    return time.perf_counter() - start, out


def stages(out: Path) -> dict[str, float]:
    """Mean seconds per submission of each grading stage (from results.json)."""
    totals: dict[str, float] = defaultdict(float)
    results = json.loads((out / "results.json").read_text())
    for result in results:
        for stage, seconds in result.get("seconds", {}).items():
            totals[stage] += seconds
    return {stage: total / max(1, len(results)) for stage, total in totals.items()}


def floor(assignment: str, repeats: int) -> float:
    """Mean seconds to run one submission's steps again in a warm kernel (the set-up once, outside the timing)."""
    steps = plan(reference_submission(assignment_named(assignment)), assignment_named(assignment))
    kernel = plain_kernel_factory()()
    try:
        for step in steps:  # warm: imports, first calls
            kernel.run(step.code, 120)
        start = time.perf_counter()
        for _ in range(repeats):
            for step in steps:
                kernel.run(step.code, 120)
        return (time.perf_counter() - start) / repeats
    finally:
        kernel.stop()


def mistake_matching(assignment: str, jobs: int) -> tuple[float, float]:
    """Seconds to record the known mistakes once (no cache), and to match one failed test against all of them."""
    chosen = assignment_named(assignment)
    kernels = plain_kernel_factory()
    saved = grading.REFERENCE_CACHE
    with tempfile.TemporaryDirectory(prefix="bench-records-") as cache:
        grading.REFERENCE_CACHE = Path(cache)
        try:
            start = time.perf_counter()
            mistakes = known_mistakes(chosen, kernels, 120, jobs)
            record_s = time.perf_counter() - start
            reference = reference_records(chosen, kernels, 120)
        finally:
            grading.REFERENCE_CACHE = saved
    failed = [(test, record) for test, by_name in mistakes.items() for record in by_name.values()]
    start = time.perf_counter()
    for test, record in failed:  # each mistake's own record stands in for a student who made it
        next((name for name, m in mistakes[test].items() if behaves_like(record, m, reference[test])), "")
    return record_s, (time.perf_counter() - start) / max(1, len(failed))


def bootstrap_seconds() -> float:
    """Seconds for the notebooks' set-up cell as a student's first cell, in a fresh kernel that has everything."""
    kernel = plain_kernel_factory()()
    try:
        run = kernel.run(bootstrap_source(), 120)
        if run.error or run.failure:
            raise RuntimeError(f"the set-up cell failed here: {run.error or run.failure}")
        return run.seconds
    finally:
        kernel.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--copies", type=int, default=100, help="submissions in the throughput class")
    parser.add_argument("--assignment", default="01_gradient_descent")
    parser.add_argument("--jobs", type=int, default=os.cpu_count())
    parser.add_argument("--skip-notebooks", action="store_true")
    parser.add_argument("--skip-grading", action="store_true")
    parser.add_argument("--compare-unsandboxed", action="store_true", help="also grade the class without the sandbox")
    args = parser.parse_args()
    put_interpreter_on_path()
    print(f"machine: {os.cpu_count()} cores, python {sys.version.split()[0]}")

    if not args.skip_notebooks:
        print(f"\n{'notebook':<28} {'run s':>7} {'slowest demo/claim s':>21} "
              f"{'slowest cell s':>15} {'peak MiB':>9} {'errors':>7}")
        for path in sorted((REPO / "solutions").glob("*/*.ipynb")):
            r = run_notebook(path)
            print(f"{path.stem:<28} {r['seconds']:>7.1f} {r['slowest_demo_cell']:>21.2f} {r['slowest_cell']:>15.2f} "
                  f"{r['peak_mib']:>9.0f} {r['errors']:>7}")

    print(f"\nthe set-up (bootstrap) cell in a fresh kernel of this environment: {bootstrap_seconds():.3f} s "
          "(issue 14: ≤ 0.5 s)")

    if not args.skip_grading:
        with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
            # the grading template and the reference records are cached per version: make them first
            autograde_class(args.assignment, 1, Path(tmp) / "warm", args.jobs)
            seconds, out = autograde_class(args.assignment, args.copies, Path(tmp), args.jobs)
            spent = stages(out)
            start = time.perf_counter()  # the class report alone (autograde writes it too), Python start included
            subprocess.run([sys.executable, "-m", "grader", "report", str(out)], check=True, cwd=REPO, capture_output=True)
            report_s = time.perf_counter() - start
            bare = autograde_class(args.assignment, args.copies, Path(tmp), args.jobs, "--unsandboxed")[0] \
                if args.compare_unsandboxed else None
        per_copy = floor(args.assignment, 5)
        record_s, match_s = mistake_matching(args.assignment, args.jobs)
        print(f"\nautograde, {args.copies} copies of the {args.assignment} reference, --jobs {args.jobs}, sandboxed:")
        print(f"  {seconds:6.1f} s  ({60 * args.copies / seconds:5.1f} submissions/min, feedback pages included)")
        print("  mean seconds per submission, by stage: " + ", ".join(f"{k} {v:.3f}" for k, v in spent.items()))
        print(f"  floor (the same steps in one warm kernel): {per_copy:.3f} s per copy -> "
              f"{per_copy * args.copies / args.jobs:.1f} s for {args.copies} copies on {args.jobs} workers")
        print(f"  class report of the {args.copies} hand-ins (`python -m grader report`): {report_s:.2f} s (issue 15: ≤ 5 s)")
        print(f"  known mistakes (issue 15): recorded once per version of the course in {record_s:.1f} s "
              f"({100 * record_s / seconds:.0f} % of this class's time, on the first batch only; cached after), "
              f"matched against a failed test in {1000 * match_s:.2f} ms")
        if bare is not None:
            print(f"  the same --unsandboxed: {bare:6.1f} s ({100 * (seconds / bare - 1):+.1f} % for the sandbox)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
