"""`autograde`: grade a whole class in parallel worker processes, one CSV row per student and assignment."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import queue
import select
import shutil
import signal
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict
from pathlib import Path

import nbformat
from tqdm import tqdm

from grader.author.release import generate
from grader.collect.deadlines import Config, Lateness, Override, check_students, lateness, overrides_for, settle
from grader.collect.submissions import MAX_NOTEBOOK_BYTES, Submission, collect, unpack_zip
from grader.course import Assignment, assignments
from grader.judge.grading import GradingEnvironmentBroken, known_mistakes, plain_kernel_factory, reference_records
from grader.kernel import kernelspec, limits, sandbox
from grader.kernel.harness import own_cells_budget
from grader.paths import BUILD, KERNEL_PACKAGES, PYPROJECT, REPO
from grader.report.outputs import write_outputs
from grader.results import Note, NoteKind, Result, Spec

TEMPLATES = BUILD / "grading-templates"
# Seconds a worker may spend beyond the per-cell limits (kernel start, nbgrader, feedback HTML).
WORKER_OVERHEAD_S = 120


__all__ = ["GradingEnvironmentBroken", "SandboxUnavailable", "autograde"]


class SandboxUnavailable(RuntimeError):
    """Raised when untrusted code would run without isolation and the instructor did not accept that."""


def code_digest(root: Path = REPO) -> str:
    """Everything that can change a grade besides the hand-in: grader/ (with the nbgrader config and the
    mutants), helpers/, the sandbox's limits, torch and Python."""
    import torch

    digest = hashlib.sha256(f"{torch.__version__}\0{sys.version}\0{limits.limits_key()}".encode())
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
            digest.update(sub.notebook.name.encode() + b"\0" + _read_bounded(sub.notebook))
        except OSError as exc:  # unreadable now: the worker will say so; hash the reason
            digest.update(type(exc).__name__.encode())
    if assignment is not None:
        digest.update(assignment.source.read_bytes())
    return digest.hexdigest()


