"""Moodle in any language (issue 22 item 2): the worksheet and gradebook export read by what their columns hold, OUT.csv
with the file's own headers, a Moodle-zip class matched by both routes, and a warning for a worksheet older than the grades.
Issue 34: the gradebook's grade item that fits the assignment is the one filled, and the report and `export` say that a
Moodle zip gives no hand-in times to check a due date against.

The Spanish and German headers below follow Moodle's language packs where the research notes verified them (`ID` and
`Teilnehmer/in`, `Identificador` and `Participante`, `La calificación puede cambiarse`); the others are stand-ins: the
reader never looks at a non-English header's words.
"""

import html
import os

import pytest
from instructor_class import FULL, ONE, A
from test_lms import graded, parse, write  # noqa: F401  (graded is a fixture)

from grader.collect.deadlines import lateness, parse_config, settle
from grader.report.columns import ColumnError
from grader.report.lms import export, read_roster
from grader.report.moodle import english_header
from grader.report.outputs import write_outputs
from grader.report.report import NO_HAND_IN_TIME, analyse, render, untimed_note
from grader.results import Result


def worksheet(path, people=(("101", "Ada Lovelace", "ada@uni.example"), ("102", "Bo Chen", "bo@uni.example"))):
    return write(path, [
        ["ID", "Vollständiger Name", "E-Mail-Adresse", "Status", "Bewertung", "Höchste Bewertung",
         "Bewertung kann geändert werden", "Zuletzt geändert (Abgabe)", "Zuletzt geändert (Bewertung)", "Feedback"],
        *[[f"Teilnehmer/in {n}", name, email, "Zur Bewertung abgegeben", "", "10,00", "Ja",
           "Dienstag, 14. Januar 2030, 10:00", "-", ""] for n, name, email in people]])


def test_a_german_worksheet_keeps_its_headers_and_gets_the_grades_in_its_own_column(graded, tmp_path):  # noqa: F811
    sheet = worksheet(tmp_path / "Bewertungstabelle.csv")
    roster = read_roster(sheet, "moodle")
    assert roster.kind == "moodle-worksheet" and roster.participant == "Teilnehmer/in"
    assert [roster.own(c) for c in ("Identifier", "Grade", "Maximum Grade", "Email address")] == [
        "ID", "Bewertung", "Höchste Bewertung", "E-Mail-Adresse"]
    done = export(graded, roster, tmp_path / "out.csv")
    header, *rows = parse(tmp_path / "out.csv")
    assert header == parse(sheet)[0]
    assert [(r[0], r[4]) for r in rows] == [("Teilnehmer/in 101", "10"), ("Teilnehmer/in 102", "6,3")]
    assert {m.student: m.how for m in done["matched"]} == {"Ada-Lovelace_101": "id (ID)", "Bo-Chen_102": "id (ID)"}
    assert done["notes"] == []  # 10,00 is the 10 points grades.csv has


def test_a_spanish_gradebook_export_matches_a_moodle_zip_class_by_full_name_and_email(graded, tmp_path):  # noqa: F811
    book = write(tmp_path / "calificaciones.csv", [
        ["Nombre", "Apellido(s)", "Número de ID", "Institución", "Departamento", "Dirección de correo",
         "Tarea: 01_gradient_descent (Real)", "Última descarga de este curso"],
        ["Ada", "Lovelace", "", "Uni", "CS", "ada@uni.example", "-", "1700000000"],
        ["Bo", "Chen", "", "Uni", "CS", "bo@uni.example", "-", "1700000000"],
        ["Eve", "Vee", "", "Uni", "CS", "eve@uni.example", "-", "1700000000"]])
    done = export(graded, read_roster(book, "moodle"), tmp_path / "out.csv")
    header, *rows = parse(tmp_path / "out.csv")
    assert header == ["Nombre", "Apellido(s)", "Número de ID", "Institución", "Departamento", "Dirección de correo",
                      "Tarea: 01_gradient_descent (Real)"]
    assert [r[0] + ":" + r[-1] for r in rows] == ["Ada:10", "Bo:6.3", "Eve:8"]
    assert {m.student: m.how for m in done["matched"]} == {
        "Ada-Lovelace_101": "full name", "Bo-Chen_102": "full name", "eve@uni.example": "email (Dirección de correo)"}


