"""The instructor command line: release, check, autograde."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def _release(args: argparse.Namespace) -> int:
    from grader.course import assignment_named
    from grader.release import release

    for name in release([assignment_named(n) for n in args.assignments] or None):
        print(f"released notebooks/{name}/")
    return 0


def _check(args: argparse.Namespace) -> int:
    from grader.release import check

    problems = check()
    for problem in problems:
        print(f"✗ {problem}")
    print("✓ notebooks/ is current, stripped and leak-free; nbgrader metadata and mutants are consistent"
          if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


def _autograde(args: argparse.Namespace) -> int:
    from grader.autograde import GradingEnvironmentBroken, SandboxUnavailable, autograde
    from grader.submissions import printable

    if not args.submissions.exists():
        print(f"no such folder or zip: {args.submissions}", file=sys.stderr)
        return 2
    try:
        results = autograde(args.submissions, args.out, jobs=args.jobs, timeout=args.timeout,
                            only=args.assignment, force=args.force, sandboxed=not args.unsandboxed)
    except SandboxUnavailable as err:
        print(f"refusing to grade: {err}", file=sys.stderr)
        return 3
    except GradingEnvironmentBroken as err:
        print(f"grading stopped, no grades written: {err}", file=sys.stderr)
        return 4
    flagged = [r for r in results if r.status]
    print(f"graded {len(results)} submission(s) into {args.out / 'grades.csv'}; "
          f"feedback in {args.out / 'feedback'}; {len(flagged)} with a status note")
    for r in flagged:
        print(f"  {printable(r.student)}/{printable(r.assignment)}: {printable('; '.join(r.status))}")
    return 0


def _selftest(args: argparse.Namespace) -> int:
    import tempfile

    from grader.autograde import GradingEnvironmentBroken, autograde
    from grader.course import assignment_named, assignments
    from grader.cribs import crib_problems, cribs
    from grader.grading import plain_kernel_factory, reference_records
    from grader.selftest import mismatches, write_selftest_class

    chosen = [assignment_named(n) for n in args.assignments] or assignments()
    out = args.keep or Path(tempfile.mkdtemp(prefix="selftest-"))
    expected = write_selftest_class(out / "class", chosen)
    try:
        results = autograde(out / "class", out / "graded", jobs=args.jobs, timeout=args.timeout, force=True)
    except GradingEnvironmentBroken as err:
        print(f"✗ grading stopped: {err}")
        return 1
    problems = mismatches({(r.student, r.assignment): (r.scores, "; ".join(r.status) or "ok", r.messages, r.mistakes)
                           for r in results}, expected)
    for problem in problems:
        print(f"✗ {problem}")
    print(f"{len(expected) - len(problems)} of {len(expected)} self-test submissions graded as expected; "
          f"grades in {out / 'graded' / 'grades.csv'}")
    cribbed = []
    for assignment in chosen:
        kernels = plain_kernel_factory()
        cribbed += crib_problems(assignment, kernels, args.timeout, reference_records(assignment, kernels, args.timeout))
    for problem in cribbed:
        print(f"✗ crib: {problem}")
    print(f"cribs: {'none earns points' if not cribbed else f'{len(cribbed)} earn points'} "
          f"({sum(len(cribs(a)) for a in chosen)} visible functions and classes handed in as answers)")
    return 1 if problems or cribbed else 0


def _bundle(args: argparse.Namespace) -> int:
    from grader.bundle import bundle, bundle_leaks

    files = bundle(args.out)
    leaks = bundle_leaks(args.out)
    for leak in leaks:
        print(f"✗ leaked into the bundle: {leak}")
    print(f"wrote {len(files)} files to {args.out}" + (f"; {len(leaks)} leak(s) — do not publish" if leaks else ""))
    return 1 if leaks else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m grader", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    release = commands.add_parser("release", help="regenerate notebooks/ from solutions/")
    release.add_argument("assignments", nargs="*", help="only these (default: all)")
    release.set_defaults(run=_release)
    commands.add_parser("check", help="fail when notebooks/ is stale, leaks, carries outputs, or metadata is wrong"
                        ).set_defaults(run=_check)
    grade = commands.add_parser("autograde", help="grade a class: a folder <student>/<assignment>/<notebook>.ipynb or an LMS zip")
    grade.add_argument("submissions", type=Path)
    grade.add_argument("--out", type=Path, required=True, help="writes grades.csv and feedback/ here")
    grade.add_argument("--jobs", type=int, default=os.cpu_count(), help="submissions graded at once (default: all cores)")
    grade.add_argument("--timeout", type=int, default=30, help="seconds per cell (default 30)")
    grade.add_argument("--assignment", help="grade only this assignment")
    grade.add_argument("--force", action="store_true", help="grade again even what an earlier run already graded")
    grade.add_argument("--unsandboxed", action="store_true",
                       help="run student code without bubblewrap isolation (only for code you trust)")
    grade.set_defaults(run=_autograde)
    student_bundle = commands.add_parser("bundle", help="write what students receive (no solutions, hidden tests or mutants)")
    student_bundle.add_argument("out", type=Path, help="a new folder")
    student_bundle.set_defaults(run=_bundle)
    selftest = commands.add_parser("selftest", help="grade reference, blank, mutant and crib submissions; fail on any surprise")
    selftest.add_argument("assignments", nargs="*", help="only these (default: all)")
    selftest.add_argument("--jobs", type=int, default=os.cpu_count())
    selftest.add_argument("--timeout", type=int, default=30, help="seconds per cell")
    selftest.add_argument("--keep", type=Path, help="write the class and grades here (default: a temp folder)")
    selftest.set_defaults(run=_selftest)
    from grader.demo import add_demo_command
    add_demo_command(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    from grader.course import put_interpreter_on_path

    put_interpreter_on_path()
    args = build_parser().parse_args(argv)
    return args.run(args)
