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
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

from grader.collect.submissions import Submission
from grader.course import assignments
from grader.report.outputs import write_outputs
from grader.results import Result

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


def write_manifest(out: Path, shard: tuple[int, int], subs: list[Submission]) -> None:
    index, count = shard
    students = sorted({s.student for s in subs if in_shard(s.student, index, count)})
    (out / MANIFEST).write_text(json.dumps({"shard": index, "of": count, "class": class_digest(subs),
                                            "students": students}, indent=1))


def _manifest(folder: Path) -> dict:
    path = folder / MANIFEST
    if not path.is_file():
        raise ShardError(f"{folder}: no {MANIFEST} — not the output of `autograde --shard K/N`")
    try:
        data = json.loads(path.read_text())
        return {"shard": int(data["shard"]), "of": int(data["of"]), "class": str(data["class"]),
                "students": list(data["students"])}
    except (ValueError, KeyError, TypeError) as err:
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
    return manifests


def merge(out: Path, folders: list[Path], *, report: bool = True) -> list[Result]:
    """Join shard outputs into `out` as a single run would have written it; returns the merged Results."""

    manifests = check_shards(folders)
    if any(out.resolve() == f.resolve() for f in folders):
        raise ShardError(f"{out} is one of the shards: merge into a new folder")
    results: list[Result] = []
    owner: dict[str, Path] = {}
    for folder, m in zip(folders, manifests):
        for raw in json.loads((folder / "results.json").read_text()):
            result = Result.from_dict(raw)
            if result.student not in m["students"]:
                raise ShardError(f"{folder}: results.json has {result.student!r}, who is not in shard {m['shard']}")
            results.append(result)
        for student in m["students"]:
            if student in owner:
                raise ShardError(f"student {student!r} graded in both {owner[student]} and {folder}")
            owner[student] = folder
    out.mkdir(parents=True, exist_ok=True)
    for folder in folders:
        feedback = folder / "feedback"
        if feedback.is_dir():
            shutil.copytree(feedback, out / "feedback", dirs_exist_ok=True)
    write_outputs(results, {a.name: a for a in assignments()}, out, report=report)
    return results
