"""Benchmark: per-notebook run time and peak memory; autograde throughput, where its time goes, its floor, and
stock nbgrader's time over the same hand-ins.

    .venv/bin/python benchmarks/run.py                      # every solution notebook + a class of 100 copies of 01
    .venv/bin/python benchmarks/run.py --skip-notebooks --copies 20 --compare-unsandboxed --skip-nbgrader

The floor is what grading cannot beat: the same steps (set-up cells, answers, hidden-test scenarios) run
again and again in one warm kernel, with no kernel start, no sandbox and no judging. The machine's busy CPU
seconds are printed beside wall seconds: run on an otherwise idle machine, they are the run's own CPU time. Numbers
are for the machine it runs on; nothing here is asserted by the test suite.
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
from jupyter_core.utils import run_sync

from labkit import cells
from labkit.runner import NotebookRunner

REPO = Path(__file__).resolve().parent.parent
NOT_RUN_TAG = "tml-not-graded"  # stock nbgrader skips cells with this tag (Execute.skip_cells_with_tag)
sys.path.insert(0, str(REPO))

from grader.author.bootstrap import bootstrap_source  # noqa: E402
from grader.author.mutants import reference_answers, reference_submission  # noqa: E402
from grader.author.selftest import put  # noqa: E402
from grader.course import assignment_named, put_interpreter_on_path  # noqa: E402
from grader.judge import reference as cached_records  # noqa: E402
from grader.judge.grading import known_mistakes, plain_kernel_factory, plan, reference_records  # noqa: E402
from grader.judge.judge import behaves_like  # noqa: E402
from grader.kernel.kernelspec import servers_for_threads  # noqa: E402


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
    try:
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
    finally:
        if manager.has_kernel:  # nbclient leaves a kernel manager it was handed running: idle, it would hold its
            run_sync(manager.shutdown_kernel)(now=True)  # memory through the grading measured next
        shutil.rmtree(sockets, ignore_errors=True)
    return {"seconds": time.perf_counter() - start, "slowest_demo_cell": slowest_demo,
            "slowest_cell": slowest_any, "peak_mib": peak, "errors": errors}


def busy_cpu() -> float:
    """CPU seconds the whole machine has been busy so far (/proc/stat: user, nice, system, irq, softirq). Over a run
    on an otherwise idle machine: the run's CPU time in all its processes. (A parent's rusage misses much of it:
    a sandboxed kernel is reaped by its supervisor, not by the process that waits for the batch.)"""
    user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in Path("/proc/stat").read_text().split()[1:8])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def autograde_class(assignment: str, copies: int, workdir: Path, jobs: int, *extra: str) -> tuple[float, float, Path]:
    """`python -m grader autograde` over `copies` reference hand-ins (feedback included): wall seconds, the
    machine's busy CPU seconds meanwhile, and its output folder."""
    cls = workdir / "class"
    if not cls.exists():
        for i in range(copies):
            put(cls, f"student{i:03d}", assignment_named(assignment), reference_submission(assignment_named(assignment)))
    out = Path(tempfile.mkdtemp(prefix="graded-", dir=workdir))
    start, cpu = time.perf_counter(), busy_cpu()
    subprocess.run([sys.executable, "-m", "grader", "autograde", str(cls), "--out", str(out), "--jobs", str(jobs),
                    "--timeout", "120", *extra], check=True, cwd=REPO, capture_output=True)
    return time.perf_counter() - start, busy_cpu() - cpu, out


def stock_nbgrader(assignment: str, copies: int, workdir: Path) -> tuple[float, float]:
    """Wall and CPU seconds of stock `nbgrader autograde` over the same hand-ins (throughput only: its scores are
    not compared).

    The course's source notebook goes through stock `nbgrader generate_assignment`; each hand-in is that release
    with the reference answers, as a student would hand it in. nbgrader runs every cell of each hand-in in a fresh
    kernel, one hand-in after another (its default); the cells our grader never runs (demo and claim cells:
    labkit.cells.SKIPPED) are skipped there too.
    """
    chosen = assignment_named(assignment)
    course = workdir / "stock-nbgrader"
    source = nbformat.read(chosen.source, as_version=4)
    for cell in source.cells:
        if cell.cell_type == "code" and cells.kind(cell) in cells.SKIPPED:
            cell.metadata.setdefault("tags", []).append(NOT_RUN_TAG)
    (course / "source" / assignment).mkdir(parents=True)
    nbformat.write(source, course / "source" / assignment / chosen.notebook)
    nbgrader = [str(Path(sys.executable).parent / "nbgrader")]
    common = [f"--CourseDirectory.root={course}", f"--Execute.skip_cells_with_tag={NOT_RUN_TAG}", "--Execute.timeout=120"]
    subprocess.run([*nbgrader, "generate_assignment", assignment, "--force", *common], check=True, cwd=course,
                   capture_output=True)
    handed_in = nbformat.read(course / "release" / assignment / chosen.notebook, as_version=4)
    answers = reference_answers(chosen)
    for cell in handed_in.cells:
        cell.source = answers.get(cells.grade_id(cell), cell.source)
    for i in range(copies):
        put(course / "submitted", f"student{i:03d}", chosen, handed_in)
    start, cpu = time.perf_counter(), busy_cpu()
    subprocess.run([*nbgrader, "autograde", assignment, "--force", *common], check=True, cwd=course, capture_output=True)
    return time.perf_counter() - start, busy_cpu() - cpu


