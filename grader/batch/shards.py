"""Grading a class on several machines: `autograde --shard K/N`, then `grader merge`.

A shard is a deterministic partition by student: student S belongs to shard K of N when
sha256(S) mod N = K - 1. It depends on nothing but the student key, so it is the same on every
machine and in every run, and all of a student's assignments land in the same shard. Every shard
collects the whole class first (so "no submission" rows and the columns of grades.csv are the
same as in a single run), checks the config against the whole class, then grades only its own
students into its own folder, with a `shard.json` saying which shard it is and which class it saw.

`python -m grader merge OUT SHARD_DIR…` checks that the shards are the N parts of one class (each
K once, the same N, the same class, no student twice), then writes OUT/grades.csv, results.json,
feedback/ and report/ exactly as a single run over the class would: grades.csv and the report
byte for byte, the feedback tree file for file (results.json differs only in the `seconds` each
submission took to grade).

What merge trusts. A shard folder is written by the grader, outside the sandbox (autograde refuses to run when
the kernel would see it), so no student code can write it; what a student influences is only what the rows and
pages hold (their answers, their errors' messages, their outputs), and merge reads those as text, never as
instructions. It does not take a folder's word for anything it can check: `shard.json` is written last, once
results.json is complete, with results.json's sha256 (an unfinished run, or a results.json edited afterwards, is
refused); it names the class by every (student, assignment) it saw and every hand-in's bytes, and the grading by
the grader's code, the release, the settings and grading.toml (`grading_digest`), so shards of another class, of
hand-ins changed between the runs, or of another release are refused; every student must belong to the shard by
the split, every row of the class must be there exactly once, and no row may give more points than the release
does (or a negative, NaN or infinite number). Feedback pages are copied only as the seal lists them (each with its
sha256, after the run pruned the pages of rows with a problem and of students not in the shard), only for the
shard's own students, and never through a link. What merge cannot tell is a results.json rewritten with care, its
digest recomputed: keep
shard folders where only you can write, as the rest of OUT.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import re
import shutil
from pathlib import Path, PurePosixPath

from grader.collect.deadlines import Config
from grader.collect.files import read_regular
from grader.collect.submissions import MAX_NOTEBOOK_BYTES, Submission
from grader.course import Assignment, assignments
from grader.report.outputs import write_outputs
from grader.results import NoteKind, Result, write_whole

MANIFEST = "shard.json"
SPEC = re.compile(r"^(\d+)/(\d+)$")


class ShardError(ValueError):
    """A shard spec or a set of shard folders that cannot be merged; the message says why."""


def parse_shard(text: str) -> tuple[int, int]:
    """'K/N' (1 ≤ K ≤ N) → (K, N)."""
    match = SPEC.match(text.strip())
    if not match or not 1 <= int(match.group(1)) <= int(match.group(2)):
        raise ShardError(f"--shard {text!r}: write K/N with 1 ≤ K ≤ N, e.g. 2/8 (Slurm: $SLURM_ARRAY_TASK_ID/N, "
                         "Kubernetes: $((JOB_COMPLETION_INDEX+1))/N)")
    return int(match.group(1)), int(match.group(2))


def shard_of(student: str, count: int) -> int:
    """The shard (1-based) of `count` that grades `student`: stable across machines, runs and Python versions."""
    return int.from_bytes(hashlib.sha256(student.encode()).digest()[:8], "big") % count + 1


def in_shard(student: str, index: int, count: int) -> bool:
    return shard_of(student, count) == index


def class_digest(subs: list[Submission]) -> str:
    """Names the class a shard saw: every (student, assignment) collection found."""
    return hashlib.sha256("\n".join(sorted(f"{s.student}\0{s.assignment}" for s in subs)).encode()).hexdigest()[:16]


def hand_ins_digest(subs: list[Submission]) -> str:
    """Names what every hand-in of the class held: the bytes of each notebook collection chose (bounded)."""
    digest = hashlib.sha256()
    for sub in sorted(subs, key=lambda s: (s.student, s.assignment)):
        digest.update(f"{sub.student}\0{sub.assignment}\0{sub.problem.text if sub.problem else ''}\0".encode())
        if sub.notebook is not None:
            try:
                digest.update(hashlib.sha256(_read(sub.notebook, MAX_NOTEBOOK_BYTES + 1)).digest())
            except OSError as exc:
                digest.update(type(exc).__name__.encode())
    return digest.hexdigest()[:16]


def _read(path: Path, limit: int = -1) -> bytes:
    """A regular file's bytes, never through a link (grader/collect/files.py)."""
    return read_regular(path, limit)


