"""Hostile shards for `grader merge` (issue 36 item 8): conflicting shards, a hand-edited results.json, rows claiming
more points than the release gives, a shard of another class, of changed hand-ins or of another release, a shard
copied under another name or linked, an unfinished run, stale feedback pages and links among them. Merge refuses
what it cannot trust and never copies what another shard graded.

Unit-level: shard folders written the way `autograde --shard` writes them (write_manifest, write_outputs, seal), from
rows built in memory; no kernel."""

import hashlib
import inspect
import json
import os
import sys

import nbformat
import pytest

from grader.author.mutants import reference_submission
from grader.batch import autograde
from grader.batch.shards import ShardError, merge, seal, shard_of, write_manifest
from grader.collect.submissions import Submission
from grader.course import assignment_named
from grader.report.outputs import write_outputs
from grader.results import Result, read_json

ONE = "01_gradient_descent"
A = assignment_named(ONE)
STUDENTS = ["ann", "bob", "cid", "dee", "eve", "fay"]
assert {shard_of(s, 2) for s in STUDENTS} == {1, 2}


@pytest.fixture
def hand_ins(tmp_path):
    """The class every shard collects: one notebook per student."""
    subs = []
    for student in STUDENTS:
        path = tmp_path / "class" / student / ONE / A.notebook
        path.parent.mkdir(parents=True)
        nbformat.write(reference_submission(A), path)
        subs.append(Submission(student, ONE, notebook=path))
    return subs


def row(student, earned=None):
    maxima = A.grade_cells()
    scores = {e: (m if earned is None else min(m, earned)) for e, m in maxima.items()}
    return Result(student, ONE, scores, dict(maxima))


def run_shard(folder, k, subs, grading="g1", rows=None, feedback=True):
    """What `autograde --shard k/2` leaves: a manifest, results.json, feedback pages, then the seal."""
    folder.mkdir(parents=True, exist_ok=True)
    write_manifest(folder, (k, 2), subs, grading)
    mine = [row(s.student) for s in subs if shard_of(s.student, 2) == k] if rows is None else rows
    for r in mine if feedback else ():
        page = folder / "feedback" / r.student / ONE / f"{ONE}.html"
        page.parent.mkdir(parents=True, exist_ok=True)
        page.write_text(f"<p>{r.student} graded in shard {k}</p>")
    write_outputs(mine, {ONE: A}, folder, report=False)
    seal(folder)
    return folder


def both(tmp_path, subs, **second):
    return [run_shard(tmp_path / "s1", 1, subs), run_shard(tmp_path / "s2", 2, subs, **second)]


def reseal(folder):
    """A careful forger: results.json edited, then the manifest's digest recomputed."""
    manifest = json.loads((folder / "shard.json").read_text())
    manifest["results"] = hashlib.sha256((folder / "results.json").read_bytes()).hexdigest()
    (folder / "shard.json").write_text(json.dumps(manifest))


def edit_rows(folder, change, forge=True):
    raws = json.loads((folder / "results.json").read_text())
    raws = change(raws)
    (folder / "results.json").write_text(json.dumps(raws))
    if forge:
        reseal(folder)


def refused(tmp_path, folders, says):
    with pytest.raises(ShardError, match=says):
        merge(tmp_path / "merged", folders, report=False)
    assert not (tmp_path / "merged" / "grades.csv").exists()


def test_honest_shards_merge(tmp_path, hand_ins):
    merged = merge(tmp_path / "merged", both(tmp_path, hand_ins), report=False)
    assert sorted(r.student for r in merged) == STUDENTS
    assert sorted(os.listdir(tmp_path / "merged" / "feedback")) == STUDENTS


def test_results_edited_after_the_run_are_refused(tmp_path, hand_ins):
    folders = both(tmp_path, hand_ins)
    edit_rows(folders[0], lambda raws: [{**r, "scores": {e: 0.0 for e in r["scores"]}} for r in raws], forge=False)
    refused(tmp_path, folders, "results.json was changed after shard 1/2 wrote it")


@pytest.mark.parametrize("forge, says", [
    (lambda r: {**r, "scores": {e: 30.0 for e in r["scores"]}}, "more points than it is worth"),
    (lambda r: {**r, "scores": {e: float("nan") for e in r["scores"]}}, "NaN"),
    (lambda r: {**r, "scores": {e: -1.0 for e in r["scores"]}}, "negative"),
    (lambda r: {**r, "max_scores": {e: 30.0 for e in r["max_scores"]}, "scores": {e: 30.0 for e in r["scores"]}},
     "not the release's"),
    (lambda r: {**r, "penalty": 1e9}, "penalty larger than the points"),
])
def test_a_forged_row_claiming_more_than_the_release_gives_is_refused_even_resealed(tmp_path, hand_ins, forge, says):
    folders = both(tmp_path, hand_ins)
    edit_rows(folders[1], lambda raws: [forge(r) for r in raws])
    refused(tmp_path, folders, says)


