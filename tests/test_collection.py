"""Collecting hand-ins: LMS zips as instructors have them, and folders no hand-in can use to stop the batch."""

import csv
import io
import os
import resource
import zipfile

import nbformat
import pytest
from conftest import autograde, read_rows

from grader.author.mutants import reference_submission
from grader.collect.submissions import collect, unpack_zip
from grader.course import assignment_named, assignments
from grader.results import Note, NoteKind, Result, csv_cell, printable, write_csv

ONE = "01_gradient_descent"
A = assignment_named(ONE)


def _zip(path, members: dict[str, str]):
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in members.items():
            zf.writestr(name, text)
    return path


def _found(root):
    return {(s.student, s.assignment): s for s in collect(root, assignments())}


def test_canvas_students_are_keyed_by_user_id_and_re_uploads_are_graded(tmp_path):
    notebook = nbformat.writes(reference_submission(A))
    archive = _zip(tmp_path / "canvas.zip", {
        f"smithjohn_1234_5678_{ONE}.ipynb": notebook,
        f"smithjohn_1299_5679_{ONE} (1).ipynb": notebook,  # another John Smith, uploaded twice
        f"doejane_LATE_1300_5680_{ONE}_final.ipynb": notebook,
        f"leeann_1301_5681_{ONE}-2.ipynb": notebook,
        "roeray_1302_5682_my homework.ipynb": notebook,  # another name, one notebook: the zip is for one assignment
        "../escape.ipynb": "{}",
    })
    found = _found(unpack_zip(archive, tmp_path / "unpacked", assignments()).root)
    assert set(found) == {(s, ONE) for s in ("smithjohn_1234", "smithjohn_1299", "doejane_1300", "leeann_1301", "roeray_1302")}
    assert found["smithjohn_1234", ONE].notes == []
    assert found["smithjohn_1299", ONE].notes == [Note(NoteKind.RENAMED, f"renamed: graded {ONE}-1.ipynb as {ONE}.ipynb")]
    assert found["roeray_1302", ONE].notes == [Note(NoteKind.RENAMED, f"renamed: graded my-homework.ipynb as {ONE}.ipynb")]
    assert all(s.notebook is not None and not s.problem for s in found.values())
    assert found["doejane_1300", ONE].submitted_at  # the time the zip recorded for the upload
    assert not (tmp_path / "escape.ipynb").exists()


def _with_assignment(assignment_name):
    nb = reference_submission(A)
    nb.metadata["tml"] = {"assignment": assignment_name}
    return nbformat.writes(nb)


def test_colab_kaggle_and_student_names_are_graded_as_their_assignment_without_being_told(tmp_path):
    """A zip for two assignments: names Colab, Kaggle and students give, and one the notebook's metadata decides."""
    two = assignments()[2]
    notebook = nbformat.writes(reference_submission(A))
    archive = _zip(tmp_path / "class.zip", {
        f"adalovelace_1001_2001_Copy of {ONE}.ipynb": notebook,  # Colab: File → Download of a saved copy
        "babbagecharles_1002_2002_01-gradient-descent.ipynb": notebook,  # Kaggle: `-` for `_`
        "hopper_1003_2003_homework final.ipynb": notebook,  # the student's own name: its metadata says 01
        f"curie_1004_2004_{two.notebook}": nbformat.writes(reference_submission(two)),
        "noether_1005_2005_broken.ipynb": "{not json",  # unreadable: no assignment to put it in
    })
    found = _found(unpack_zip(archive, tmp_path / "unpacked", assignments()).root)
    for student, name in (("adalovelace_1001", f"Copy-of-{ONE}.ipynb"), ("babbagecharles_1002", "01-gradient-descent.ipynb"),
                          ("hopper_1003", "homework-final.ipynb")):
        assert found[student, ONE].notes == [Note(NoteKind.RENAMED, f"renamed: graded {name} as {ONE}.ipynb")]
    assert all(found[s, ONE].notebook and not found[s, ONE].problem for s in ("adalovelace_1001", "babbagecharles_1002",
                                                                              "hopper_1003"))
    assert found["curie_1004", two.name].notebook is not None
    assert found["noether_1005", "unmatched-upload"].problem.text.startswith("unknown assignment folder")


def test_a_foreign_or_unreadable_notebook_gets_a_status(tmp_path):
    root = tmp_path / "class"
    for student, text in (("ann", _with_assignment(assignments()[2].name)), ("ben", "\x00\xff not a notebook"),
                          ("cat", _with_assignment(ONE))):
        (root / student / ONE).mkdir(parents=True)
        (root / student / ONE / A.notebook).write_text(text)
    (root / "cat" / ONE / "notes.ipynb").write_text("{}")
    (root / "cat" / ONE / A.notebook).rename(root / "cat" / ONE / "mine.ipynb")  # two notebooks, neither named 01
    found = _found(root)
    assert found["ann", ONE].problem == Note(NoteKind.MISSING,
                                             f"foreign notebook: {A.notebook} is {assignments()[2].name}'s (its metadata)")
    assert found["ben", ONE].notebook is not None and not found["ben", ONE].problem  # the worker says "invalid notebook"
    assert found["cat", ONE].notes[0] == Note(NoteKind.RENAMED, f"renamed: graded mine.ipynb as {ONE}.ipynb (its metadata)")


