"""LMS zips collection must not misread: the student is always the LMS's own participant, every member left out
is named, and a zip with nothing to grade (unknown layout, empty, cut short) stops the run with one line."""

import io
import sys
import zipfile
from datetime import datetime, timezone
from types import SimpleNamespace

import nbformat
import pytest
from conftest import autograde

from grader.author.mutants import reference_submission
from grader.collect.deadlines import Config, LatePolicy, lateness
from grader.collect.submissions import CollectionError, collect, unpack_zip
from grader.course import assignment_named, assignments

ONE = "01_gradient_descent"
A = assignment_named(ONE)
NOTEBOOK = nbformat.writes(reference_submission(A))
BLACKBOARD = {f"Homework 1_user{k}_attempt_2030-01-15-23-59-00_{ONE}.ipynb": NOTEBOOK for k in range(3)}


def _zip(path, members: dict[str, str]):
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in members.items():
            zf.writestr(name, text)
    return path


def _unpacked(tmp_path, members: dict[str, str]):
    unpacked = unpack_zip(_zip(tmp_path / "lms.zip", members), tmp_path / "unpacked", assignments())
    return {(s.student, s.assignment): s for s in collect(unpacked.root, assignments())}, unpacked.skipped


def test_a_moodle_participant_is_moodles_own_folder_never_one_the_student_made(tmp_path):
    """A one-submitter Moodle zip (every member under one top folder, four levels deep) whose upload holds folders
    named after a classmate: graded as the participant Moodle named."""
    found, skipped = _unpacked(tmp_path, {
        f"Ada Lovelace_1001_assignsubmission_file_/Bob-Builder_2002/{ONE}/{A.notebook}": NOTEBOOK})
    assert list(found) == [("Ada-Lovelace_1001", ONE)] and skipped == []
    assert found["Ada-Lovelace_1001", ONE].notebook is not None and not found["Ada-Lovelace_1001", ONE].problem


def test_a_folder_layout_inside_one_top_folder_is_still_unwrapped(tmp_path):
    found, _ = _unpacked(tmp_path, {f"class/ann/{ONE}/{A.notebook}": NOTEBOOK})
    assert list(found) == [("ann", ONE)]


def test_moodle_without_download_as_folders_and_a_canvas_name_that_imitates_moodle(tmp_path):
    found, _ = _unpacked(tmp_path, {
        f"Ann Lee_4411_assignsubmission_file_{ONE}.ipynb": NOTEBOOK,  # Moodle's flat names
        f"smith_12_34_Eve_99_assignsubmission_file_{ONE}.ipynb": NOTEBOOK,  # Canvas: the student chose the file name
    })
    assert set(found) == {("Ann-Lee_4411", ONE), ("smith_12", ONE)}


def test_a_file_nearer_the_top_of_a_moodle_upload_is_kept_and_the_other_named(tmp_path):
    final, draft = nbformat.v4.new_notebook(), nbformat.v4.new_notebook()
    final.metadata["which"], draft.metadata["which"] = "final", "draft"
    folder = "Ann Lee_4411_assignsubmission_file_"
    found, skipped = _unpacked(tmp_path, {f"{folder}/old/{A.notebook}": nbformat.writes(draft),
                                          f"{folder}/{A.notebook}": nbformat.writes(final)})
    assert nbformat.read(found["Ann-Lee_4411", ONE].notebook, as_version=4).metadata["which"] == "final"
    assert skipped == [f"{folder}/old/{A.notebook} (another file of this name, nearer the top of the upload or "
                       "earlier in the zip, is the one kept)"]


def test_every_member_left_out_is_named_with_why(tmp_path):
    found, skipped = _unpacked(tmp_path, {
        f"Ann Lee_4411_assignsubmission_file_/{A.notebook}": NOTEBOOK,
        "Ann Lee_4411_assignsubmission_onlinetext_/onlinetext.html": "<p>see my notebook</p>",
        "__MACOSX/._x": "", "../escape.ipynb": "{}", **dict(list(BLACKBOARD.items())[:1]),
    })
    assert list(found) == [("Ann-Lee_4411", ONE)]
    assert sorted(skipped) == sorted([
        "Ann Lee_4411_assignsubmission_onlinetext_/onlinetext.html (Moodle onlinetext submission, not an uploaded file)",
        "__MACOSX/._x (macOS metadata)", "../escape.ipynb (unsafe path)",
        f"Homework 1_user0_attempt_2030-01-15-23-59-00_{ONE}.ipynb (fits no known layout)"])


def test_the_run_names_the_members_left_out(tmp_path, capsys):
    from grader.batch.autograde import _unpacked as unpacked_for_the_run

    archive = _zip(tmp_path / "lms.zip", {f"ann_1_2_{A.notebook}": NOTEBOOK, "readme.txt": "hello"})
    run = SimpleNamespace(work=tmp_path / "work", known={a.name: a for a in assignments()})
    with unpacked_for_the_run(archive, run, None) as root:
        assert [p.name for p in root.iterdir() if not p.name.startswith(".")] == ["ann_1"]
    assert capsys.readouterr().err == "1 file(s) in lms.zip not unpacked:\n  readme.txt (fits no known layout)\n"