def grading_digest(code: str, settings: list, config: Config, known: dict[str, Assignment]) -> str:
    """Names how a class is graded — the grader's code (autograde.code_digest), the release's sources, the settings,
    grading.toml — so that `merge` refuses shards graded differently."""
    config = dataclasses.replace(config, source="", matched=(), warnings=())
    digest = hashlib.sha256(f"{code}\0{settings!r}\0{config!r}".encode())
    for name, assignment in sorted(known.items()):
        digest.update(name.encode() + b"\0" + assignment.source.read_bytes())
    return digest.hexdigest()[:16]


def write_manifest(out: Path, shard: tuple[int, int], subs: list[Submission], grading: str = "") -> None:
    """Start a shard's run: its manifest, not yet sealed (merge refuses it until `seal` adds results.json's digest).

    `grading`: grader.batch.autograde.grading_digest — the grader, the release, the settings and the config."""
    index, count = shard
    students = sorted({s.student for s in subs if in_shard(s.student, index, count)})
    (out / MANIFEST).write_text(json.dumps({"shard": index, "of": count, "class": class_digest(subs),
                                            "hand_ins": hand_ins_digest(subs), "grading": grading,
                                            "students": students, "results": ""}, indent=1))


def seal(out: Path) -> None:
    """End a shard's run, once results.json is written: the manifest gets results.json's sha256."""
    path = out / MANIFEST
    data = json.loads(path.read_text())
    data["results"] = hashlib.sha256(_read(out / "results.json")).hexdigest()
    data["pages"] = _pages(out)
    write_whole(path, json.dumps(data, indent=1))


def _manifest(folder: Path) -> dict:
    path = folder / MANIFEST
    if not path.is_file():
        raise ShardError(f"{folder}: no {MANIFEST} — not the output of `autograde --shard K/N`")
    try:
        data = json.loads(_read(path))
        return {"shard": int(data["shard"]), "of": int(data["of"]), "class": str(data["class"]),
                "students": [str(s) for s in data["students"]], "hand_ins": str(data.get("hand_ins", "")),
                "grading": str(data.get("grading", "")), "results": str(data.get("results", "")),
                "pages": {str(k): str(v) for k, v in data["pages"].items()} if "pages" in data else None}
    except (ValueError, KeyError, TypeError, OSError) as err:
        raise ShardError(f"{path}: unreadable ({type(err).__name__}: {err})") from None


def check_shards(folders: list[Path]) -> list[dict]:
    """The manifests of `folders`, once they are shown to be every shard of one class; else ShardError."""
    manifests = [_manifest(f) for f in folders]
    counts = {m["of"] for m in manifests}
    if len(counts) != 1:
        raise ShardError("the folders come from different splits: " +
                         ", ".join(f"{f} is shard {m['shard']}/{m['of']}" for f, m in zip(folders, manifests)))
    count = counts.pop()
    classes = {m["class"] for m in manifests}
    if len(classes) != 1:
        raise ShardError("the shards saw different classes (different submissions folders, or hand-ins changed "
                         "between the runs): grade every shard from the same SUBMISSIONS")
    seen: dict[int, Path] = {}
    for folder, m in zip(folders, manifests):
        if m["shard"] in seen:
            raise ShardError(f"shard {m['shard']}/{count} given twice: {seen[m['shard']]} and {folder}")
        seen[m["shard"]] = folder
        if not (folder / "results.json").is_file():
            raise ShardError(f"{folder}: shard {m['shard']}/{count} has no results.json — did its run finish?")
    missing = sorted(set(range(1, count + 1)) - set(seen))
    if missing:
        raise ShardError(f"shard(s) {', '.join(f'{k}/{count}' for k in missing)} missing: merge needs all {count}")
    _check_sealed(folders, manifests, count)
    return manifests