def test_moodle_folders_are_understood(tmp_path):
    archive = _zip(tmp_path / "moodle.zip", {
        f"Ann Lee_4411_assignsubmission_file_/{ONE}.ipynb": nbformat.writes(reference_submission(A)),
        f"Ann Lee_4412_assignsubmission_file_/{ONE}.ipynb": nbformat.writes(reference_submission(A)),
    })
    found = _found(unpack_zip(archive, tmp_path / "unpacked", assignments()).root)
    assert set(found) == {("Ann-Lee_4411", ONE), ("Ann-Lee_4412", ONE)}


def test_a_folder_of_traps_never_stops_collection(tmp_path):
    root = tmp_path / "class"
    good = root / "alice" / ONE
    good.mkdir(parents=True)
    nbformat.write(reference_submission(A), good / A.notebook)
    with open(good / "huge.bin", "wb") as f:  # a 3 GiB sparse file: never read
        f.truncate(3 * 2**30)
    os.mkfifo(good / "pipe")
    os.symlink("/proc/self/mem", good / "mem.ipynb")
    linked = root / "bob" / ONE
    linked.mkdir(parents=True)
    os.symlink(A.source, linked / A.notebook)  # the solution notebook, by a link
    os.symlink(root / "alice", root / "carol")  # a whole student folder that is someone else's
    (root / "=cmd|calc").mkdir()
    (root / "dave" / "not-an-assignment").mkdir(parents=True)
    locked = root / "erin" / ONE
    locked.mkdir(parents=True)
    nbformat.write(reference_submission(A), locked / A.notebook)
    os.chmod(locked, 0)
    found = _found(root)
    alice = found["alice", ONE]
    assert alice.notebook == good / A.notebook and not alice.problem
    assert {"link mem.ipynb refused", "special file pipe ignored"} <= {n.text for n in alice.notes}
    assert found["bob", ONE].problem == Note(NoteKind.MISSING, f"missing notebook {ONE}.ipynb (found: no notebook)")
    assert Note(NoteKind.REFUSED, "link 01_gradient_descent.ipynb refused") in found["bob", ONE].notes
    assert found["carol", "?"].problem == Note(NoteKind.REFUSED, "refused: the student folder is a link")
    assert any(s.problem and "unsafe folder name" in s.problem.text for s in found.values())
    assert found["dave", "not-an-assignment"].problem.kind == NoteKind.REFUSED
    if os.geteuid() != 0:  # root reads a mode-0 folder anyway
        assert found["erin", ONE].problem.text.startswith("could not read")


@pytest.mark.slow
def test_the_batch_survives_the_traps_with_bounded_memory(tmp_path):
    root = tmp_path / "class"
    for student in ("alice", "bob"):
        (root / student / ONE).mkdir(parents=True)
        nbformat.write(reference_submission(A), root / student / ONE / A.notebook)
    with open(root / "alice" / ONE / "data.bin", "wb") as f:
        f.truncate(3 * 2**30)
    os.symlink("/proc/self/mem", root / "alice" / ONE / "zz.ipynb")
    (root / "mallory" / ONE).mkdir(parents=True)
    os.symlink(A.source, root / "mallory" / ONE / A.notebook)
    autograde(root, tmp_path / "out", "--timeout", "20")
    rows = read_rows(tmp_path / "out")
    assert sum(rows["alice", ONE][0].values()) == sum(rows["bob", ONE][0].values()) == 10
    assert sum(rows["mallory", ONE][0].values()) == 0
    assert resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss < 2 * 2**20  # KiB: under 2 GiB


def test_spreadsheet_formulas_and_terminal_codes_are_neutralised(tmp_path):
    renamed = Note(NoteKind.RENAMED, "renamed: graded \x1b[31mred\x1b[0m.ipynb")
    results = [Result("=HYPERLINK(\"http://x\")", ONE, {}, {}, [renamed]),
               Result("+1", ONE, {}, {}, [Note(NoteKind.REFUSED, "-2")]), Result("@sum", ONE, {}, {}, [])]
    write_csv(results, list(A.grade_cells()), tmp_path / "grades.csv")
    rows = list(csv.reader(io.StringIO((tmp_path / "grades.csv").read_text())))[1:]
    assert [r[0] for r in rows] == ["'+1", "'=HYPERLINK(\"http://x\")", "'@sum"]
    assert "\x1b" not in (tmp_path / "grades.csv").read_text()
    assert rows[0][-1] == "'-2"
    assert csv_cell("ok") == "ok" and printable("a\x1b[2Jb\n") == "a\\x1b[2Jb\\n"


