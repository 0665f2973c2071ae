"""`autograde`: grade a whole class in parallel worker processes, one CSV row per student and assignment."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import queue
import select
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TypeVar

import nbformat
from tqdm import tqdm

from grader.batch import stopping
from grader.batch.shards import prune_pages
from grader.batch.templates import TEMPLATES, grading_template  # noqa: F401 (gradescope's, and tests')
from grader.collect.deadlines import Config, Lateness, Override, check_students, lateness, overrides_for, settle
from grader.collect.files import read_regular
from grader.collect.ledger import LEDGER, Ledger
from grader.collect.submissions import MAX_NOTEBOOK_BYTES, Submission, collect, unpack_zip
from grader.course import Assignment, assignments
from grader.judge.reference import GradingEnvironmentBroken, records_path, released_notebook, torch_version
from grader.kernel import kernelspec, limits, sandbox
from grader.kernel.harness import own_cells_budget
from grader.kernel.sandbox import remove_tree
from grader.paths import BUILD, KERNEL_PACKAGES, REPO, SOLUTIONS
from grader.report.outputs import write_outputs
from grader.report.report import load_plotting
from grader.results import Note, NoteKind, Result, Spec, printable, status_text

T = TypeVar("T")
R = TypeVar("R")
# Seconds a worker may spend beyond the per-cell limits (kernel start, nbgrader, feedback HTML).
WORKER_OVERHEAD_S = 120


__all__ = ["GradingEnvironmentBroken", "Interrupted", "SandboxUnavailable", "autograde"]
Interrupted = stopping.Interrupted


class SandboxUnavailable(RuntimeError):
    """Raised when untrusted code would run without isolation and the instructor did not accept that."""


def code_digest(root: Path = REPO) -> str:
    """Everything that can change a grade besides the hand-in: grader/ (with the nbgrader config and the
    mutants), helpers/, the sandbox's limits, torch and Python."""
    digest = hashlib.sha256(f"{torch_version()}\0{sys.version}\0{limits.limits_key()}".encode())
    for folder in (root / "grader", *(root / package.name for package in KERNEL_PACKAGES)):
        for path in sorted(folder.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _fingerprint(sub: Submission, assignment: Assignment | None, timeout: int, sandboxed: bool, code: str,
                 page: str = "") -> str:
    """Changes whenever the hand-in, the assignment's source, the grader or the grading settings change.

    `page`: what else the feedback page shows (its mode and the lateness), so a new setting rewrites it.
    """
    problem = sub.problem.text if sub.problem else ""
    digest = hashlib.sha256(f"{sub.student}\0{sub.assignment}\0{timeout}\0{sandboxed}\0{problem}\0{code}\0{page}".encode())
    digest.update("\0".join(note.text for note in sub.notes).encode())
    if sub.notebook is not None:
        try:
            digest.update(sub.notebook.name.encode() + b"\0" + read_regular(sub.notebook, MAX_NOTEBOOK_BYTES + 1))
        except OSError as exc:  # unreadable now: the worker will say so; hash the reason
            digest.update(type(exc).__name__.encode())
    if assignment is not None:
        digest.update(assignment.source.read_bytes())
    return digest.hexdigest()


class WorkerProcess:
    """One long-lived `python -m grader.batch.worker`, restarted whenever it dies or overruns."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.env, self.log = env, log
        self.process: subprocess.Popen | None = None
        self.halted = False

    def _start(self) -> subprocess.Popen:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        # A session of its own, so a stuck worker is stopped with everything it started.
        return subprocess.Popen([sys.executable, "-m", "grader.batch.worker"], env=self.env, text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=open(self.log, "a"), start_new_session=True)

    def stop(self) -> None:
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()
        self.process = None

    def halt(self) -> None:
        """Stop for good: the worker (and everything it started) now, and no new one later."""
        self.halted = True
        if self.process is not None:
            stopping.kill_tree(self.process.pid, include_self=True)
        self.stop()

    def finish(self) -> None:
        """Tell the worker there is nothing more to grade (it then stops its kernels and exits)."""
        if self.process is not None and self.process.stdin:
            with contextlib.suppress(OSError):
                self.process.stdin.close()

    def close(self) -> None:
        """Wait for the worker to exit after `finish`; stop it after 10 s."""
        self.finish()
        if self.process is not None:
            try:
                self.process.wait(timeout=10)
                self.process = None
            except subprocess.TimeoutExpired:
                self.stop()

    def grade(self, spec: Spec, wall_s: float) -> Result:
        """Grade one spec; whatever happens to the worker, return a Result."""
        spec_path = Path(spec.result).with_suffix(".spec.json")
        spec_path.parent.mkdir(parents=True, exist_ok=True)
        spec_path.write_text(spec.to_json())
        Path(spec.result).unlink(missing_ok=True)
        if self.halted:
            return Result(spec.student, spec.assignment, {}, {}, [Note(NoteKind.GRADER_ERROR, "the batch was stopped")])
        if self.process is None or self.process.poll() is not None:
            self.process = self._start()
        assert self.process.stdin and self.process.stdout
        try:
            self.process.stdin.write(f"{spec_path}\n")
            self.process.stdin.flush()
            ready, _, _ = select.select([self.process.stdout], [], [], wall_s)
            answer = self.process.stdout.readline() if ready else None
        except (BrokenPipeError, OSError):
            answer = ""
        if answer and Path(spec.result).exists():
            return Result.read(Path(spec.result))
        note = (Note(NoteKind.LIMIT_HIT, f"grading stopped after {wall_s:.0f} s (see {self.log.name})") if answer is None
                else Note(NoteKind.GRADER_ERROR, f"grader process died (see {self.log.name})"))
        self.stop()
        Path(spec.feedback).unlink(missing_ok=True)  # a page the worker wrote before it died is not this row's
        return Result(spec.student, spec.assignment, {}, {}, [note])


@dataclass
class _Pending:
    """One hand-in to grade: its spec, fingerprint, wall-clock budget, and what its row needs besides the grade."""

    spec: Spec
    fingerprint: str
    wall: float
    sub: Submission
    late: Lateness
    overrides: list[Override]


def _zero_filled(result: Result, maxima: dict[str, float]) -> Result:
    result.max_scores = result.max_scores or dict(maxima)
    result.scores = {k: result.scores.get(k, 0.0) for k in result.max_scores}
    return result


def _apply_lateness(result: Result, sub: Submission, late: Lateness, overrides: list[Override]) -> Result:
    """Record when the hand-in came; the instructor's overrides and the late policy decide its points."""
    result.submitted_at = sub.submitted_at
    return settle(result, late, overrides)


@dataclass
class _Run:
    """What every step of one autograde run works with."""

    out: Path
    known: dict[str, Assignment]
    config: Config
    feedback: str
    timeout: int
    sandboxed: bool
    jobs: int
    env: dict[str, str] = field(default_factory=dict)
    kept: int = 0  # rows graded and written by this run (what an interrupted run keeps)

    @property
    def work(self) -> Path:
        return self.out / ".work"


def autograde(
    submissions: Path,
    out: Path,
    *,
    jobs: int | None = None,
    timeout: int = 30,
    only: str | None = None,
    force: bool = False,
    progress: bool = True,
    sandboxed: bool = True,
    config: Config | None = None,
    feedback: str | None = None,
    shard: tuple[int, int] | None = None,
    report: bool = True,
) -> list[Result]:
    """Grade every submission under `submissions` (folder or zip) into `out`; returns the rows written.

    Results are kept per submission with a fingerprint, so a re-run (after an interruption, or with
    new submissions) grades only what changed; `force` grades everything again. Student code runs
    in the kernel sandbox (grader.kernel.sandbox) unless `sandboxed` is False. `config` holds due dates,
    extensions and the late policy (grader/collect/deadlines.py; checked against the class before grading);
    `feedback` the feedback page's mode (default: the config's, else "after-release"). `shard` = (K, N)
    grades only the students of shard K of N (grader/batch/shards.py); `grader merge` joins the shards.
    Ctrl-C or SIGTERM stops it within seconds (grader/batch/stopping.py): `Interrupted` is raised, no
    worker, fork server or kernel is left, hand-ins in progress get no row, and what was graded stays cached.
    """
    config = config or Config()
    _check_sandbox(sandboxed, [submissions, out])
    jobs = jobs or os.cpu_count() or 1
    run = _Run(out, {a.name: a for a in assignments()}, config, feedback or config.feedback, timeout, sandboxed, jobs)
    with stopping.sigterm_as_interrupt(), _unpacked(submissions, run, only) as root:
        try:
            subs = _collected(root, run, only, shard, progress)
            # parallel kernels share the cores: one torch thread per kernel keeps them from fighting
            run.env = {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // jobs)), **os.environ}
            graded = sorted({s.assignment for s in subs if s.assignment in run.known})
            # (no template when nothing is graded: release.generate would read an empty list as "every assignment")
            template = grading_template([run.known[a] for a in graded]) if graded else Path()
            _prepare(run, graded, progress)
            results, pending = _plan(run, subs, template, force)
            if report and pending:  # this process waits while the workers grade: time to load the report's plotting
                threading.Thread(target=load_plotting, daemon=True).start()
            results += _grade(run, pending, progress)
        except KeyboardInterrupt as stop:
            with stopping.deferred_interrupts():  # a second Ctrl-C does not stop the clean-up half-way
                stopping.kill_tree(os.getpid())
                sandbox.sweep_stale_folders()
            raise stopping.Interrupted(str(stop) or "SIGINT", run.kept) from None
    try:  # every row is cached: stopped here, the same command writes these files again (each is written whole)
        with stopping.sigterm_as_interrupt():
            prune_pages(out, results)  # no page of an earlier grade for a row with a problem, or for a student gone
            write_outputs(results, run.known, out, report=report)
    except KeyboardInterrupt as stop:
        raise stopping.Interrupted(str(stop) or "SIGINT", run.kept) from None
    if shard is not None:  # last: a shard whose run did not get here is refused by merge
        from grader.batch.shards import seal

        seal(out)
    return results


def _check_sandbox(sandboxed: bool, inputs: list[Path]) -> None:
    if sandboxed and (seen := sandbox.exposed([SOLUTIONS, BUILD, REPO / "grader", *inputs])):
        raise SandboxUnavailable(
            f"the kernel sandbox shows {', '.join(map(str, seen))} to student code: it binds the system's folders "
            f"read-only ({', '.join(sandbox.ro_binds()[:7])} …) and this is inside one. Keep the course, the "
            "hand-ins and the output folder elsewhere (e.g. under /srv or your home).")
    if sandboxed and (why := sandbox.why_unavailable()):
        raise SandboxUnavailable(
            f"the kernel sandbox cannot be built here ({why}), so student code would run with your permissions. "
            "It needs Linux user namespaces (`python -m grader.kernel.sandbox check` says more); or pass --unsandboxed "
            "to grade without isolation at your own risk.")
    if sandboxed:
        kernelspec.install_kernelspec()


@contextlib.contextmanager
def _unpacked(submissions: Path, run: _Run, only: str | None) -> Iterator[Path]:
    """`submissions` as a folder: itself, or an LMS zip unpacked into the one place each run uses, removed after."""
    if not submissions.is_file():
        yield submissions
        return
    root = run.work / "unpacked"
    remove_tree(root)  # what a run that was killed left
    try:
        unpacked = unpack_zip(submissions, _mkdir(root), list(run.known.values()), only)
        for line in unpacked.report(submissions.name):  # each member left out named, each student keyed apart
            print(printable(line), file=sys.stderr)
        yield unpacked.root
    finally:
        with stopping.deferred_interrupts():  # a second Ctrl-C while stopping leaves no half-removed folder
            remove_tree(root)


def _collected(root: Path, run: _Run, only: str | None, shard: tuple[int, int] | None,
               progress: bool) -> list[Submission]:
    """The class's hand-ins (only this shard's students when sharding), the config checked against the class."""
    subs = collect(root, list(run.known.values()), only)
    # a typo in an override stops here, before any grading (in an extension: a warning)
    run.config = check_students(run.config, {s.student for s in subs},
                                {name: {**a.grade_cells(), **a.written_cells()} for name, a in run.known.items()})
    for line in run.config.matched if progress else ():
        print(line)
    for line in run.config.warnings:
        print(printable(line), file=sys.stderr)
    if shard is None:
        return subs
    from grader.batch.shards import grading_digest, in_shard, write_manifest

    grading = grading_digest(code_digest(), [run.timeout, run.sandboxed, run.feedback], run.config, run.known)
    write_manifest(_mkdir(run.out), shard, subs, grading)
    return [s for s in subs if in_shard(s.student, *shard)]


def _prepare(run: _Run, graded: list[str], progress: bool = False) -> None:
    """What every hidden observation must be, from the reference solution (raises when it fails here), and what
    each known mistake records (to name the one a wrong answer behaves like). Cached per version: when every
    file is there, this process does not even import the judge (and torch with it); the workers read them."""
    releases = {name: released_notebook(run.known[name]) for name in graded}
    missing = sorted({name for name in graded for kind in ("", "mutants")
                      if not records_path(run.known[name], releases[name], kind).exists()})
    if not missing:
        return
    from grader.judge.grading import known_mistakes, plain_kernel_factory, reference_records

    threads = run.env["OMP_NUM_THREADS"]  # as many as a grading kernel gets
    # Trusted code only, so sandboxing is not what these kernels need, but warm starts are: a plain kernel
    # imports torch and the notebook's packages afresh, a forked one has them.
    # the bar: the first run of a new course version spends about a minute here, silent without it
    with (kernelspec.servers_for_threads(run.jobs, threads) if run.sandboxed
          else contextlib.nullcontext(plain_kernel_factory({"OMP_NUM_THREADS": threads}))) as kernels, \
            tqdm(total=len(missing), desc="new course version: recording reference runs", disable=not progress) as bar:
        def prepare(name: str) -> None:
            reference_records(run.known[name], kernels, run.timeout)
            known_mistakes(run.known[name], kernels, run.timeout, run.jobs)
            bar.update()

        _parallel(prepare, missing, run.jobs)


def _parallel(function: Callable[[T], R], items: list[T], jobs: int) -> list[R]:
    """`function` over `items` in `jobs` threads. Unlike `with ThreadPoolExecutor`, an interrupt is not held up
    until every thread has finished (the caller kills what the threads wait for)."""
    pool = ThreadPoolExecutor(max_workers=max(1, jobs))
    try:
        return list(pool.map(function, items))
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def _plan(run: _Run, subs: list[Submission], template: Path, force: bool) -> tuple[list[Result], list[_Pending]]:
    """Rows known without grading (no assignment, or cached with the same fingerprint), and the specs to grade."""
    code, ledger = code_digest(), Ledger(run.work / LEDGER)  # which hand-in each override was given for
    results: list[Result] = []
    pending: list[_Pending] = []
    for sub in subs:
        assignment = run.known.get(sub.assignment)
        result_path = run.work / "results" / sub.student / f"{sub.assignment}.json"
        late = lateness(run.config, sub.student, sub.assignment, sub.submitted_at)
        by_hand = ledger.check(overrides_for(run.config, sub.student, sub.assignment), sub.notebook)
        fingerprint = _fingerprint(sub, assignment, run.timeout, run.sandboxed, code,
                                   json.dumps([run.feedback, asdict(late), [asdict(o) for o in by_hand]]))
        stamp = result_path.with_suffix(".fingerprint")
        if assignment is None:
            notes = [*sub.notes, *([sub.problem] if sub.problem else [])]
            results.append(_apply_lateness(Result(sub.student, sub.assignment, {}, {}, notes), sub, late, by_hand))
        elif not force and result_path.exists() and stamp.exists() and stamp.read_text() == fingerprint:
            results.append(_apply_lateness(Result.read(result_path), sub, late, by_hand))
        else:
            stamp.unlink(missing_ok=True)
            (run.out / "feedback" / sub.student / sub.assignment / f"{sub.assignment}.html").unlink(missing_ok=True)
            spec = Spec(student=sub.student, assignment=sub.assignment, notebook=assignment.notebook,
                        submitted=str(sub.notebook or ""), template=str(template), result=str(result_path),
                        feedback=str(run.out / "feedback" / sub.student / sub.assignment / f"{assignment.name}.html"),
                        timeout=run.timeout, sandbox=run.sandboxed, problem=sub.problem, notes=sub.notes,
                        feedback_mode=run.feedback, lateness=asdict(late) if late.due else {},
                        overrides=[asdict(o) for o in by_hand])
            pending.append(_Pending(spec, fingerprint, _wall_budget(assignment, run.timeout), sub, late, by_hand))
    ledger.save()
    for line in ledger.unpinned:  # what the instructor pastes into the [[override]] to tie it to the hand-in read
        print(f"override not pinned to a hand-in: {printable(line)}", file=sys.stderr)
    return results, pending


def _wall_budget(assignment: Assignment, timeout: int) -> float:
    """Every cell and test at its limit, twice over (a crash replays what ran), plus the student's own cells
    (their budget, and up to two cells' limits for the definitions that run after it: harness.defines_only)."""
    code_cells = sum(c.cell_type == "code" for c in nbformat.read(assignment.source, as_version=4).cells)
    return 2 * timeout * code_cells + own_cells_budget(timeout) + 2 * timeout + WORKER_OVERHEAD_S


def _grade(run: _Run, pending: list[_Pending], progress: bool) -> list[Result]:
    """Grade `pending` in parallel workers; each row is written (and cached) the moment it is graded."""
    workers = [WorkerProcess(run.env, run.work / "logs" / f"worker-{i}.log") for i in range(min(run.jobs, len(pending)))]
    idle: queue.Queue[WorkerProcess] = queue.Queue()
    for worker in workers:
        idle.put(worker)
    left, counting = [len(pending)], threading.Lock()

    def grade_one(item: _Pending) -> Result:
        worker = idle.get()
        with counting:  # fewer hand-ins left than workers: this one likely gets no other, so no kernel ahead
            left[0] -= 1
            last = left[0] < len(workers)
        try:
            return worker.grade(dataclasses.replace(item.spec, last=last), item.wall)
        finally:
            idle.put(worker)

    results: list[Result] = []
    pool = ThreadPoolExecutor(max_workers=run.jobs)
    try:
        # Every worker checks its environment on the reference before any student's code runs anywhere, so a
        # hand-in cannot starve a canary (and stop the batch) by hogging the machine.
        broken = _warm_up(workers, [(item.spec, item.wall) for item in pending])
        futures = {pool.submit(grade_one, item): item for item in ([] if broken else pending)}
        bar = tqdm(as_completed(futures), total=len(futures), desc="grading", unit="submission", disable=not progress)
        for future in bar:
            result = future.result()
            if result.broken:  # the canary failed: stop, and never write a grade for anyone
                broken = result.broken
                break
            results.append(_record(run, futures[future], result))
            run.kept += 1
    except KeyboardInterrupt:  # no worker may start again, none may finish what it was grading
        with stopping.deferred_interrupts():
            for worker in workers:
                worker.halt()
        raise
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        for worker in workers:  # all of them at once: each takes a moment to stop its kernels
            worker.finish()
        for worker in workers:
            worker.close()
    if broken:
        raise GradingEnvironmentBroken(broken)
    return results


def _record(run: _Run, item: _Pending, result: Result) -> Result:
    """Write one graded row and its fingerprint. Kept like a grade even when the worker died on it: a hand-in that
    crashes the grader is reported once, not regraded (and crashing) on every run; --force tries again."""
    result = _apply_lateness(_zero_filled(result, run.known[item.spec.assignment].grade_cells()), item.sub, item.late,
                             item.overrides)
    result.write(Path(item.spec.result))
    Path(item.spec.result).with_suffix(".fingerprint").write_text(item.fingerprint)
    return result


def _warm_up(workers: list[WorkerProcess], pending: list[tuple[Spec, float]]) -> str:
    """Run each worker's canary for every assignment in `pending`, all before grading; '' or why it failed.

    A canary grades the reference notebook, so it gets the wall-clock budget of one submission."""
    firsts = {spec.assignment: (spec, wall) for spec, wall in pending}
    if not workers or not firsts:
        return ""

    def check(worker: WorkerProcess) -> str:
        for first, wall in firsts.values():
            probe = dataclasses.replace(first, student="", canary_only=True, notes=[],
                                        result=str(Path(first.result).parent.parent / f".canary-{id(worker)}.json"))
            result = worker.grade(probe, wall)
            # the worker died or ran out of time (an assignment without tests, like 00, also has no max_scores)
            died = not result.max_scores and any(n.kind in (NoteKind.GRADER_ERROR, NoteKind.LIMIT_HIT) for n in result.status)
            problem = result.broken or (status_text(result.status) if died else "")
            if problem:
                return problem
        return ""

    return next((p for p in _parallel(check, workers, len(workers)) if p), "")


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path