def test_a_row_twice_or_a_row_dropped_is_refused(tmp_path, hand_ins):
    folders = both(tmp_path, hand_ins)
    edit_rows(folders[0], lambda raws: raws + raws[:1])
    refused(tmp_path, folders, "has two rows")
    folders = [run_shard(tmp_path / "t1", 1, hand_ins), run_shard(tmp_path / "t2", 2, hand_ins)]
    edit_rows(folders[0], lambda raws: raws[1:])
    refused(tmp_path, folders, "not the class their runs saw")


def test_a_student_listed_in_the_wrong_shard_is_refused(tmp_path, hand_ins):
    folders = both(tmp_path, hand_ins)
    stray = next(s for s in STUDENTS if shard_of(s, 2) == 2)
    manifest = json.loads((folders[0] / "shard.json").read_text())
    manifest["students"].append(stray)
    (folders[0] / "shard.json").write_text(json.dumps(manifest))
    refused(tmp_path, folders, f"lists '{stray}', who belongs to shard 2/2")


def test_an_unfinished_shard_is_refused(tmp_path, hand_ins):
    folders = both(tmp_path, hand_ins)
    write_manifest(folders[1], (2, 2), hand_ins, "g1")  # a rerun that was stopped: the old results.json is still there
    refused(tmp_path, folders, "did not finish")


def test_shards_of_changed_hand_ins_or_of_another_release_are_refused(tmp_path, hand_ins):
    first = run_shard(tmp_path / "s1", 1, hand_ins)
    refused(tmp_path, [first, run_shard(tmp_path / "s2", 2, hand_ins, grading="g2")], "graded differently")
    nbformat.write(nbformat.v4.new_notebook(), hand_ins[0].notebook)  # a hand-in changed between the two runs
    refused(tmp_path, [first, run_shard(tmp_path / "s3", 2, hand_ins)], "hand-ins changed between")


def test_a_shard_copied_under_another_name_or_linked_is_refused(tmp_path, hand_ins):
    folders = both(tmp_path, hand_ins)
    os.symlink(folders[0], tmp_path / "link")
    refused(tmp_path, [folders[0], tmp_path / "link", folders[1]], "given twice")
    manifest = json.loads((folders[0] / "shard.json").read_text())
    (tmp_path / "copy").mkdir()
    for name in ("results.json", "grades.csv"):
        (tmp_path / "copy" / name).write_bytes((folders[0] / name).read_bytes())
    (tmp_path / "copy" / "shard.json").write_text(json.dumps({**manifest, "shard": 2}))  # claims to be the other one
    refused(tmp_path, [folders[0], tmp_path / "copy"], "belongs to shard 1/2|graded in both")


def test_results_json_that_is_a_link_is_refused(tmp_path, hand_ins):
    folders = both(tmp_path, hand_ins)
    os.replace(folders[1] / "results.json", tmp_path / "elsewhere.json")
    os.symlink(tmp_path / "elsewhere.json", folders[1] / "results.json")
    refused(tmp_path, folders, "results.json unreadable")


def test_feedback_of_another_shards_student_and_links_are_never_copied(tmp_path, hand_ins):
    secret = tmp_path / "secret.html"
    secret.write_text("the instructor's own file")
    folders = both(tmp_path, hand_ins)
    # shard 1's folder was used before with another split: it still holds a page of a student shard 2 graded now
    other = next(s for s in STUDENTS if shard_of(s, 2) == 2)
    stale = folders[0] / "feedback" / other / ONE / f"{ONE}.html"
    stale.parent.mkdir(parents=True)
    stale.write_text("stale page of an earlier split")
    mine = next(s for s in STUDENTS if shard_of(s, 2) == 1)
    os.symlink(secret, folders[0] / "feedback" / mine / ONE / "extra.html")
    merge(tmp_path / "merged", folders[::-1], report=False)
    page = tmp_path / "merged" / "feedback" / other / ONE / f"{ONE}.html"
    assert page.read_text() == f"<p>{other} graded in shard 2</p>"
    assert not (tmp_path / "merged" / "feedback" / mine / ONE / "extra.html").exists()


def test_merge_never_writes_into_a_shard(tmp_path, hand_ins):
    folders = both(tmp_path, hand_ins)
    with pytest.raises(ShardError, match="one of the shards, or inside one"):
        merge(folders[0] / "merged", folders, report=False)


def test_a_shard_run_seals_its_manifest_last():
    """The order inside autograde, read from its code (no grading run): results written, then the seal."""
    body = inspect.getsource(autograde.autograde)
    assert body.index("write_outputs(") < body.index("seal(out)")


def test_the_merged_rows_are_the_shards_rows(tmp_path, hand_ins):
    folders = both(tmp_path, hand_ins)
    merge(tmp_path / "merged", folders, report=False)
    merged = {r.student: r.scores for r in read_json(tmp_path / "merged" / "results.json")}
    assert merged == {s: row(s).scores for s in STUDENTS}


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