def nbgrader_with_course_grading(assignment: str, copies: int, workdir: Path) -> tuple[float, float]:
    """Wall and CPU seconds of `nbgrader autograde` in a course directory `python -m grader nbgrader init` wrote
    (grader/nbgrader/): nbgrader's own command, the course's grader deciding the points, over the same copies."""
    chosen = assignment_named(assignment)
    course = workdir / "nbgrader-course"
    subprocess.run([sys.executable, "-m", "grader", "nbgrader", "init", str(course), "--exchange",
                    str(workdir / "exchange")], check=True, cwd=REPO, capture_output=True)
    nbgrader = [str(Path(sys.executable).parent / "nbgrader")]
    subprocess.run([*nbgrader, "generate_assignment", assignment], check=True, cwd=course, capture_output=True)
    for i in range(copies):
        put(course / "submitted", f"student{i:03d}", chosen, reference_submission(chosen))
    start, cpu = time.perf_counter(), busy_cpu()
    subprocess.run([*nbgrader, "autograde", assignment], check=True, cwd=course, capture_output=True)
    return time.perf_counter() - start, busy_cpu() - cpu


def stages(out: Path) -> dict[str, float]:
    """Mean seconds per submission of each grading stage (from results.json)."""
    totals: dict[str, float] = defaultdict(float)
    results = json.loads((out / "results.json").read_text())
    for result in results:
        for stage, seconds in result.get("seconds", {}).items():
            totals[stage] += seconds
    return {stage: total / max(1, len(results)) for stage, total in totals.items()}


