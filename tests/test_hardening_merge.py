"""Hostile runs and reruns (issue 36 item 8). `grader merge`: conflicting shards, a hand-edited results.json, rows
claiming more points than the release gives, a shard of another class, of changed hand-ins or of another release, a
shard copied under another name or linked, an unfinished run, stale feedback pages and links among them: merge
refuses what it cannot trust and never copies what another shard graded. Overrides across regrades: a hand-in that
changes under an override, an exercise a new version removed, values TOML allows, lookalike names. Ctrl-C a second
time during the clean-up, and while the outputs are written: nothing half-written, and the rerun writes them whole.

Unit-level: shard folders written the way `autograde --shard` writes them (write_manifest, write_outputs, seal), from
rows built in memory; no kernel."""

import copy
import hashlib
import inspect
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from conftest import read_rows

from grader import results as results_module
from grader.author.mutants import reference_submission
from grader.batch import autograde
from grader.batch.shards import ShardError, merge, seal, shard_of, write_manifest
from grader.collect.deadlines import ConfigError, NoHandIn, check_students, parse_config, settle
from grader.collect.submissions import Submission
from grader.course import assignment_named
from grader.report import report as report_module
from grader.report.outputs import write_outputs
from grader.results import NoteKind, Result, read_json

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




def test_a_feedback_page_edited_after_the_seal_is_refused_and_a_linked_shard_or_feedback_folder_too(tmp_path, hand_ins):
    folders = both(tmp_path, hand_ins)
    mine = next(s for s in STUDENTS if shard_of(s, 2) == 1)
    page = folders[0] / "feedback" / mine / ONE / f"{ONE}.html"
    page.write_text("<p>10 / 10</p>")
    refused(tmp_path, folders, f"feedback/{mine}/{ONE}/{ONE}.html was changed after shard 1 wrote it")
    page.write_text(f"<p>{mine} graded in shard 1</p>")
    os.rename(folders[1], tmp_path / "real-s2")
    os.symlink(tmp_path / "real-s2", folders[1])
    refused(tmp_path, folders, "the shard folder or its feedback folder is a link")
    os.unlink(folders[1])
    os.rename(tmp_path / "real-s2", folders[1])
    os.rename(folders[1] / "feedback", tmp_path / "pages")
    os.symlink(tmp_path / "pages", folders[1] / "feedback")
    refused(tmp_path, folders, "the shard folder or its feedback folder is a link")


def test_a_regrade_leaves_no_page_of_an_earlier_grade_nor_of_a_student_gone(tmp_path, hand_ins):
    from grader.batch.shards import prune_pages
    from grader.results import Note

    out = tmp_path / "out"
    for student in ("ann", "bob", "carl"):
        page = out / "feedback" / student / ONE / f"{ONE}.html"
        page.parent.mkdir(parents=True)
        page.write_text("<p>10 / 10</p>")
    carl = row("carl")
    carl.status.append(Note(NoteKind.INVALID, "invalid notebook: JSONDecodeError"))
    prune_pages(out, [row("ann"), carl])  # bob left the class; carl's notebook no longer reads
    assert everything(out / "feedback") == [f"ann/{ONE}/{ONE}.html"]
    page = tmp_path / "out" / "feedback" / "dee_1004" / ONE / f"{ONE}.html"  # a hand-in that is graded again
    page.parent.mkdir(parents=True)
    page.write_text("<p>old grade</p>")
    planned(tmp_path, resolved(""), hand_ins[0].notebook)
    assert not page.exists()  # until the new grade writes it


def everything(folder):
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


# --- overrides across regrades ----------------------------------------------------------------------------------

EXERCISES = {ONE: {**A.grade_cells(), **A.written_cells()}}


def override(student="dee_1004", points="3", exercise="mse_grad", reason="derivation explained in office hours"):
    return (f'[[override]]\nstudent = "{student}"\nassignment = "{ONE}"\nexercise = "{exercise}"\n'
            f'points = {points}\nreason = "{reason}"\n')


def resolved(text, students=("dee_1004", "ann_1001"), exercises=None):
    return check_students(parse_config(text, [ONE], "grading.toml"), set(students), exercises or EXERCISES)


def planned(tmp_path, config, notebook):
    """What autograde's plan gives the worker for dee's hand-in: its overrides, each marked `changed` or not."""
    run = autograde._Run(tmp_path / "out", {ONE: A}, config, "after-release", 10, False, 1)
    _, pending = autograde._plan(run, [Submission("dee_1004", ONE, notebook=notebook)], Path(), force=False)
    return pending[0].spec.overrides


