"""`autograde`: grade a whole class in parallel worker processes, one CSV row per student and assignment."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict
from pathlib import Path

import nbformat
from tqdm import tqdm

from grader.course import Assignment, assignments
from grader.release import generate
from grader.submissions import Submission, collect, unpack_zip
from grader.worker import Result, Spec

# Seconds a worker may spend beyond the per-cell limits (kernel start, nbgrader, feedback HTML).
WORKER_OVERHEAD_S = 120


def _fingerprint(sub: Submission, assignment: Assignment | None, timeout: int) -> str:
    """Changes whenever the hand-in, the assignment's source or the grading settings change."""
    digest = hashlib.sha256(f"{sub.student}\0{sub.assignment}\0{timeout}\0{sub.problem}".encode())
    for path in sub.files:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    if assignment is not None:
        digest.update(assignment.source.read_bytes())
    for module in ("worker.py", "preprocessors.py", "nbgrader_config.py"):
        digest.update((Path(__file__).parent / module).read_bytes())
    return digest.hexdigest()


def _stop(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def _run_worker(spec: Spec, wall_s: float, env: dict[str, str]) -> Result:
    """Run one worker process; whatever happens to it, return a Result."""
    spec_path = Path(spec.result).with_suffix(".spec.json")
    spec_path.parent.mkdir(parents=True, exist_ok=True)
    spec_path.write_text(json.dumps(asdict(spec)))
    Path(spec.result).unlink(missing_ok=True)
    # A session of its own, so a stuck worker is stopped with everything it started.
    process = subprocess.Popen([sys.executable, "-m", "grader.worker", str(spec_path)], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        _, stderr = process.communicate(timeout=wall_s)
    except subprocess.TimeoutExpired:
        _stop(process)
        stderr, note = b"", f"grading stopped after {wall_s:.0f} s"
    else:
        note = "" if process.returncode == 0 else f"grader crashed (exit {process.returncode})"
    if not note and Path(spec.result).exists():
        return Result(**json.loads(Path(spec.result).read_text()))
    tail = stderr.decode(errors="replace").strip().splitlines()[-1:] if stderr else []
    return Result(spec.student, spec.assignment, {}, {}, [note + (f": {tail[0][:200]}" if tail else "")])


def _zero_filled(result: Result, maxima: dict[str, float]) -> Result:
    result.max_scores = result.max_scores or dict(maxima)
    result.scores = {k: result.scores.get(k, 0.0) for k in result.max_scores}
    return result


def _points(value: float) -> str:
    return f"{value:g}"


def write_csv(results: list[Result], known: dict[str, Assignment], path: Path) -> None:
    """grades.csv: student, assignment, points per exercise, total, max_total, status."""
    graded = sorted({r.assignment for r in results if r.assignment in known})
    exercises = [gid for name in graded for gid in known[name].grade_cells()]
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["student", "assignment", *exercises, "total", "max_total", "status"])
        for r in sorted(results, key=lambda r: (r.student, r.assignment)):
            row = [r.student, r.assignment] + [_points(r.scores[e]) if e in r.scores else "" for e in exercises]
            row += [_points(sum(r.scores.values())), _points(sum(r.max_scores.values())), "; ".join(r.status) or "ok"]
            writer.writerow(row)


def autograde(
    submissions: Path,
    out: Path,
    *,
    jobs: int | None = None,
    timeout: int = 30,
    only: str | None = None,
    force: bool = False,
    progress: bool = True,
) -> list[Result]:
    """Grade every submission under `submissions` (folder or zip) into `out`; returns the rows written.

    Results are kept per submission with a fingerprint, so a re-run (after an interruption, or with
    new submissions) grades only what changed; `force` grades everything again.
    """
    jobs = jobs or os.cpu_count() or 1
    work = out / ".work"
    known = {a.name: a for a in assignments()}
    root = submissions
    if submissions.is_file():
        root = unpack_zip(submissions, Path(tempfile.mkdtemp(prefix="unpacked-", dir=_mkdir(work))), list(known.values()))
    subs = collect(root, list(known.values()), only)
    graded = sorted({s.assignment for s in subs if s.assignment in known})
    template = generate(work / "template", [known[a] for a in graded]) if graded else work / "template"

    env = dict(os.environ)
    # Parallel kernels share the cores: one torch thread per kernel keeps them from fighting.
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // jobs)))
    results: list[Result] = []
    pending: list[tuple[Spec, str, float]] = []
    for sub in subs:
        assignment = known.get(sub.assignment)
        result_path = work / "results" / sub.student / f"{sub.assignment}.json"
        fingerprint = _fingerprint(sub, assignment, timeout)
        stamp = result_path.with_suffix(".fingerprint")
        if assignment is None:
            results.append(Result(sub.student, sub.assignment, {}, {}, [sub.problem]))
            continue
        if not force and result_path.exists() and stamp.exists() and stamp.read_text() == fingerprint:
            results.append(Result(**json.loads(result_path.read_text())))
            continue
        stamp.unlink(missing_ok=True)
        spec = Spec(sub.student, sub.assignment, assignment.notebook, [str(f) for f in sub.files], str(template),
                    str(result_path), str(out / "feedback" / sub.student / sub.assignment / f"{assignment.name}.html"),
                    timeout, sub.problem)
        code_cells = sum(c.cell_type == "code" for c in nbformat.read(assignment.source, as_version=4).cells)
        pending.append((spec, fingerprint, timeout * code_cells + WORKER_OVERHEAD_S))

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(_run_worker, spec, wall, env): (spec, fp) for spec, fp, wall in pending}
        bar = tqdm(as_completed(futures), total=len(futures), desc="grading", unit="submission", disable=not progress)
        for future in bar:
            spec, fingerprint = futures[future]
            result = future.result()
            worker_finished = bool(result.max_scores)  # else the worker died: grade it again next run
            result = _zero_filled(result, known[spec.assignment].grade_cells())
            Path(spec.result).write_text(json.dumps(asdict(result), indent=1))
            if worker_finished:
                Path(spec.result).with_suffix(".fingerprint").write_text(fingerprint)
            results.append(result)
    write_csv(results, known, out / "grades.csv")
    return results


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path