def floor(assignment: str, repeats: int, jobs: int) -> float:
    """Mean seconds to run one submission's steps again in a warm kernel (the set-up once, outside the timing),
    with the torch threads a grading kernel gets when `jobs` share the cores."""
    steps = plan(reference_submission(assignment_named(assignment)), assignment_named(assignment))
    kernel = plain_kernel_factory({"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // jobs))})()
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
    """Seconds to record the known mistakes once (no cache; in warm sandboxed kernels, a fork server per job, as
    autograde records them, the servers' start included), and to match one failed test against all of them."""
    chosen = assignment_named(assignment)
    saved = cached_records.REFERENCE_CACHE
    threads = str(max(1, (os.cpu_count() or 1) // jobs))
    with tempfile.TemporaryDirectory(prefix="bench-records-") as cache:
        cached_records.REFERENCE_CACHE = Path(cache)
        try:
            start = time.perf_counter()
            with servers_for_threads(jobs, threads) as kernels:
                mistakes = known_mistakes(chosen, kernels, 120, jobs)
                record_s = time.perf_counter() - start
                reference = reference_records(chosen, kernels, 120)
        finally:
            cached_records.REFERENCE_CACHE = saved
    failed = [(test, record) for test, by_name in mistakes.items() for record in by_name.values()]
    start = time.perf_counter()
    for test, record in failed:  # each mistake's own record stands in for a student who made it
        next((name for name, m in mistakes[test].items() if behaves_like(record, m, reference[test])), "")
    return record_s, (time.perf_counter() - start) / max(1, len(failed))


def seccomp_cost(kernels: int = 40, calls: int = 200_000) -> tuple[float, float, float]:
    """The sandbox's seccomp filter (grader/kernel/seccomp.py): ms to build it (once per fork server), ms to load
    it (once per kernel: median over `kernels` forked children), ns it adds to a system call (getppid)."""
    from grader.kernel import seccomp
    from labkit.forking import fork_child

    start = time.perf_counter()
    seccomp.prepare()
    build_ms = 1000 * (time.perf_counter() - start)

    def in_child(measure) -> float:
        read, write = os.pipe()
        pid = fork_child(lambda: os.write(write, json.dumps(measure()).encode()) and None)
        os.close(write)
        os.waitpid(pid, 0)
        with os.fdopen(read) as f:
            return float(json.loads(f.read()))

    def load_ms() -> float:
        start = time.perf_counter()
        seccomp.load()
        return 1000 * (time.perf_counter() - start)

    def call_ns(filtered: bool) -> float:
        if filtered:
            seccomp.load()
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            for _ in range(calls):
                os.getppid()
            best = min(best, (time.perf_counter() - start) / calls)
        return 1e9 * best

    loads = sorted(in_child(load_ms) for _ in range(kernels))
    # children without and with the filter, alternating (a busy machine slows both alike): the median difference
    added = sorted(in_child(lambda: call_ns(True)) - in_child(lambda: call_ns(False)) for _ in range(7))
    return build_ms, loads[len(loads) // 2], added[len(added) // 2]


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


def grading_benchmark(args: argparse.Namespace) -> None:
    """Autograde's throughput over the class, where its time goes, its floor, and stock nbgrader's time beside it."""
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        # the grading template and the reference records are cached per version: make them first
        autograde_class(args.assignment, 1, Path(tmp) / "warm", args.jobs)
        one = autograde_class(args.assignment, 1, Path(tmp) / "one", args.jobs)[0]
        seconds, cpu, out = autograde_class(args.assignment, args.copies, Path(tmp), args.jobs)
        spent = stages(out)
        start = time.perf_counter()  # the class report alone (autograde writes it too), Python start included
        subprocess.run([sys.executable, "-m", "grader", "report", str(out)], check=True, cwd=REPO, capture_output=True)
        report_s = time.perf_counter() - start
        bare = autograde_class(args.assignment, args.copies, Path(tmp), args.jobs, "--unsandboxed")[0] \
            if args.compare_unsandboxed else None
        plugged = None if args.skip_nbgrader else nbgrader_with_course_grading(args.assignment, args.copies, Path(tmp))
        stock = None if args.skip_nbgrader else stock_nbgrader(args.assignment, args.copies, Path(tmp))
    per_copy = floor(args.assignment, 5, args.jobs)
    record_s, match_s = mistake_matching(args.assignment, args.jobs)
    print(f"\nautograde, {args.copies} copies of the {args.assignment} reference, --jobs {args.jobs}, sandboxed:")
    print(f"  {seconds:6.1f} s  ({60 * args.copies / seconds:5.1f} submissions/min, feedback pages included); "
          f"{cpu:.1f} s of CPU busy on the machine meanwhile ({cpu / args.copies:.2f} s per copy)")
    print(f"  a class of one hand-in: {one:.1f} s (what every run pays once: start-up, workers and their fork "
          "servers, the canary, the report)")
    print("  mean seconds per submission, by stage: " + ", ".join(f"{k} {v:.3f}" for k, v in spent.items()))
    print(f"  floor (the same steps in one warm kernel): {per_copy:.3f} s per copy -> "
          f"{per_copy * args.copies / args.jobs:.1f} s for {args.copies} copies on {args.jobs} workers")
    if stock is not None and plugged is not None:
        print(f"  stock nbgrader autograde over the same {args.copies} copies (one after another, its default): "
              f"{stock[0]:6.1f} s, {stock[1]:.1f} s of CPU busy ({stock[0] / args.copies:.2f} s per copy; "
              f"ours is {stock[0] / seconds:.1f}× its throughput)")
        print(f"  `nbgrader autograde` in a course directory of `grader nbgrader init` (the course's grader scoring): "
              f"{plugged[0]:6.1f} s, {plugged[1]:.1f} s of CPU busy ({plugged[0] / args.copies:.2f} s per copy; "
              f"{stock[0] / plugged[0]:.1f}× stock nbgrader's throughput)")
    print(f"  class report of the {args.copies} hand-ins (`python -m grader report`): {report_s:.2f} s (issue 15: ≤ 5 s)")
    print(f"  known mistakes (issue 15): recorded once per version of the course in {record_s:.1f} s "
          f"({100 * record_s / seconds:.0f} % of this class's time, on the first batch only; cached after), "
          f"matched against a failed test in {1000 * match_s:.2f} ms")
    if bare is not None:
        print(f"  the same --unsandboxed: {bare:6.1f} s ({100 * (seconds / bare - 1):+.1f} % for the sandbox)")
    build_ms, load_ms, call_ns = seccomp_cost()
    per_submission = seconds * args.jobs / args.copies
    print(f"  seccomp filter (issue 21): {load_ms:.2f} ms to load per kernel (built once per worker in {build_ms:.0f} ms), "
          f"{call_ns:+.0f} ns per system call; today's {per_submission:.3f} s per submission (on one worker) "
          f"-> +{100 * load_ms / 1000 / per_submission:.2f} % for loading it")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--copies", type=int, default=100, help="submissions in the throughput class")
    parser.add_argument("--assignment", default="01_gradient_descent")
    parser.add_argument("--jobs", type=int, default=os.cpu_count())
    parser.add_argument("--skip-notebooks", action="store_true")
    parser.add_argument("--skip-grading", action="store_true")
    parser.add_argument("--compare-unsandboxed", action="store_true", help="also grade the class without the sandbox")
    parser.add_argument("--skip-nbgrader", action="store_true", help="do not time stock nbgrader over the same copies")
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
        grading_benchmark(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