def test_a_gradebook_export_gets_the_grades_in_the_grade_item_whose_name_fits(graded, tmp_path):  # noqa: F811
    book = write(tmp_path / "grades.csv", [
        ["First name", "Last name", "ID number", "Institution", "Department", "Email address",
         "Assignment: 01 Gradient descent (Real)", "Assignment: Quiz 1 (Real)", "Course total (Real)",
         "Last downloaded from this course"],
        ["Ada", "Lovelace", "", "Uni", "CS", "ada@uni.example", "-", "-", "-", "1700000000"]])
    done = export(graded, read_roster(book, "moodle"), tmp_path / "out.csv")
    header, *rows = parse(tmp_path / "out.csv")
    assert header[6:] == ["Assignment: 01 Gradient descent (Real)"] and rows == [[*parse(book)[1][:6], "10"]]
    assert done["notes"] == [f"{ONE} fills the column 'Assignment: 01 Gradient descent (Real)' (its title fits)"]
    book = write(tmp_path / "other.csv", [parse(book)[0][:6] + ["Assignment: Quiz 1 (Real)"], parse(book)[1][:7]])
    with pytest.raises(ColumnError, match="no column for 01_gradient_descent .*create the assignment in Moodle"):
        export(graded, read_roster(book, "moodle"), tmp_path / "out.csv")


def test_a_worksheet_is_its_own_assignments_column_so_column_options_are_refused(graded, tmp_path):  # noqa: F811
    sheet = read_roster(worksheet(tmp_path / "sheet.csv"), "moodle")
    for option in ({"columns": {ONE: "Bewertung"}}, {"new_columns": True}):
        with pytest.raises(ColumnError, match="a Moodle grading worksheet, whose one grade column is its own Moodle "
                                              "assignment's: --assignment chooses"):
            export(graded, sheet, tmp_path / "out.csv", **option)


@pytest.fixture
def moodle_class(tmp_path):
    """Three hand-ins from a Moodle zip (no hand-in time) and one with a time, 10 h late, all with a due date."""
    config = parse_config(f'[due]\n{ONE} = "2030-01-15 23:59"\n[late]\nper_day = 10\n', [ONE])
    rows = [settle(Result(student, ONE, dict(FULL), dict(FULL), submitted_at=time), lateness(config, student, ONE, time))
            for student, time in (("Ada-Lovelace_101", ""), ("Bo-Chen_102", ""), ("Cy-Dee_103", ""),
                                  ("timed_104", "2030-01-16 09:59"))]
    (tmp_path / "graded").mkdir()
    write_outputs(rows, {ONE: A}, tmp_path / "graded", report=False)
    return rows, tmp_path / "graded"


def test_the_report_says_moodle_gives_no_hand_in_times_and_blames_neither_release_nor_grader(moodle_class):
    page = html.unescape(render(analyse([r.to_dict() for r in moodle_class[0]])))
    # the look-at row of the three without a time explains it instead of suspecting the release or the grader
    assert f"not checked against the due date 2030-01-15T23:59:00+00:00 <b>({NO_HAND_IN_TIME})</b></td><td class=n>3<" in page
    assert "the release or the grader" not in page
    assert (f"4 graded hand-ins had a due date; 3 of them have no hand-in time: {NO_HAND_IN_TIME}; of the 1 with a "
            "hand-in time, 1 came after the due date, 1 lost points (1 in all).") in page


def test_autograde_s_terminal_says_which_hand_ins_had_no_time_to_check_the_due_date_against(moodle_class):
    assert untimed_note(moodle_class[0]) == f"3 hand-in(s) had a due date but no hand-in time: {NO_HAND_IN_TIME}"
    assert untimed_note(moodle_class[0][3:]) == ""  # the one with a time