@pytest.mark.slow
def test_colab_and_kaggle_downloads_in_an_lms_zip_are_graded_without_assignment(tmp_path):
    setup = assignments()[0]  # a second assignment in the zip, so that no "only assignment" rule applies
    notebook = nbformat.writes(reference_submission(A))
    archive = _zip(tmp_path / "class.zip", {
        f"adalovelace_1001_2001_Copy of {ONE}.ipynb": notebook,
        "babbagecharles_1002_2002_01-gradient-descent.ipynb": notebook,
        f"curie_1004_2004_{setup.notebook}": nbformat.writes(nbformat.read(setup.release, as_version=4)),
    })
    autograde(archive, tmp_path / "out", "--timeout", "20")
    rows = read_rows(tmp_path / "out")
    for student, name in (("adalovelace_1001", f"Copy-of-{ONE}.ipynb"), ("babbagecharles_1002", "01-gradient-descent.ipynb")):
        points, status = rows[student, ONE][:2]
        assert sum(points.values()) == sum(A.grade_cells().values()) and status == f"renamed: graded {name} as {A.notebook}"
    assert ("curie_1004", setup.name) in rows


def test_a_timestamp_in_the_upload_never_sets_the_hand_in_time(tmp_path):
    """The forger's own timestamp.txt (in each LMS layout) is ignored and named; the zip's time counts, but for
    Moodle, whose zip times are not hand-in times (test_zip_layouts.py): none."""
    notebook = nbformat.writes(reference_submission(A))
    when = (2030, 1, 20, 9, 30, 0)
    members = {
        f"forger_1234_5678_{ONE}.ipynb": notebook, "forger_1234_5678_timestamp.txt": "2000-01-01 00:00:00",
        f"honest_1235_5679_{ONE}.ipynb": notebook,
        f"Fay Forge_77_assignsubmission_file_/{ONE}.ipynb": notebook,
        "Fay Forge_77_assignsubmission_file_/timestamp.txt": "2000-01-01 00:00:00",
        f"ann/{ONE}/{A.notebook}": notebook, f"ann/{ONE}/timestamp.txt": "2000-01-01 00:00:00",
    }
    with zipfile.ZipFile(tmp_path / "lms.zip", "w") as zf:
        for name, text in members.items():
            zf.writestr(zipfile.ZipInfo(name, date_time=when), text)
    found = _found(unpack_zip(tmp_path / "lms.zip", tmp_path / "unpacked", assignments()).root)
    stamp = "2030-01-20T09:30:00"
    for student in ("forger_1234", "Fay-Forge_77", "ann"):
        sub = found[student, ONE]
        assert sub.submitted_at == ("" if student == "Fay-Forge_77" else stamp), (student, sub.submitted_at)
        assert [n.kind for n in sub.notes] == [NoteKind.TIME_IGNORED], (student, sub.notes)
        assert sub.notebook is not None and not sub.problem
    assert found["honest_1235", ONE].submitted_at == stamp and found["honest_1235", ONE].notes == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lms.zip", "unpacked"]


def test_a_folder_keeps_nbgraders_exchange_timestamp(tmp_path):
    """A folder (nbgrader's exchange layout) has no zip time: its timestamp.txt, written by the exchange, counts."""
    hand_in = tmp_path / "class" / "alice" / ONE
    hand_in.mkdir(parents=True)
    nbformat.write(reference_submission(A), hand_in / A.notebook)
    (hand_in / "timestamp.txt").write_text("2030-01-16 00:30:00.123456 Europe/Berlin\n")
    sub = _found(tmp_path / "class")["alice", ONE]
    assert sub.submitted_at == "2030-01-16 00:30:00.123456 Europe/Berlin" and sub.notes == []


def test_exports_and_the_cli_never_pass_on_formulas_or_terminal_codes(tmp_path, capsys):
    """A roster name and a hand-in folder name crafted for a spreadsheet and a terminal: every CSV the course
    writes neutralises the formula, and the CLI prints the escape codes as text."""
    from grader.cli import main
    from grader.report.outputs import write_outputs

    full = {k: 1.0 for k in A.grade_cells()}
    graded = tmp_path / "graded"
    graded.mkdir()
    write_outputs([Result("=cmd|' /C calc'!A0", ONE, dict(full), dict(full)), Result("ann_101", ONE, dict(full), dict(full))],
                  {ONE: A}, graded, report=False)
    roster = tmp_path / "canvas.csv"
    with open(roster, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([
            ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", f"{ONE} (55)"],
            ["    Points Possible", "", "", "", "", "10"],
            ['=HYPERLINK("http://evil.example","ann")', "101", "S1", "\x1b]0;pwned\x07\x1b[2J", "A", ""],
            ["@SUM(1+1)\x1b[31m", "102", "S2", "bob", "A", ""]])
    assert main(["export", "--format", "canvas", "--roster", str(roster), str(graded), str(tmp_path / "out.csv")]) == 0
    printed = capsys.readouterr().out
    assert "\x1b" not in printed and "\x07" not in printed, printed
    for written in ("out.csv", "out.matching.csv", "graded/grades.csv"):
        cells = [c for row in csv.reader(io.StringIO((tmp_path / written).read_text())) for c in row]
        assert not [c for c in cells if c[:1] in ("=", "+", "@") or (c[:1] == "-" and not c[1:2].isdigit())], written
        assert not any("\x1b" in c or "\x07" in c for c in cells), written
