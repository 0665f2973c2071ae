"""LMS exports: rosters read and checked, students matched by id / login / email, every file parses back to grades.csv,
each assignment in the roster's own column for it (by its title or --column; a new one only with --new-column).

Fast: the graded folder here is written directly (grades.csv and results.json through the grader's own writer);
tests/test_report.py exports a really graded class of 53 to all three formats.
"""

import csv
import subprocess

import pytest
from conftest import PYTHON, REPO
from instructor_class import FULL, ONE, A

from grader.report.columns import ColumnError, parse_columns
from grader.report.lms import ExportError, RosterError, export, match_students, read_roster
from grader.report.outputs import write_outputs
from grader.results import Note, NoteKind, Result

ZERO = {k: 0.0 for k in FULL}


@pytest.fixture
def graded(tmp_path):
    """A graded folder: three Canvas-keyed students, one keyed by login, one by email, one nobody knows."""
    rows = [Result("Ada-Lovelace_101", ONE, dict(FULL), dict(FULL)),
            Result("Bo-Chen_102", ONE, {**FULL, "mse_grad": 0.0}, dict(FULL), penalty=0.7,
                   lateness={"late_by": 5.5, "submitted": "2030-01-16T05:29:00+00:00", "due": "x", "fraction": 0.1}),
            Result("Cy-Dee_103", ONE, ZERO, dict(FULL), [Note(NoteKind.NO_SUBMISSION, "no submission")]),
            Result("dlogin", ONE, dict(FULL), dict(FULL)),
            Result("eve@uni.example", ONE, {**FULL, "critical_lr": 0.0}, dict(FULL)),
            Result("stranger_999", ONE, dict(FULL), dict(FULL))]
    out = tmp_path / "graded"
    out.mkdir()
    write_outputs(rows, {ONE: A}, out, report=False)
    return out