def _read_bounded(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        return f.read(MAX_NOTEBOOK_BYTES + 1)


class WorkerProcess:
    """One long-lived `python -m grader.batch.worker`, restarted whenever it dies or overruns."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.env, self.log = env, log
        self.process: subprocess.Popen | None = None

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

    def close(self) -> None:
        if self.process is not None and self.process.stdin:
            self.process.stdin.close()
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
        return Result(spec.student, spec.assignment, {}, {}, [note])


def _zero_filled(result: Result, maxima: dict[str, float]) -> Result:
    result.max_scores = result.max_scores or dict(maxima)
    result.scores = {k: result.scores.get(k, 0.0) for k in result.max_scores}
    return result


def _apply_lateness(result: Result, sub: Submission, late: Lateness, overrides: list[Override]) -> Result:
    """Record when the hand-in came; the instructor's overrides and the late policy decide its points."""
    result.submitted_at = sub.submitted_at
    return settle(result, late, overrides)


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
    """
    config = config or Config()
    feedback = feedback or config.feedback
    if sandboxed and (why := sandbox.why_unavailable()):
        raise SandboxUnavailable(
            f"the kernel sandbox cannot be built here ({why}), so student code would run with your permissions. "
            "It needs Linux user namespaces (`python -m grader.kernel.sandbox check` says more); or pass --unsandboxed "
            "to grade without isolation at your own risk.")
    if sandboxed:
        kernelspec.install_kernelspec()
    jobs = jobs or os.cpu_count() or 1
    work = out / ".work"
    known = {a.name: a for a in assignments()}
    root = submissions
    if submissions.is_file():
        root = unpack_zip(submissions, Path(tempfile.mkdtemp(prefix="unpacked-", dir=_mkdir(work))), list(known.values()),
                          only)
    subs = collect(root, list(known.values()), only)
    # a typo in an extension or override stops here, before any grading
    config = check_students(config, {s.student for s in subs}, {name: a.grade_cells() for name, a in known.items()})
    for line in config.matched if progress else ():
        print(line)
    if shard is not None:
        from grader.batch.shards import in_shard, write_manifest

        write_manifest(_mkdir(out), shard, subs)
        subs = [s for s in subs if in_shard(s.student, *shard)]
    graded = sorted({s.assignment for s in subs if s.assignment in known})
    # (no template when nothing is graded: release.generate would read an empty list as "every assignment")
    template = _template([known[a] for a in graded]) if graded else Path()

    env = dict(os.environ)
    # Parallel kernels share the cores: one torch thread per kernel keeps them from fighting.
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // jobs)))
    # What every hidden observation must be, from the reference solution (raises when it fails here),
    # and what each known mistake records (to name the one a wrong answer behaves like). Cached per version.
    def prepare(name: str) -> None:
        kernels = plain_kernel_factory({"OMP_NUM_THREADS": env["OMP_NUM_THREADS"]})
        reference_records(known[name], kernels, timeout)
        known_mistakes(known[name], kernels, timeout, jobs)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(prepare, graded))
    code = code_digest()
    results: list[Result] = []
    pending: list[tuple[Spec, str, float]] = []
    late_of: dict[tuple[str, str], tuple[Submission, Lateness, list[Override]]] = {}
    for sub in subs:
        assignment = known.get(sub.assignment)
        result_path = work / "results" / sub.student / f"{sub.assignment}.json"
        late = lateness(config, sub.student, sub.assignment, sub.submitted_at)
        by_hand = overrides_for(config, sub.student, sub.assignment)
        late_of[sub.student, sub.assignment] = (sub, late, by_hand)
        page = json.dumps([feedback, asdict(late), [asdict(o) for o in by_hand]])
        fingerprint = _fingerprint(sub, assignment, timeout, sandboxed, code, page)
        stamp = result_path.with_suffix(".fingerprint")
        if assignment is None:
            notes = [*sub.notes, *([sub.problem] if sub.problem else [])]
            results.append(_apply_lateness(Result(sub.student, sub.assignment, {}, {}, notes), sub, late, by_hand))
            continue
        if not force and result_path.exists() and stamp.exists() and stamp.read_text() == fingerprint:
            results.append(_apply_lateness(Result.read(result_path), sub, late, by_hand))
            continue
        stamp.unlink(missing_ok=True)
        spec = Spec(student=sub.student, assignment=sub.assignment, notebook=assignment.notebook,
                    submitted=str(sub.notebook or ""), template=str(template), result=str(result_path),
                    feedback=str(out / "feedback" / sub.student / sub.assignment / f"{assignment.name}.html"),
                    timeout=timeout, sandbox=sandboxed, problem=sub.problem, notes=sub.notes,
                    feedback_mode=feedback, lateness=asdict(late) if late.due else {},
                    overrides=[asdict(o) for o in by_hand])
        code_cells = sum(c.cell_type == "code" for c in nbformat.read(assignment.source, as_version=4).cells)
        # Every cell and test at its limit, twice over (a crash replays what ran), plus the student's own cells.
        pending.append((spec, fingerprint, 2 * timeout * code_cells + own_cells_budget(timeout) + WORKER_OVERHEAD_S))

    workers = [WorkerProcess(env, work / "logs" / f"worker-{i}.log") for i in range(min(jobs, len(pending)))]
    idle: queue.Queue[WorkerProcess] = queue.Queue()
    for worker in workers:
        idle.put(worker)

    def run(spec: Spec, wall: float) -> Result:
        worker = idle.get()
        try:
            return worker.grade(spec, wall)
        finally:
            idle.put(worker)

    # Every worker checks its environment on the reference before any student's code runs anywhere, so a
    # hand-in cannot starve a canary (and stop the batch) by hogging the machine.
    broken = _warm_up(workers, [(spec, wall) for spec, _, wall in pending])
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(run, spec, wall): (spec, fp) for spec, fp, wall in pending}
        bar = tqdm(as_completed(futures), total=len(futures), desc="grading", unit="submission", disable=not progress)
        for future in bar:
            if future.cancelled():
                continue
            spec, fingerprint = futures[future]
            result = future.result()
            if result.broken:  # the canary failed: stop, and never write a grade for anyone
                broken = broken or result.broken
                for other in futures:
                    other.cancel()
                continue
            if broken:
                continue
            # Kept like a grade even when the worker died on it: a hand-in that crashes the grader is
            # reported once, not regraded (and crashing) on every run; --force tries again.
            result = _apply_lateness(_zero_filled(result, known[spec.assignment].grade_cells()),
                                     *late_of[spec.student, spec.assignment])
            result.write(Path(spec.result))
            Path(spec.result).with_suffix(".fingerprint").write_text(fingerprint)
            results.append(result)
    for worker in workers:
        worker.close()
    if broken:
        raise GradingEnvironmentBroken(broken)
    write_outputs(results, known, out, report=report)
    return results


def _warm_up(workers: list[WorkerProcess], pending: list[tuple[Spec, float]]) -> str:
    """Run each worker's canary for every assignment in `pending`, all before grading; '' or why it failed.

    A canary grades the reference notebook, so it gets the wall-clock budget of one submission."""
    firsts = {spec.assignment: (spec, wall) for spec, wall in pending}
    if not workers or not firsts:
        return ""

    def check(worker: WorkerProcess) -> str:
        for first, wall in firsts.values():
            probe = dataclasses.replace(first, student="", canary_only=True,
                                        result=str(Path(first.result).parent.parent / f".canary-{id(worker)}.json"))
            result = worker.grade(probe, wall)
            # no points to give (notebook 00) is no failure; no points and a note is a worker that died
            problem = result.broken or ("" if result.max_scores else "; ".join(note.text for note in result.status))
            if problem:
                return problem
        return ""

    with ThreadPoolExecutor(max_workers=len(workers)) as pool:
        return next((p for p in pool.map(check, workers) if p), "")


def _template(chosen: list[Assignment]) -> Path:
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
    if not folder.exists():
        partial = Path(tempfile.mkdtemp(prefix="partial-", dir=_mkdir(TEMPLATES)))
        generate(partial, chosen)
        try:
            partial.rename(folder)
        except OSError:  # another run made it first
            shutil.rmtree(partial, ignore_errors=True)
    return folder


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path