def test_an_override_given_for_one_hand_in_is_flagged_when_a_new_one_replaces_it(tmp_path):
    notebook = tmp_path / "class" / "dee_1004" / ONE / A.notebook
    notebook.parent.mkdir(parents=True)
    nbformat.write(reference_submission(A), notebook)
    config = resolved(override())
    assert [o["changed"] for o in planned(tmp_path, config, notebook)] == [False]
    assert [o["changed"] for o in planned(tmp_path, config, notebook)] == [False]  # a rerun: the same hand-in
    blank = reference_submission(A)
    blank.cells = blank.cells[:3]
    nbformat.write(blank, notebook)  # the student hands in again after the regrade request
    overrides = planned(tmp_path, config, notebook)
    assert [o["changed"] for o in overrides] == [True]
    row = settle(row_for("dee_1004"), {}, overrides)
    assert row.scores["mse_grad"] == 3 and {n.kind for n in row.status} == {NoteKind.REGRADED, NoteKind.OVERRIDE_CHANGED}
    assert NoteKind.OVERRIDE_CHANGED.look_at and "edit its reason to confirm it" in row.status[0].text
    assert settle(copy.deepcopy(row), {}, overrides) == row  # settling again (every run does) changes nothing
    confirmed = resolved(override(reason="derivation explained in office hours; checked the new hand-in"))
    assert [o["changed"] for o in planned(tmp_path, confirmed, notebook)] == [False]  # the instructor confirmed it



def test_an_override_pinned_to_the_hand_in_read_is_flagged_in_a_fresh_out_folder_and_unpinned_ones_print_the_pin(
        tmp_path, capsys):
    notebook = tmp_path / "class" / "dee_1004" / ONE / A.notebook
    notebook.parent.mkdir(parents=True)
    nbformat.write(reference_submission(A), notebook)
    read = f"sha256:{hashlib.sha256(notebook.read_bytes()).hexdigest()}"
    assert [o["changed"] for o in planned(tmp_path, resolved(override()), notebook)] == [False]
    assert f'hand_in = "{read}"' in capsys.readouterr().err  # the line to paste into the [[override]]
    pinned = resolved(override() + f'hand_in = "{read}"\n')
    blank = reference_submission(A)
    blank.cells = blank.cells[:3]
    nbformat.write(blank, notebook)  # handed in again before any run saw the override; or a new OUT, a new split
    assert [o["changed"] for o in planned(tmp_path / "fresh", pinned, notebook)] == [True]
    assert "hand_in" not in capsys.readouterr().err
    with pytest.raises(ConfigError, match="hand_in"):
        resolved(override() + 'hand_in = "v1"\n')


def row_for(student):
    maxima = A.grade_cells()
    return Result(student, ONE, {e: 0.0 for e in maxima}, dict(maxima))


@pytest.mark.parametrize("points", ["nan", "inf", "-inf", "-1", "4", "true", '"3"', "1e400"])
def test_override_points_toml_allows_but_no_exercise_has_are_refused(points):
    with pytest.raises(ConfigError, match="points"):
        resolved(override(points=points))


def test_minus_zero_points_are_zero():
    given = resolved(override(points="-0.0")).overrides[0]
    row = settle(row_for("dee_1004"), {}, [given])
    assert math.copysign(1, given.points) == 1 and "→ 0 of 3" in row.status[0].text and "-0" not in row.status[0].text


@pytest.mark.parametrize("name", ["\u0501ee_1004", "\uff44ee_1004", "dee_\u0661\u0660\u0660\u0664", "dee_1004\u200b",
                                  "\u202edee_1004"])
def test_a_name_that_only_looks_like_a_students_fits_nobody(name):
    # "dee_١٠٠٤" (Arabic-Indic digits) was taken for the folder "dee", another student than dee_1004
    with pytest.raises(NoHandIn):
        resolved(override(student=name), students=("dee", "dee_1004"))


def test_conflicting_overrides_of_one_exercise_are_refused_however_the_student_is_named():
    with pytest.raises(ConfigError, match="overridden already"):
        resolved(override("dee_1004", "3") + override("1004", "1"))


def test_an_override_for_an_exercise_a_new_version_removed_or_renamed_stops_before_grading():
    renamed = {ONE: {("mse_gradient" if e == "mse_grad" else e): v for e, v in EXERCISES[ONE].items()}}
    with pytest.raises(ConfigError, match="has no such exercise .did you mean 'mse_gradient'"):
        resolved(override(), exercises=renamed)


# --- Ctrl-C twice, and while the outputs are written ------------------------------------------------------------