def write(path, rows):
    with open(path, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(rows)
    return path


def canvas(tmp_path, extra=(), column=f"{ONE} (55)"):
    return write(tmp_path / "canvas.csv", [
        ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", column, "Quiz 1 (56)", "Current Score"],
        ["    Points Possible", "", "", "", "", "10", "5", "(read only)"],
        ["Lovelace, Ada", "101", "S1", "alovelace", "A", "", "4", "80"],
        ["Chen, Bo", "102", "S2", "bchen", "A", "", "3", "60"],
        ["Dee, Cy", "103", "S3", "cdee", "B", "", "", ""],
        ["Login, Dan", "104", "S4", "dlogin", "B", "", "", ""],
        ["Vee, Eve", "105", "S5", "eve@uni.example", "B", "", "", ""],
        ["Nobody, Noah", "106", "S6", "nnobody", "B", "", "", ""],
        *extra])


def parse(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.reader(f))


def test_canvas_export_matches_by_id_then_login_and_parses_back(graded, tmp_path):
    done = export(graded, read_roster(canvas(tmp_path), "canvas"), tmp_path / "out.csv")
    header, points, *rows = parse(tmp_path / "out.csv")
    assert header == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", f"{ONE} (55)"]
    assert points == ["    Points Possible", "", "", "", "", "10"]
    grades = {r["student"]: r for r in csv.DictReader(open(graded / "grades.csv"))}
    assert {r[1]: r[5] for r in rows} == {"101": grades["Ada-Lovelace_101"]["total"], "102": grades["Bo-Chen_102"]["total"],
                                          "103": "0", "104": "10", "105": grades["eve@uni.example"]["total"]}
    assert grades["Bo-Chen_102"]["total"] == "6.3"  # 7 earned, 0.7 taken for lateness
    assert {m.student: m.how for m in done["matched"]} == {
        "Ada-Lovelace_101": "id (ID)", "Bo-Chen_102": "id (ID)", "Cy-Dee_103": "id (ID)", "dlogin": "login (SIS Login ID)",
        "eve@uni.example": "login (SIS Login ID)"}
    assert done["unmatched"] == ["stranger_999"] and done["without_names"] == ["Nobody, Noah"]
    sidecar = list(csv.DictReader(open(tmp_path / "out.matching.csv")))
    assert [(r["outcome"][:7], r["student"], r["roster row"]) for r in sidecar if r["outcome"] != "matched"] == [
        ("hand-in", "stranger_999", ""), ("in the ", "", "8")]


@pytest.mark.parametrize("title", ["01 Gradient descent", "01 – Gradient-Descent", "1", "01", "Gradient Descent",
                                   ONE])
def test_canvas_export_fills_the_column_of_the_canvas_assignment_whose_title_fits(graded, tmp_path, title):
    done = export(graded, read_roster(canvas(tmp_path, column=f"{title} (123)"), "canvas"), tmp_path / "out.csv")
    header, points, *rows = parse(tmp_path / "out.csv")
    assert header[5:] == [f"{title} (123)"] and points[5:] == ["10"]  # Canvas's header: its import updates assignment 123
    assert rows[0][5] == "10"
    assert f"{ONE} fills the column '{title} (123)' (its title fits)" in done["notes"]


def test_a_column_named_with_column_wins_and_several_fitting_columns_are_refused(graded, tmp_path):
    roster = write(tmp_path / "two.csv", [["Student", "ID", "SIS Login ID", "Section", "01 (55)", "01 Gradient descent (123)",
                                           "Quiz 1 (56)"], ["Lovelace, Ada", "101", "a", "A", "", "", ""]])
    with pytest.raises(ColumnError, match=r"2 columns of .*two.csv fit 01_gradient_descent: '01 \(55\)', "
                                          r"'01 Gradient descent \(123\)' — choose one with --column"):
        export(graded, read_roster(roster, "canvas"), tmp_path / "out.csv")
    done = export(graded, read_roster(roster, "canvas"), tmp_path / "out.csv",
                  columns=parse_columns([f"{ONE}=01 Gradient descent (123)"]))
    assert parse(tmp_path / "out.csv")[0][4:] == ["01 Gradient descent (123)"]
    assert done["notes"] == [f"{ONE} fills the column '01 Gradient descent (123)' (--column)"]
    with pytest.raises(ColumnError, match=r"--column 01_gradient_descent='Quiz 2': .* has no such assignment column "
                                          r"\(it has '01 \(55\)', '01 Gradient descent \(123\)', 'Quiz 1 \(56\)'\)"):
        export(graded, read_roster(roster, "canvas"), tmp_path / "out.csv", columns={ONE: "Quiz 2"})
    with pytest.raises(ColumnError, match="02_autograd_graph is not an exported assignment"):
        export(graded, read_roster(roster, "canvas"), tmp_path / "out.csv", columns={"02_autograd_graph": "01 (55)"})


def test_no_fitting_column_is_refused_unless_a_new_column_is_asked_for(graded, tmp_path):
    roster = read_roster(canvas(tmp_path, column="Quiz 2 (57)"), "canvas")
    # (Quiz 1 is no fit for 01 by its number, and Current Score is no assignment column)
    with pytest.raises(ColumnError, match=r"has no column for 01_gradient_descent \(its assignment columns: 'Quiz 2 \(57\)', "
                                          r"'Quiz 1 \(56\)'\): create the assignment in Canvas and export the roster again"):
        export(graded, roster, tmp_path / "out.csv")
    assert not (tmp_path / "out.csv").exists()
    done = export(graded, roster, tmp_path / "out.csv", new_columns=True)
    header, points, *_ = parse(tmp_path / "out.csv")
    assert header[5:] == [ONE] and points[5:] == ["10"]
    assert done["notes"] == [f"{ONE} fills the column '{ONE}' (--new-column: Canvas's import creates a new assignment "
                             "for it)"]


@pytest.mark.parametrize("pairs, says", [(["01_gradient_descent"], "write ASSIGNMENT=COLUMN"),
                                         (["=01 (55)"], "write ASSIGNMENT=COLUMN"),
                                         (["a=1 (1)", "a=2 (2)"], "given twice")])
def test_a_malformed_column_option_is_refused(pairs, says):
    with pytest.raises(ColumnError, match=says):
        parse_columns(pairs)


def test_gradescope_export_has_gradescopes_export_columns(graded, tmp_path):
    roster = write(tmp_path / "gs.csv", [["First Name", "Last Name", "SID", "Email", "Role", "Sections"],
                                         ["Ada", "Lovelace", "101", "ada@uni.example", "Student", ""],
                                         ["Bo", "Chen", "102", "bo@uni.example", "Student", ""],
                                         ["Eve", "Vee", "E5", "eve@uni.example", "Student", ""]])
    done = export(graded, read_roster(roster, "gradescope"), tmp_path / "out.csv")
    header, *rows = parse(tmp_path / "out.csv")
    assert header == ["First Name", "Last Name", "SID", "Email", ONE, f"{ONE} - Max Points", f"{ONE} - Submission Time",
                      f"{ONE} - Lateness (H:M:S)", "Total Lateness (H:M:S)"]
    assert rows[1] == ["Bo", "Chen", "102", "bo@uni.example", "6.3", "10", "2030-01-16T05:29:00+00:00", "5:30:00", "5:30:00"]
    assert {m.student: m.how for m in done["matched"]}["eve@uni.example"] == "email (Email)"


def test_moodle_worksheet_fills_the_grade_of_participants_and_gradebook_export_matches_by_email(graded, tmp_path):
    sheet = write(tmp_path / "ws.csv", [
        ["Identifier", "Full name", "Email address", "Status", "Grade", "Maximum Grade", "Grade can be changed",
         "Last modified (submission)", "Last modified (grade)", "Feedback comments"],
        ["Participant 101", "Ada Lovelace", "ada@uni.example", "Submitted", "", "10.00", "Yes", "-", "-", ""],
        ["Participant 102", "Bo Chen", "bo@uni.example", "Submitted", "", "10.00", "Yes", "-", "-", ""]])
    export(graded, read_roster(sheet, "moodle"), tmp_path / "ws-out.csv")
    header, *rows = parse(tmp_path / "ws-out.csv")
    assert header == parse(sheet)[0] and [(r[0], r[4]) for r in rows] == [("Participant 101", "10"), ("Participant 102", "6.3")]
    book = write(tmp_path / "gb.csv", [
        ["First name", "Last name", "ID number", "Institution", "Department", "Email address",
         f"Assignment: {ONE} (Real)", "Last downloaded from this course"],
        ["Eve", "Vee", "", "Uni", "CS", "eve@uni.example", "-", "1700000000"],
        ["Dan", "Login", "dlogin", "Uni", "CS", "dan@uni.example", "-", "1700000000"],
        ["Ada", "Lovelace", "101", "Uni", "CS", "ada@uni.example", "-", "1700000000"]])
    done = export(graded, read_roster(book, "moodle"), tmp_path / "gb-out.csv")
    header, *rows = parse(tmp_path / "gb-out.csv")
    assert header == ["First name", "Last name", "ID number", "Institution", "Department", "Email address",
                      f"Assignment: {ONE} (Real)"]
    assert [r[0] + ":" + r[-1] for r in rows] == ["Eve:8", "Dan:10", "Ada:10"]
    # An ID number equal to the number in a Moodle zip's key is a participant id, not this ID number: the key
    # from the Moodle zip (full name and participant id) matches the gradebook's one row with that full name.
    assert {m.student: m.how for m in done["matched"]} == {"eve@uni.example": "email (Email address)",
                                                             "dlogin": "id (ID number)", "Ada-Lovelace_101": "full name"}


@pytest.mark.parametrize("rows, fmt, says", [
    ([["Student", "ID", "SIS Login ID", "Section"], ["A", "1", "a", "X"], ["B", "1", "b", "X"]], "canvas",
     "row 3, column 'ID': '1' is already on row 2"),
    ([["Student", "ID", "SIS Login ID", "Section"], ["A", "1", "a", "X"], ["B", "2", "A", "X"]], "canvas",
     "row 3, column 'SIS Login ID': 'A' is already on row 2"),
    ([["Student", "ID", "SIS Login ID"], ["A", "1", "a"]], "canvas", "row 1 (the header): column 'Section' missing"),
    ([["First Name", "Last Name", "SID", "Email"], ["A", "B", "1", "a@x"]], "canvas",
     "it looks like a Gradescope roster: use --format gradescope"),
    ([["Student", "ID", "SIS User ID", "SIS Login ID", "Section"], ["A", "1", "", "", ""]], "moodle",
     "column 'First name' missing — a Moodle grades export or grading worksheet has First name, Last name"),
    ([["Student", "ID", "SIS User ID", "SIS Login ID", "Section"], ["A", "1", "", "", ""]], "gradescope",
     "use --format canvas"),
    ([["First Name", "Last Name", "SID", "Email"], ["A", "B", "1", "a@x"], ["C", "D", "2", "A@X"]], "gradescope",
     "row 3, column 'Email': 'A@X' is already on row 2"),
    ([["First Name", "Last Name", "SID", "Email"], ["A", "B", "1"]], "gradescope", "row 2: 3 cells, but the header has 4"),
    ([["Identifier", "Full name", "Grade", "Last modified (grade)"], ["Student 7", "A", "", "-"]], "moodle",
     "row 2, column 'Identifier': 'Student 7' is not 'Participant <number>'"),
    ([["Identifier", "Full name", "Grade"], ["Participant 7", "A", ""]], "moodle", "column 'Last modified (grade)' missing"),
    ([], "canvas", "empty"),
])
def test_a_bad_roster_is_refused_naming_the_row_and_column(tmp_path, rows, fmt, says):
    path = write(tmp_path / "roster.csv", rows)
    with pytest.raises(RosterError) as err:
        read_roster(path, fmt)
    assert says in str(err.value) and str(path) in str(err.value)


def test_two_hand_ins_for_one_roster_student_are_refused(graded, tmp_path):
    roster = read_roster(canvas(tmp_path), "canvas")
    with pytest.raises(ExportError, match=r"hand-ins 'Ada-Lovelace_101' \(id \(ID\)\) and 'alovelace' \(login \(SIS Login ID\)\) "
                                          r"both match .* row 3 \(Lovelace, Ada\)"):
        match_students(roster, ["Ada-Lovelace_101", "alovelace"])


def test_canvas_rows_that_describe_assignments_are_not_students(tmp_path):
    roster = read_roster(canvas(tmp_path, extra=[["", "", "", "", "", "Manual Posting", "", ""]]), "canvas")
    assert [roster.name(r) for r in roster.rows] == ["Lovelace, Ada", "Chen, Bo", "Dee, Cy", "Login, Dan", "Vee, Eve",
                                                      "Nobody, Noah"]
    assert roster.points[5] == "10"


def test_a_worksheet_is_for_one_assignment_and_a_different_maximum_is_reported(graded, tmp_path):
    sheet = write(tmp_path / "ws.csv", [["Identifier", "Full name", "Grade", "Maximum Grade", "Last modified (grade)"],
                                        ["Participant 101", "Ada", "", "100.00", "-"]])
    done = export(graded, read_roster(sheet, "moodle"), tmp_path / "out.csv")
    assert done["notes"] == ["the worksheet's Maximum Grade is 100.00, grades.csv's max_total 10: "
                             "the totals are exported as they are"]
    with pytest.raises(ExportError, match="no assignment '02_autograd_graph'"):
        export(graded, read_roster(sheet, "moodle"), tmp_path / "out.csv", ["02_autograd_graph"])


@pytest.mark.integration  # the CLI
def test_the_export_command_exits_2_on_a_bad_roster_and_lists_the_unmatched(graded, tmp_path):
    bad = write(tmp_path / "bad.csv", [["First Name", "Last Name", "SID", "Email"], ["A", "B", "1", "a@x"]])
    run = subprocess.run([PYTHON, "-m", "grader", "export", "--format", "canvas", "--roster", str(bad), str(graded),
                          str(tmp_path / "x.csv")], cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 2 and "use --format gradescope" in run.stderr and not (tmp_path / "x.csv").exists()
    run = subprocess.run([PYTHON, "-m", "grader", "export", "--format", "canvas", "--roster", str(canvas(tmp_path)),
                          str(graded), str(tmp_path / "x.csv")], cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "stranger_999" in run.stdout and "row 8: Nobody, Noah" in run.stdout
    run = subprocess.run([PYTHON, "-m", "grader", "export", "--format", "canvas", "--roster", str(canvas(tmp_path)),
                          "--column", f"{ONE}=Quiz 1 (56)", str(graded), str(tmp_path / "x.csv")], cwd=REPO,
                         capture_output=True, text=True)
    assert run.returncode == 0 and f"note: {ONE} fills the column 'Quiz 1 (56)' (--column)" in run.stdout, run.stderr
    assert parse(tmp_path / "x.csv")[0][5:] == ["Quiz 1 (56)"]