def _check_sealed(folders: list[Path], manifests: list[dict], count: int) -> None:
    """The checks beyond the split: one folder once, the same hand-ins and grading, finished and unedited runs."""
    real: dict[Path, Path] = {}
    for folder in folders:
        if folder.resolve() in real:
            raise ShardError(f"{folder} and {real[folder.resolve()]} are one folder (a link, or a copy's manifest)")
        real[folder.resolve()] = folder
    for what, why in (("hand_ins", "hand-ins changed between the shards' runs: grade every shard from the same "
                                   "SUBMISSIONS, unchanged"),
                      ("grading", "the shards were graded differently (another version of the grader or the "
                                  "release, other --timeout, --feedback or sandbox settings, or another grading.toml): "
                                  "grade them all again with the same")):
        if len({m[what] for m in manifests}) != 1:
            raise ShardError(f"{why}: " + ", ".join(f"{f} has {m[what] or 'none'}" for f, m in zip(folders, manifests)))
    for folder, m in zip(folders, manifests):
        if folder.is_symlink() or (folder / "feedback").is_symlink():
            raise ShardError(f"{folder}: the shard folder or its feedback folder is a link: merge the folder itself")
        if not m["results"] or m["pages"] is None:
            raise ShardError(f"{folder}: shard {m['shard']}/{count} did not finish (its {MANIFEST} is not sealed"
                             f"{'' if not m['results'] else ' with its feedback pages'}): run it again")
        try:
            now = hashlib.sha256(_read(folder / "results.json")).hexdigest()
        except OSError as err:
            raise ShardError(f"{folder}: results.json unreadable ({type(err).__name__})") from None
        if now != m["results"]:
            raise ShardError(f"{folder}: results.json was changed after shard {m['shard']}/{count} wrote it: "
                             "run that shard again")
        strays = [s for s in m["students"] if not in_shard(s, m["shard"], count)]
        if strays:
            raise ShardError(f"{folder}: {MANIFEST} lists {strays[0]!r}, who belongs to shard "
                             f"{shard_of(strays[0], count)}/{count}, not {m['shard']}/{count}")


def _check_row(folder: Path, result: Result, known: dict[str, Assignment]) -> None:
    """A row gives no more points than the release does, and no negative, NaN or infinite number."""
    where = f"{folder}: results.json: {result.student}/{result.assignment}"
    numbers = [*result.scores.values(), *result.max_scores.values(), result.penalty,
               *(v for v in result.by_hand.values() if v is not None), *result.by_hand_max.values()]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
               for v in numbers):
        raise ShardError(f"{where}: a negative, NaN, infinite or missing number of points")
    assignment = known.get(result.assignment)
    if assignment is not None and result.max_scores and result.max_scores != assignment.grade_cells():
        raise ShardError(f"{where}: the exercises or their points are not the release's")
    over = [e for e, v in result.scores.items() if v > result.max_scores.get(e, -1)]
    over += [e for e, v in result.by_hand.items() if v is not None and v > result.by_hand_max.get(e, -1)]
    if over:
        raise ShardError(f"{where}: {over[0]} has more points than it is worth")
    if result.penalty > sum(result.scores.values()) + sum(v or 0.0 for v in result.by_hand.values()):
        raise ShardError(f"{where}: a late penalty larger than the points")