def test_the_export_says_which_hand_ins_had_no_time_to_check_the_due_date_against(moodle_class, tmp_path):
    sheet = worksheet(tmp_path / "sheet.csv", people=[(n, name, f"{n}@uni.example") for n, name in
                                                      (("101", "Ada Lovelace"), ("102", "Bo Chen"), ("103", "Cy Dee"))])
    done = export(moodle_class[1], read_roster(sheet, "moodle"), tmp_path / "out.csv")
    assert done["notes"] == [f"3 exported hand-in(s) of {ONE} had a due date but no hand-in time: {NO_HAND_IN_TIME}"]


def test_the_columns_are_found_by_what_they_hold():
    sheet = [["Identificador", "Nombre completo", "Estado", "Calificación", "Calificación máxima",
              "La calificación puede cambiarse", "Última modificación (entrega)", "Última modificación (calificación)",
              "Comentarios de retroalimentación"],
             ["Participante 7", "Zoë Ruiz", "Enviado", "7,5", "10,00", "Sí", "lunes, 13 de enero de 2030", "-", ""]]
    english, word = english_header(sheet[0], sheet[1:])
    assert word == "Participante" and english == [
        "Identifier", "Full name", "Estado", "Grade", "Maximum Grade", "La calificación puede cambiarse",
        "Última modificación (entrega)", "Last modified (grade)", "Comentarios de retroalimentación"]
    english_one = ["Identifier", "Full name", "Grade", "Last modified (grade)"]
    assert english_header(english_one, [["Participant 1", "A", "", "-"]]) == (english_one, "Participant")


def test_a_worksheet_older_than_the_grades_is_warned_about(graded, tmp_path):  # noqa: F811
    sheet = worksheet(tmp_path / "old.csv")
    grades = graded / "grades.csv"
    os.utime(sheet, (grades.stat().st_mtime - 3600,) * 2)
    done = export(graded, read_roster(sheet, "moodle"), tmp_path / "out.csv")
    (note,) = done["notes"]
    assert note.startswith("the worksheet old.csv (") and "is older than these grades" in note
    assert "download the worksheet again before uploading" in note


def test_a_roster_that_matches_nobody_is_refused(graded, tmp_path):  # noqa: F811
    from grader.report.lms import ExportError

    sheet = worksheet(tmp_path / "other-class.csv", people=(("555", "Ann Other", "ann@else.example"),))
    with pytest.raises(ExportError, match="matches a row of .*other-class.csv .*is it this class's roster"):
        export(graded, read_roster(sheet, "moodle"), tmp_path / "out.csv")


def test_a_class_collected_from_a_moodle_zip_matches_both_routes(tmp_path):
    import zipfile

    from grader.collect.submissions import unpack_zip
    from grader.course import assignments
    from grader.report.lms import match_students

    archive = tmp_path / "submissions.zip"
    with zipfile.ZipFile(archive, "w") as zf:  # Moodle's "download as folders": <Full Name>_<id>_assignsubmission_file_/
        # (Bo put his notebook into a folder of his upload: Moodle keeps it, and he is still keyed by participant)
        for name, number, folder in (("Ada Lovelace", 101, ""), ("Bo Chen", 102, "01_gradient_descent/")):
            zf.writestr(f"{name}_{number}_assignsubmission_file_/{folder}01_gradient_descent.ipynb", "{}")
    # (the unpacked root also holds the zip's hand-in times, in a dot file no student folder can be named)
    students = sorted(p.name for p in unpack_zip(archive, tmp_path / "class", assignments()).root.iterdir()
                      if not p.name.startswith("."))
    assert students == ["Ada-Lovelace_101", "Bo-Chen_102"]
    book = write(tmp_path / "book.csv", [
        ["Nombre", "Apellido(s)", "Número de ID", "Institución", "Departamento", "Dirección de correo"],
        ["Bo", "Chen", "", "", "", "bo@uni.example"], ["Ada", "Lovelace", "", "", "", "ada@uni.example"]])
    for roster in (read_roster(worksheet(tmp_path / "sheet.csv"), "moodle"), read_roster(book, "moodle")):
        matches, unmatched, without = match_students(roster, students)
        assert len(matches) == 2 and unmatched == [] and without == [], roster.kind