def test_a_second_ctrl_c_during_the_clean_up_does_not_stop_it(tmp_path, monkeypatch):
    done = []

    def first_ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt("SIGINT")

    def kill_tree(pid, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # the second Ctrl-C, while the batch's processes are being killed
        time.sleep(0.05)
        done.append("killed")
        return 0

    monkeypatch.setattr(autograde, "_collected", first_ctrl_c)
    monkeypatch.setattr(autograde.stopping, "kill_tree", kill_tree)
    monkeypatch.setattr(autograde.sandbox, "sweep_stale_folders", lambda: done.append("swept"))
    (tmp_path / "class").mkdir()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(autograde.Interrupted):
            autograde.autograde(tmp_path / "class", tmp_path / "out", sandboxed=False, progress=False, report=False)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert done == ["killed", "swept"]


def test_ctrl_c_while_the_outputs_are_written_leaves_every_file_whole_and_a_rerun_writes_them(tmp_path, monkeypatch):
    rows = [row(s) for s in STUDENTS]
    write_outputs(rows, {ONE: A}, tmp_path, report=True)
    before = {name: (tmp_path / name).read_bytes() for name in ("grades.csv", "results.json", "report/report.json",
                                                                 "report/report.html")}
    changed = [row(s, earned=1.0) for s in STUDENTS]
    for victim in ("grades.csv", "results.json", "report.json", "report.html"):
        real = results_module.write_whole

        def interrupted(path, text, victim=victim, real=real):
            if path.name == victim:
                Path(f"{path.parent}/.{path.name}.partial").write_text(text[: len(text) // 2])
                raise KeyboardInterrupt("SIGINT")
            real(path, text)

        monkeypatch.setattr(results_module, "write_whole", interrupted)
        monkeypatch.setattr(report_module, "write_whole", interrupted)
        with pytest.raises(KeyboardInterrupt):
            write_outputs(changed, {ONE: A}, tmp_path, report=True)
        monkeypatch.undo()
        for name, data in before.items():  # each file is the old one or the new one, whole
            now = (tmp_path / name).read_bytes()
            assert now == data or now == _fresh(tmp_path, changed)[name], (victim, name)
    write_outputs(changed, {ONE: A}, tmp_path, report=True)  # the rerun
    assert {name: (tmp_path / name).read_bytes() for name in before} == _fresh(tmp_path, changed)


def _fresh(tmp_path, rows):
    """What an uninterrupted run writes for `rows`."""
    fresh = tmp_path / "fresh"
    if not fresh.exists():
        fresh.mkdir()
        write_outputs(rows, {ONE: A}, fresh, report=True)
    return {name: (fresh / name).read_bytes() for name in ("grades.csv", "results.json", "report/report.json",
                                                            "report/report.html")}


def test_ctrl_c_while_autograde_writes_the_outputs_says_the_grades_are_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(autograde, "_collected", lambda *args: [])
    monkeypatch.setattr(autograde, "write_outputs", lambda *args, **kwargs: (_ for _ in ()).throw(KeyboardInterrupt()))
    (tmp_path / "class").mkdir()
    with pytest.raises(autograde.Interrupted, match="run the same command again to continue"):
        autograde.autograde(tmp_path / "class", tmp_path / "out", sandboxed=False, progress=False, report=False)


@pytest.mark.slow
def test_ctrl_c_twice_mid_batch_leaves_nothing_and_the_rerun_grades_the_class_as_one_run_would(tmp_path):
    """A real batch (tests/test_batch_stops.py's class: two hand-ins that hang), Ctrl-C and again 0.3 s later, while
    the first one's clean-up runs: every process gone, no folder left, no grades.csv; the rerun grades the class."""
    import test_batch_stops as stops

    script = stops.SUBREAPER.replace("    run.send_signal(sig)\n", "    run.send_signal(sig)\n    time.sleep(0.3)\n"
                                     "    run.send_signal(sig)\n")
    assert script != stops.SUBREAPER
    archive, out = stops._class_zip(tmp_path / "class.zip"), tmp_path / "out"
    argv = [sys.executable, "-m", "grader", "autograde", str(archive), "--out", str(out), "--jobs", "2",
            "--timeout", "20"]
    ready = out / ".work" / "results" / "ann" / f"{stops.A.name}.fingerprint"
    done = subprocess.run([sys.executable, "-c", script, json.dumps(argv), str(ready), str(int(signal.SIGINT))],
                          cwd=stops.REPO, capture_output=True, text=True, timeout=900, check=True)
    first = json.loads(done.stdout.strip().splitlines()[-1])
    assert first["code"] == 130 and first["left"] == [], first
    assert not (out / ".work" / "unpacked").exists() and stops._stale_forkserver_folders() == []
    assert not (out / "grades.csv").exists() and "Traceback" not in first["err"], first["err"]
    again = stops._autograde(archive, out, "-", 0)
    assert again["code"] == 0 and again["left"] == [], again
    rows = read_rows(out)
    assert {s: sum(rows[s, stops.A.name][0].values()) for s in ("ann", "bob", "hang1", "hang2")} == dict.fromkeys(
        ("ann", "bob", "hang1", "hang2"), 10.0)

if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