def test_a_moodle_hand_in_gets_no_time_from_the_zip_and_so_no_late_penalty(tmp_path):
    """Moodle's member times are the download's or its file store's (README): a due date finds the time unknown."""
    late = (2030, 2, 1, 0, 0, 0)
    with zipfile.ZipFile(tmp_path / "lms.zip", "w") as zf:
        for name in (f"Ann Lee_4411_assignsubmission_file_/{A.notebook}", f"ann_12_34_{A.notebook}"):
            zf.writestr(zipfile.ZipInfo(name, date_time=late), NOTEBOOK)
    unpacked = unpack_zip(tmp_path / "lms.zip", tmp_path / "unpacked", assignments())
    found = {s.student: s for s in collect(unpacked.root, assignments())}
    assert found["ann_12"].submitted_at == "2030-02-01T00:00:00"  # Canvas: the zip's time
    config = Config(due={ONE: datetime(2030, 1, 15, tzinfo=timezone.utc)}, late=LatePolicy(per_day=10))
    moodle = lateness(config, "Ann-Lee_4411", ONE, found["Ann-Lee_4411"].submitted_at)
    assert (moodle.late_by, moodle.fraction) == (None, 0.0) and moodle.note.startswith("hand-in time unknown")
    assert lateness(config, "ann_12", ONE, found["ann_12"].submitted_at).fraction > 0  # (the control: a time is used)


@pytest.mark.parametrize("members, why", [
    (BLACKBOARD, f"lms.zip holds no hand-in: none of its 3 file(s) fits a layout collection knows (Canvas, Moodle, "
                 f"<student>/<assignment>/<file>): Homework 1_user0_attempt_2030-01-15-23-59-00_{ONE}.ipynb (fits no "
                 "known layout); Homework 1_user1_attempt_"),
    ({}, "lms.zip is empty: no hand-in to grade"),
])
def test_a_zip_without_a_hand_in_stops_collection(tmp_path, members, why):
    with pytest.raises(CollectionError) as stop:
        unpack_zip(_zip(tmp_path / "lms.zip", members), tmp_path / "unpacked", assignments())
    assert str(stop.value).startswith(why) and "\n" not in str(stop.value)


def test_a_zip_cut_short_is_refused_in_one_line(tmp_path):
    whole = io.BytesIO()
    with zipfile.ZipFile(whole, "w") as zf:
        for k in range(3):
            zf.writestr(f"student{k}_100{k}_555{k}_{A.notebook}", NOTEBOOK)
    (tmp_path / "lms.zip").write_bytes(whole.getvalue()[: len(whole.getvalue()) // 2])
    with pytest.raises(CollectionError, match=r"^lms.zip is not a readable zip \(BadZipFile: .*\); download it again$"):
        unpack_zip(tmp_path / "lms.zip", tmp_path / "unpacked", assignments())


@pytest.mark.integration
@pytest.mark.parametrize("members", [BLACKBOARD, {}, "cut short"])
def test_autograde_stops_with_exit_code_2_and_one_line(tmp_path, members):
    archive = tmp_path / "lms.zip"
    if members == "cut short":
        archive.write_bytes(_zip(tmp_path / "whole.zip", BLACKBOARD).read_bytes()[:300])
    else:
        _zip(archive, members)
    run = autograde(archive, tmp_path / "out", "--unsandboxed", check=False)
    assert run.returncode == 2, run.stdout + run.stderr
    lines = run.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("nothing graded: lms.zip "), run.stderr
    assert not (tmp_path / "out" / "grades.csv").exists()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


def test_a_canvas_like_file_name_inside_a_moodle_folder_is_that_participants(tmp_path):
    # round 2 of the hostile review: Ada's upload named like Canvas's "<name>_<user>_<submission>_<file>" was filed
    # as participant 1002's hand-in
    found, _ = _unpacked(tmp_path, {f"Ada Lovelace_1001_assignsubmission_file_/gauss_1002_1_{A.notebook}": NOTEBOOK})
    assert set(found) == {("Ada-Lovelace_1001", ONE)}


def test_a_moodle_download_zipped_again_inside_one_folder_is_still_moodles(tmp_path):
    # round 2 of the hostile review: the wrapper was taken for one student holding every participant's folder
    found, _ = _unpacked(tmp_path, {
        f"downloads/Ada Lovelace_1001_assignsubmission_file_/{A.notebook}": NOTEBOOK,
        f"downloads/Carl Gauss_1002_assignsubmission_file_/{A.notebook}": NOTEBOOK,
    })
    assert set(found) == {("Ada-Lovelace_1001", ONE), ("Carl-Gauss_1002", ONE)}