def merge(out: Path, folders: list[Path], *, report: bool = True) -> list[Result]:
    """Join shard outputs into `out` as a single run would have written it; returns the merged Results."""

    manifests = check_shards(folders)
    if any(out.resolve() == f.resolve() or f.resolve() in out.resolve().parents for f in folders):
        raise ShardError(f"{out} is one of the shards, or inside one: merge into a new folder")
    known = {a.name: a for a in assignments()}
    results: list[Result] = []
    owner: dict[str, Path] = {}
    rows: dict[tuple[str, str], Path] = {}
    for folder, m in zip(folders, manifests):
        try:
            raws = json.loads(_read(folder / "results.json"))
            found = [Result.from_dict(raw) for raw in raws]
        except (ValueError, TypeError, KeyError, AttributeError) as err:
            raise ShardError(f"{folder}: results.json unreadable ({type(err).__name__})") from None
        for result in found:
            if result.student not in m["students"]:
                raise ShardError(f"{folder}: results.json has {result.student!r}, who is not in shard {m['shard']}")
            row = (result.student, result.assignment)
            if row in rows:
                raise ShardError(f"{result.student}/{result.assignment} has two rows: in {rows[row]} and {folder}")
            rows[row] = folder
            _check_row(folder, result, known)
            results.append(result)
        for student in m["students"]:
            if student in owner:
                raise ShardError(f"student {student!r} graded in both {owner[student]} and {folder}")
            owner[student] = folder
    if class_digest([Submission(s, a) for s, a in rows]) != manifests[0]["class"]:
        raise ShardError("the shards' rows are not the class their runs saw (a row or a student missing): "
                         "run the shards again")
    pages = [(rel, _sealed_page(folder, m, rel, digest)) for folder, m in zip(folders, manifests)
             for rel, digest in sorted(m["pages"].items())]
    out.mkdir(parents=True, exist_ok=True)
    for rel, data in pages:  # only the pages each run sealed: a page left by an earlier run is not one
        target = out / "feedback" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    write_outputs(results, known, out, report=report)
    return results


def _sealed_page(folder: Path, m: dict, rel: str, digest: str) -> bytes:
    """A feedback page the shard's seal lists: its own student's, never through a link, unchanged since the seal."""
    parts = PurePosixPath(rel).parts
    if len(parts) < 2 or rel.startswith("/") or ".." in parts or parts[0] not in m["students"]:
        raise ShardError(f"{folder}: {MANIFEST} lists the feedback page {rel!r}, not one of shard {m['shard']}'s students'")
    try:
        data = read_regular(folder / "feedback" / rel, under=folder)
    except OSError as err:
        raise ShardError(f"{folder}: feedback/{rel} unreadable ({type(err).__name__}: {err})") from None
    if hashlib.sha256(data).hexdigest() != digest:
        raise ShardError(f"{folder}: feedback/{rel} was changed after shard {m['shard']} wrote it: run that shard again")
    return data


def _pages(out: Path) -> dict[str, str]:
    """Every feedback page under `out` (regular files only, no link followed) -> its sha256: what the seal lists."""
    found: dict[str, str] = {}
    root = out / "feedback"
    for path in sorted(root.rglob("*")) if root.is_dir() and not root.is_symlink() else []:
        if path.is_file() and not path.is_symlink():
            with contextlib.suppress(OSError):  # a folder on the way that is a link: never listed
                found[path.relative_to(root).as_posix()] = hashlib.sha256(read_regular(path, under=out)).hexdigest()
    return found


def prune_pages(out: Path, results: list[Result]) -> None:
    """Leave under `out/feedback` only the pages of rows graded without a problem: a row that became `invalid`,
    `missing`, `refused` or a grader error keeps no page of an earlier grade, and a student no longer in the class
    (or, for a shard, in this shard) keeps no folder."""
    keep = {(r.student, r.assignment) for r in results
            if not any(not n.kind.graded or n.kind == NoteKind.GRADER_ERROR for n in r.status)}
    root = out / "feedback"
    if root.is_symlink():
        root.unlink()
    for student in _listing(root):
        for assignment in _listing(Path(student.path)) if student.is_dir(follow_symlinks=False) else [student]:
            if (student.name, assignment.name) not in keep or assignment.path == student.path:
                _remove(Path(assignment.path))
        with contextlib.suppress(OSError):
            Path(student.path).rmdir()  # only when nothing is left in it


def _listing(folder: Path) -> list[os.DirEntry]:
    try:
        with os.scandir(folder) as entries:
            return list(entries)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
