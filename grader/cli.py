"""The instructor command line: release, check, edition, autograde, report, export, merge, gradescope, nbgrader."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def _release(args: argparse.Namespace) -> int:
    from grader.author.release import release
    from grader.course import assignment_named

    for name in release([assignment_named(n) for n in args.assignments] or None):
        print(f"released notebooks/{name}/")
    return 0


def _check(args: argparse.Namespace) -> int:
    from grader.author.check import check

    problems = check()
    for problem in problems:
        print(f"✗ {problem}")
    print("✓ notebooks/ is current, stripped and leak-free; nbgrader metadata and mutants are consistent"
          if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


def _autograde(args: argparse.Namespace) -> int:
    from grader.batch.autograde import GradingEnvironmentBroken, Interrupted, SandboxUnavailable, autograde
    from grader.batch.shards import ShardError, parse_shard
    from grader.collect.deadlines import ConfigError, load_config
    from grader.collect.submissions import CollectionError
    from grader.course import assignments
    from grader.report.report import untimed_note
    from grader.results import printable, status_text

    if not args.submissions.exists():
        print(f"no such folder or zip: {args.submissions}", file=sys.stderr)
        return 2
    if not args.unsandboxed:
        from grader.kernel.limits import memory_enforcement

        print(f"memory of each submission limited by {memory_enforcement()}", file=sys.stderr)
    try:
        config = load_config(args.config, [a.name for a in assignments()])
        shard = parse_shard(args.shard) if args.shard else None
        results = autograde(args.submissions, args.out, jobs=args.jobs, timeout=args.timeout,
                            only=args.assignment, force=args.force, sandboxed=not args.unsandboxed,
                            config=config, feedback=args.feedback, shard=shard)
    except (ConfigError, ShardError, CollectionError) as err:
        print(f"nothing graded: {printable(str(err))}", file=sys.stderr)
        return 2
    except SandboxUnavailable as err:
        print(f"refusing to grade: {err}", file=sys.stderr)
        return 3
    except GradingEnvironmentBroken as err:
        print(f"grading stopped, no grades written: {printable(str(err))}", file=sys.stderr)
        return 4
    except KeyboardInterrupt:  # before any worker started (collecting, unpacking): nothing to stop
        print("\nstopped before grading began; nothing was graded", file=sys.stderr)
        return 130
    except Interrupted as err:
        print(f"\n{err}", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)  # everything is written and every process gone: no seconds of interpreter teardown
    flagged = [r for r in results if r.status]
    print(f"graded {len(results)} submission(s) into {args.out / 'grades.csv'}; "
          f"feedback in {args.out / 'feedback'}; report in {args.out / 'report' / 'report.html'}; "
          f"{len(flagged)} with a status note")
    for r in flagged:
        print(f"  {printable(r.student)}/{printable(r.assignment)}: {printable(status_text(r.status))}")
    if note := untimed_note(results):
        print(f"note: {note}")
    return 0


def _report(args: argparse.Namespace) -> int:
    from grader.report.report import write_report

    if not (args.graded / "results.json").is_file():
        print(f"{args.graded}: no results.json — run `python -m grader autograde … --out {args.graded}` first",
              file=sys.stderr)
        return 2
    print(f"wrote {write_report(args.graded, args.out)} and report.json beside it")
    return 0


def _export(args: argparse.Namespace) -> int:
    from grader.report.columns import ColumnError, parse_columns
    from grader.report.lms import ExportError, RosterError, export, read_roster
    from grader.results import printable

    try:
        done = export(args.graded, read_roster(args.roster, args.format), args.out, args.assignment or None,
                      parse_columns(args.column or []), args.new_column)
    except (RosterError, ExportError, ColumnError) as err:
        print(f"nothing exported: {printable(str(err))}", file=sys.stderr)
        return 2
    # Names, notes and assignments come from hand-ins and the roster: printed through the printable filter.
    print(f"wrote {args.out}: {len(done['matched'])} student(s) matched, for {args.format} "
          f"({printable(', '.join(done['assignments']))}); every match in {done['sidecar']}")
    for note in done["notes"]:
        print(f"note: {printable(str(note))}")
    if done["unmatched"]:
        print(f"{len(done['unmatched'])} hand-in(s) match no roster row (no grade exported for them):")
        for student in done["unmatched"]:
            print(f"  {printable(str(student))}")
    if done["without"]:
        print(f"{len(done['without'])} roster student(s) have no hand-in (no grade exported for them):")
        for line, name in zip(done["without"], done["without_names"]):
            print(f"  row {line}: {printable(str(name))}")
    return 0


def _merge(args: argparse.Namespace) -> int:
    from grader.batch.shards import ShardError, merge

    try:
        results = merge(args.out, args.shards)
    except ShardError as err:
        from grader.results import printable

        print(f"nothing merged: {printable(str(err))}", file=sys.stderr)
        return 2
    print(f"merged {len(args.shards)} shard(s), {len(results)} row(s), into {args.out / 'grades.csv'}; "
          f"feedback in {args.out / 'feedback'}; report in {args.out / 'report' / 'report.html'}")
    return 0


def _gradescope(args: argparse.Namespace) -> int:
    from grader.course import assignment_named
    from grader.platforms.gradescope import build_zip

    chosen = [assignment_named(n) for n in args.assignment or []]
    count = build_zip(args.out, chosen, args.feedback, args.timeout)
    print(f"wrote {args.out} ({count} files) for {', '.join(a.name for a in chosen) or 'every assignment'}: upload it "
          "as the autograder of a Gradescope programming assignment (README, Gradescope)")
    return 0


def _selftest(args: argparse.Namespace) -> int:
    import tempfile

    from grader.author.cribs import crib_problems, cribs
    from grader.author.selftest import mismatches, write_selftest_class
    from grader.batch.autograde import GradingEnvironmentBroken, autograde
    from grader.course import assignment_named, assignments
    from grader.judge.grading import plain_kernel_factory, reference_records
    from grader.results import status_text

    chosen = [assignment_named(n) for n in args.assignments] or assignments()
    out = args.keep or Path(tempfile.mkdtemp(prefix="selftest-"))
    expected = write_selftest_class(out / "class", chosen)
    try:
        results = autograde(out / "class", out / "graded", jobs=args.jobs, timeout=args.timeout, force=True)
    except GradingEnvironmentBroken as err:
        print(f"✗ grading stopped: {err}")
        return 1
    problems = mismatches({(r.student, r.assignment): (r.scores, status_text(r.status), r.messages, r.mistakes)
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
    print(f"cribs: {'none earns points' if not cribbed else f'{len(cribbed)} earn points or could not be checked'} "
          f"({sum(len(cribs(a)) for a in chosen)} visible functions and classes handed in as answers)")
    return 1 if problems or cribbed else 0


def _edition(args: argparse.Namespace) -> int:
    from grader.author.bootstrap import settings
    from grader.author.edition import EditionRefused, branch, commit_and_tag, refuse_existing_tag, warnings_for, write_edition

    s = settings()
    for warning in warnings_for(s):
        print(f"warning: {warning}", file=sys.stderr)
    try:
        if args.git:
            refuse_existing_tag(args.out, s)
        files = write_edition(args.out)
        tag = commit_and_tag(args.out) if args.git else None
    except EditionRefused as err:
        print(f"no edition written: {err}", file=sys.stderr)
        return 1
    size = sum(p.stat().st_size for p in files)
    print(f"wrote the student edition ({len(files)} files, {size / 2**20:.1f} MiB) to {args.out}")
    if tag:
        print(f"a git repository with the tag {tag}; publish it (public) with:\n"
              f"  git -C {args.out} remote add origin {s.git_url}  # once, unless it is a clone\n"
              f"  git -C {args.out} push origin {branch(args.out)} {tag}")
    return 0


def _nbgrader_init(args: argparse.Namespace) -> int:
    from grader.nbgrader.coursedir import InitError, init

    try:
        done = init(args.dir, args.course_id, args.exchange)
    except InitError as err:
        print(f"nothing written: {err}", file=sys.stderr)
        return 2
    print(f"nbgrader course directory {done.root} (course id {done.course_id}, exchange {done.exchange}): "
          f"nbgrader_config.py, source/ with {len(done.assignments)} assignments, student_nbgrader_config.py")
    if done.exchange_note:
        print(f"note: {done.exchange_note}")
    print(f"next: cd {done.root} && nbgrader generate_assignment 01_gradient_descent && "
          "nbgrader release_assignment 01_gradient_descent  (README, nbgrader on a hub)")
    return 0


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
                       help="run student code without the kernel sandbox (only for code you trust)")
    grade.add_argument("--config", type=Path,
                       help="TOML with due dates, extensions, the late policy and the feedback mode "
                            "(grader/collect/deadlines.py)")
    grade.add_argument("--feedback", choices=["after-release", "at-once"],
                       help="feedback pages with the hidden tests' messages (after-release, the default) or only "
                            "the points per test (at-once); overrides the config")
    grade.add_argument("--shard", metavar="K/N",
                       help="grade only shard K of N (a fixed split by student); join the shards with `merge`")
    grade.set_defaults(run=_autograde)
    report = commands.add_parser("report", help="the class report (HTML + JSON) of a graded folder")
    report.add_argument("graded", type=Path, help="a folder autograde wrote (with results.json)")
    report.add_argument("--out", type=Path, help="write report.html and report.json here (default: GRADED/report/)")
    report.set_defaults(run=_report)
    lms = commands.add_parser("export", help="grades as Canvas, Gradescope or Moodle import them, matched to their roster")
    lms.add_argument("--format", required=True, choices=["canvas", "gradescope", "moodle"])
    lms.add_argument("--roster", required=True, type=Path, help="the LMS's own export of the class (see grader/report/lms.py)")
    lms.add_argument("--assignment", action="append", help="export only this assignment (repeatable)")
    lms.add_argument("--column", action="append", metavar="ASSIGNMENT=COLUMN",
                     help="the roster column (its exact header) that ASSIGNMENT fills, for Canvas and the Moodle "
                          "gradebook (repeatable; default: the one column whose title fits the assignment's name)")
    lms.add_argument("--new-column", action="store_true",
                     help="write an assignment no roster column fits as a new column (Canvas's import then creates "
                          "a new assignment); without it, that is an error")
    lms.add_argument("graded", type=Path, help="a folder autograde wrote (with grades.csv)")
    lms.add_argument("out", type=Path, help="the CSV to write (OUT.matching.csv lists every match beside it)")
    lms.set_defaults(run=_export)
    merge = commands.add_parser("merge", help="join the outputs of `autograde --shard K/N` runs into one")
    merge.add_argument("out", type=Path, help="write grades.csv, results.json, feedback/ and report/ here")
    merge.add_argument("shards", type=Path, nargs="+", help="the --out folder of every shard")
    merge.set_defaults(run=_merge)
    gradescope = commands.add_parser("gradescope", help="write a Gradescope autograder zip (setup.sh, run_autograder)")
    gradescope.add_argument("out", type=Path, help="the zip to write")
    gradescope.add_argument("--assignment", action="append", help="the assignment it grades (repeatable; default: any)")
    gradescope.add_argument("--feedback", choices=["after-release", "at-once"], default="after-release",
                            help="hidden tests' messages shown after the due date (default) or points only, at once")
    gradescope.add_argument("--timeout", type=int, default=30, help="seconds per cell (default 30)")
    gradescope.set_defaults(run=_gradescope)
    edition = commands.add_parser("edition", aliases=["bundle"],
                                  help="write the student edition: notebooks, helpers, its own README, pyproject and "
                                       "course script; no solutions, hidden tests, grader or mutants")
    edition.add_argument("out", type=Path, help="a new folder, or a git clone of an earlier edition (with --git)")
    edition.add_argument("--git", action="store_true",
                         help="commit it and tag it with the release tag of [tool.training-mechanics-lab] student-edition")
    edition.set_defaults(run=_edition)
    selftest = commands.add_parser("selftest", help="grade reference, blank, mutant and crib submissions; fail on any surprise")
    selftest.add_argument("assignments", nargs="*", help="only these (default: all)")
    selftest.add_argument("--jobs", type=int, default=os.cpu_count())
    selftest.add_argument("--timeout", type=int, default=30, help="seconds per cell")
    selftest.add_argument("--keep", type=Path, help="write the class and grades here (default: a temp folder)")
    selftest.set_defaults(run=_selftest)
    hub = commands.add_parser("nbgrader", help="use the course in nbgrader's own workflow (exchange, autograde, formgrader)")
    hub_commands = hub.add_subparsers(dest="nbgrader_command", required=True)
    hub_init = hub_commands.add_parser("init", help="write or update an nbgrader course directory graded by this course")
    hub_init.add_argument("dir", type=Path, help="the course directory (made if missing; the gradebook is kept)")
    hub_init.add_argument("--course-id", default="training-mechanics-lab", help="nbgrader's course id")
    hub_init.add_argument("--exchange", type=Path, help="the exchange folder (default: nbgrader's /srv/nbgrader/exchange)")
    hub_init.set_defaults(run=_nbgrader_init)
    from grader.author.demo import add_demo_command
    add_demo_command(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    from grader.author.bootstrap import SettingsError
    from grader.course import put_interpreter_on_path

    put_interpreter_on_path()
    args = build_parser().parse_args(argv)
    if args.command == "autograde" and argv is None and not args.unsandboxed:
        _prefer_a_memory_cgroup()
    try:
        return args.run(args)
    except SettingsError as err:   # pyproject.toml's course settings: one line that says what to fix
        print(f"error: {err}", file=sys.stderr)
        return 2


def _prefer_a_memory_cgroup() -> None:
    """A grader with no memory cgroup reruns itself in a delegated systemd user scope, where there is one."""
    from grader.kernel.limits import SCOPE_ENV, systemd_scope

    scoped = systemd_scope([sys.executable, "-m", "grader", *sys.argv[1:]])
    if scoped is not None:
        print("grader: rerunning in a systemd user scope, for a memory cgroup per submission", file=sys.stderr)
        os.environ[SCOPE_ENV] = "1"
        os.execv(scoped[0], scoped)
