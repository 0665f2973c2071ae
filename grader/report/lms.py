"""Grades an LMS imports as they are: `python -m grader export --format canvas|gradescope|moodle --roster ROSTER
GRADED_DIR OUT.csv`.

The roster is the LMS's own export of the class; each graded student (a row of GRADED_DIR/grades.csv) is
matched to one roster row by LMS id — the number at the end of our student key (`<name>_<id>`, as
collection names Canvas and Moodle hand-ins) or the whole key — then by login, then by email. OUT.csv
holds one row per matched student with `total` (the points after any late penalty) per assignment.
Hand-ins that match nobody, and roster students with no hand-in, are never given a grade: they are
printed and listed, with every match and how it was made, in OUT.matching.csv next to OUT.csv.
A roster with a duplicate id / login / email, a missing column, a ragged row, or the columns of another
LMS is refused with a RosterError naming the row and the column.

Formats followed (header names exactly as below):

- canvas — the Gradebook CSV that Canvas's importer reads (Grades → Import). Source: Canvas's importer,
  app/models/gradebook_importer.rb in instructure/canvas-lms: the header must start `Student, ID`, the
  student columns end with `Section` (`SIS User ID`, `SIS Login ID`, `Integration ID`, `Root Account`
  may come between), a row whose first cell contains "Points Possible" sets points for new assignments,
  students are found by ID, then SIS User ID, then SIS Login ID, then name; an assignment column titled
  `Title (id)` updates assignment `id`, one titled exactly like an existing assignment updates that one, any
  other title creates a new assignment; columns naming Current / Final / Override Score, Points or Grade, or
  Override Status, are skipped; a blank cell changes nothing.
  OUT.csv: the roster's student columns up to `Section`, then one column per assignment under the roster's own
  header (columns.py), a Points Possible row, then the students.
  Roster: Canvas's gradebook export (Grades → Export). Id: `ID` (Canvas user id, the number Canvas puts
  in submission file names) or `SIS User ID`; login: `SIS Login ID`.
- moodle — two rosters are understood. (a) The gradebook export (Grades → Export → Plain text file:
  `First name, Last name (or Surname), ID number, Institution, Department, Email address, <grade items…>,
  Last downloaded from this course`), each grade item a column `<activity type>: <name> (<display type>)`
  (grade/export/lib.php). OUT.csv: its identity columns plus one column per assignment under the roster's
  own header (columns.py); import with Grades → Import → CSV file, "Map
  from: Email address → Map to: Email address" (grade/import/csv/classes/load_data.php in moodle/moodle
  maps users by id, idnumber, email or username). Id: `ID number` (the whole key only: the number in a
  key from a Moodle zip is the assignment's participant id, not an ID number); login: `Username`, when
  exported; email: `Email address`. (b) The assignment's grading worksheet (Assignment → View all
  submissions → Download grading worksheet: `Identifier, Full name, …, Grade, Maximum Grade, …,
  Last modified (grade), …`), whose `Identifier` is "Participant <the number in the zip's file names>":
  OUT.csv is the worksheet with `Grade` filled, for Upload grading worksheet
  (mod/assign/feedback/offline/importgradeslib.php reads Identifier, Grade and Last modified (grade)). A
  worksheet belongs to one Moodle assignment and has one grade column: the course assignment that fills it is
  grades.csv's only one, or the one `--assignment` names.
- gradescope — Gradescope documents its roster CSV (help.gradescope.com, "Adding students and staff":
  a name — `Name` / `Full Name`, or `First Name` and `Last Name` — `Email` required, `SID` optional); we found no
  published Gradescope score-import format, so OUT.csv follows Gradescope's own grade export ("Download
  Grades"): the roster's name, `SID` and `Email` columns, then per assignment `<name>`, `<name> - Max
  Points`, `<name> - Submission Time`, `<name> - Lateness (H:M:S)`, and `Total Lateness (H:M:S)` — the
  layout tools that read Gradescope exports expect (e.g. gradelib's gradescope reader). Id: `SID`;
  email: `Email`.

Which roster column each assignment fills (Canvas, Moodle gradebook): grader/report/columns.py.
"""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from grader.collect.submissions import slug
from grader.report import moodle
from grader.report.columns import columns_for
from grader.report.report import NO_HAND_IN_TIME
from grader.results import csv_cell

FORMATS = ("canvas", "gradescope", "moodle")
TRAILING_ID = re.compile(r"_(\d+)$")
# What each kind of roster must have, and what gives another LMS's roster away.
SIGNATURES = {
    "canvas": ("a Canvas gradebook export", [{"Student", "ID", "Section"}]),
    "gradescope": ("a Gradescope roster", [{"SID", "Email", "First Name"}, {"SID", "Email", "Name"},
                                          {"Email", "First Name", "Last Name"}]),
    "moodle": ("a Moodle grades export or grading worksheet", [{"Email address", "First name"},
                                                              {"Identifier", "Full name"}]),
}
REQUIRED = {
    "canvas": ["Student", "ID", "Section"],
    "gradescope": ["Email"],
    "moodle-gradebook": ["First name", "Email address"],
    "moodle-worksheet": ["Identifier", "Grade", "Last modified (grade)"],
}
EXAMPLE = {
    "canvas": "Student, ID, SIS User ID, SIS Login ID, Section, …",
    "gradescope": "First Name, Last Name, SID, Email, …",
    "moodle-gradebook": "First name, Last name, ID number, Institution, Department, Email address, …",
    "moodle-worksheet": "Identifier, Full name, Email address, Status, Grade, Maximum Grade, …, Last modified (grade), …",
}
CANVAS_IDENTITY = ["Student", "ID", "SIS User ID", "SIS Login ID", "Integration ID", "Root Account", "Section"]
MOODLE_IDENTITY = ["First name", "Last name", "Surname", "ID number", "Username", "Institution", "Department",
                   "Email address"]
GRADESCOPE_IDENTITY = ["Name", "Full Name", "First Name", "Last Name", "SID", "Email"]


class RosterError(ValueError):
    """The roster cannot be used; the message names the file, the row and the column."""


class ExportError(ValueError):
    """The grades cannot be exported as asked (two hand-ins for one roster student, no such assignment, …)."""


@dataclass
class Roster:
    kind: str  # canvas, gradescope, moodle-gradebook, moodle-worksheet
    path: Path
    header: list[str]
    rows: list[list[str]]
    lines: list[int]  # the file's row number (header = 1) of each row, for messages
    points: list[str] = field(default_factory=list)  # Canvas's Points Possible row, when the export has one
    ids: list[tuple[str, bool]] = field(default_factory=list)  # (column, the key's trailing number may match it)
    login: str = ""
    email: str = ""
    shown: list[str] = field(default_factory=list)  # the file's own header (Moodle's in any language: moodle.py)
    participant: str = "Participant"  # the word before the number in a Moodle worksheet's Identifier cells

    def own(self, column: str) -> str:
        """The file's own name of the column `header` calls `column` (what OUT.csv's header says)."""
        return self.shown[self.header.index(column)] if self.shown and column in self.header else column

    def cell(self, row: list[str], column: str) -> str:
        return row[self.header.index(column)].strip() if column in self.header else ""

    def name(self, row: list[str]) -> str:
        for columns in (["Student"], ["Full name"], ["Full Name"], ["Name"], ["First Name", "Last Name"],
                        ["First name", "Last name"], ["First name", "Surname"]):
            if all(c in self.header for c in columns):
                return " ".join(self.cell(row, c) for c in columns)
        return ""

    def lms_id(self, row: list[str], column: str) -> str:
        value = self.cell(row, column)
        return value.removeprefix(self.participant).strip() if column == "Identifier" else value


def _kind(fmt: str, header: set[str]) -> str:
    if fmt == "moodle":
        return "moodle-worksheet" if "Identifier" in header else "moodle-gradebook"
    return fmt


def _other_lms(fmt: str, header: set[str]) -> str:
    for other, (what, signatures) in SIGNATURES.items():
        if other != fmt and any(sig <= header for sig in signatures):
            return f"; it looks like {what}: use --format {other}"
    return ""


def read_roster(path: Path, fmt: str) -> Roster:
    """Read and check an LMS roster export of format `fmt` (canvas, gradescope or moodle)."""
    if fmt not in FORMATS:
        raise RosterError(f"--format {fmt!r}: must be one of {', '.join(FORMATS)}")
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except OSError as err:
        raise RosterError(f"{path}: cannot read it ({type(err).__name__})") from None
    except UnicodeDecodeError:
        raise RosterError(f"{path}: not UTF-8 text — export the roster again as CSV (UTF-8)") from None
    first = text.split("\n", 1)[0]
    delimiter = max(",;\t", key=first.count) if first else ","
    table = list(csv.reader(io.StringIO(text), delimiter=delimiter))
    numbered = [(n, row) for n, row in enumerate(table, 1) if any(cell.strip() for cell in row)]
    if not numbered:
        raise RosterError(f"{path}: empty — expected {EXAMPLE[_kind(fmt, set())]}")
    header_line, header = numbered[0]
    shown = header = [h.strip() for h in header]
    participant = "Participant"
    if fmt == "moodle":
        header, participant = moodle.english_header(header, [row for _, row in numbered[1:]])
    foreign = header is not shown
    names = set(header)
    kind = _kind(fmt, names)
    # a worksheet in another language may show no date yet to find its Last modified (grade) by: kept as it is
    missing = [c for c in REQUIRED[kind] if c not in names and not (foreign and c == "Last modified (grade)")]
    if kind == "moodle-gradebook" and not {"Last name", "Surname"} & names:
        missing.append("Last name")
    if kind == "gradescope" and not ({"Name", "Full Name"} & names or {"First Name", "Last Name"} <= names):
        missing.append("Name (or Full Name, or First Name and Last Name)")
    if missing:
        raise RosterError(f"{path}, row {header_line} (the header): column {missing[0]!r} missing — "
                          f"{SIGNATURES[fmt][0]} has {EXAMPLE[kind]}{_other_lms(fmt, names)}")
    duplicated = sorted({h for h in header if h and header.count(h) > 1})
    if duplicated:
        raise RosterError(f"{path}, row {header_line} (the header): column {duplicated[0]!r} appears twice")
    rows, lines, points = [], [], []
    for number, row in numbered[1:]:
        if kind == "canvas" and "Points Possible" in row[0]:
            points = [c.strip() for c in row]  # describes the assignments, not a student
            continue
        if kind == "canvas" and all(re.fullmatch(r"\s*(Muted|Manual Posting.*)?\s*", c or "", re.I) for c in row):
            continue  # posting-policy rows
        if len(row) != len(header):
            raise RosterError(f"{path}, row {number}: {len(row)} cells, but the header has {len(header)} "
                              "(a comma inside an unquoted name?)")
        rows.append([c.strip() for c in row])
        lines.append(number)
    roster = Roster(kind, path, header, rows, lines, points, shown=shown, participant=participant)
    if kind == "canvas":
        roster.ids = [("ID", True), ("SIS User ID", False)]
        roster.login = "SIS Login ID" if "SIS Login ID" in names else ""
    elif kind == "gradescope":
        roster.ids = [("SID", True)]
        roster.email = "Email"
    elif kind == "moodle-worksheet":
        roster.ids = [("Identifier", True)]
        roster.email = "Email address" if "Email address" in names else ""
    else:
        roster.ids = [("ID number", False)]
        roster.login = "Username" if "Username" in names else ""
        roster.email = "Email address"
    roster.ids = [(c, m) for c, m in roster.ids if c in names]
    for column in [c for c, _ in roster.ids] + [c for c in (roster.login, roster.email) if c]:
        seen: dict[str, int] = {}
        for row, number in zip(rows, lines):
            value = roster.lms_id(row, column).lower()
            if not value:
                continue
            if value in seen:
                raise RosterError(f"{path}, row {number}, column {column!r}: {roster.cell(row, column)!r} is already "
                                  f"on row {seen[value]} — one student, two rows?")
            seen[value] = number
    if kind == "moodle-worksheet":
        for row, number in zip(rows, lines):
            if roster.cell(row, "Identifier") and not re.fullmatch(r"\d+", roster.lms_id(row, "Identifier")):
                raise RosterError(f"{path}, row {number}, column {roster.own('Identifier')!r}: "
                                  f"{roster.cell(row, 'Identifier')!r} is not '{participant} <number>'")
    return roster


# --- matching ---------------------------------------------------------------------------------------------

@dataclass
class Match:
    student: str
    row: int  # index into roster.rows
    how: str  # "id (ID)", "login (SIS Login ID)", "email (Email)"


def match_students(roster: Roster, students: list[str]) -> tuple[list[Match], list[str], list[int]]:
    """(matches, hand-ins that match no roster row, roster rows no hand-in matches).

    By LMS id, then login, then email, then — for Moodle, whose gradebook export does not have the participant
    number a Moodle zip puts in our keys — by full name, when exactly one roster row has it; the first rule that
    finds a row decides. Two hand-ins that match the same roster row are an ExportError: one student must not get
    two grades.
    """
    index: dict[tuple[str, str], int] = {}
    for i, row in enumerate(roster.rows):
        for column in [c for c, _ in roster.ids] + [c for c in (roster.login, roster.email) if c]:
            value = roster.lms_id(row, column).lower()
            if value:
                index[column, value] = i
    names = [slug(roster.name(row)).lower() for row in roster.rows] if roster.kind.startswith("moodle") else []
    by_name = {name: i for i, name in enumerate(names) if name and names.count(name) == 1}
    matches, unmatched = [], []
    for student in students:
        key = student.lower()
        number = TRAILING_ID.search(key)
        stem = key[:number.start()] if number else key
        found = None
        for column, by_number in roster.ids:
            for value in ([number.group(1)] if number and by_number else []) + [key]:
                if (column, value) in index:
                    found = Match(student, index[column, value], f"id ({roster.own(column)})")
                    break
            if found:
                break
        if not found and roster.login:
            for value in dict.fromkeys([key, stem]):
                if (roster.login, value) in index:
                    found = Match(student, index[roster.login, value], f"login ({roster.own(roster.login)})")
                    break
        if not found and roster.email and (roster.email, key) in index:
            found = Match(student, index[roster.email, key], f"email ({roster.own(roster.email)})")
        if not found and stem in by_name:
            found = Match(student, by_name[stem], "full name")
        if found:
            matches.append(found)
        else:
            unmatched.append(student)
    owners: dict[int, Match] = {}
    for m in matches:
        if m.row in owners:
            first = owners[m.row]
            raise ExportError(f"hand-ins {first.student!r} ({first.how}) and {m.student!r} ({m.how}) both match "
                              f"{roster.path} row {roster.lines[m.row]} ({roster.name(roster.rows[m.row])}): "
                              "rename one folder so each student has one")
        owners[m.row] = m
    without = [i for i in range(len(roster.rows)) if i not in owners]
    return matches, unmatched, without


# --- the grades -------------------------------------------------------------------------------------------

@dataclass
class Grade:
    total: str
    max_total: str
    late_by: str
    submitted: str = ""
    due: str = ""  # the due date in effect ("" when none)


def read_grades(graded: Path) -> dict[str, dict[str, Grade]]:
    """student → assignment → Grade, from GRADED_DIR/grades.csv (and results.json for hand-in times and due dates)."""
    path = graded / "grades.csv"
    if not path.is_file():
        raise ExportError(f"{graded}: no grades.csv — run `python -m grader autograde … --out {graded}` first")
    times = {}
    if (graded / "results.json").is_file():
        for r in json.loads((graded / "results.json").read_text(encoding="utf-8")):
            late = r.get("lateness") or {}
            times[r["student"], r["assignment"]] = (late.get("submitted") or r.get("submitted_at", ""), late.get("due", ""))
    grades: dict[str, dict[str, Grade]] = {}
    with open(path, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            grades.setdefault(row["student"], {})[row["assignment"]] = Grade(
                row["total"], row["max_total"], row.get("late_by", ""), *times.get((row["student"], row["assignment"]), ("", "")))
    return grades


def _number(text: str) -> float | None:
    """A number as an LMS writes it: '10.00', or '10,00' where the site's language has a decimal comma."""
    try:
        return float(text.replace(",", ".") if "." not in text and text.count(",") == 1 else text)
    except ValueError:
        return None


def _safe(value: object) -> str:
    """A cell no spreadsheet runs as a formula (names come from rosters and hand-ins); numbers stay numbers."""
    text = str(value)
    return text if _number(text) is not None else csv_cell(text)


class _SafeWriter:
    """csv.writer whose every cell goes through `_safe`."""

    def __init__(self, f: io.TextIOBase) -> None:
        self.writer = csv.writer(f)

    def writerow(self, row: list) -> None:
        self.writer.writerow([_safe(cell) for cell in row])


def _hms(hours: str) -> str:
    seconds = round(float(hours or 0) * 3600)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _worksheet(roster: Roster, matches: list[Match], grades: dict[str, Grade | None], maximum: str,
               notes: list[str]) -> list[list[str]]:
    """The Moodle worksheet as it came (its own header), with Grade filled for every matched student."""
    grade_at = roster.header.index("Grade")
    tops = {roster.cell(r, "Maximum Grade") for r in roster.rows} - {""}
    if tops and any(_number(t) != _number(maximum) for t in tops):
        notes.append(f"the worksheet's {roster.own('Maximum Grade')} is {', '.join(sorted(tops))}, grades.csv's max_total "
                     f"{maximum}: the totals are exported as they are")
    comma = any("," in t for t in tops)  # grades written as the worksheet writes its numbers
    rows = [list(roster.shown)]
    for m in sorted(matches, key=lambda m: m.row):
        row = list(roster.rows[m.row])
        if (grade := grades[m.student]) is not None:
            row[grade_at] = grade.total.replace(".", ",") if comma else grade.total
        rows.append(row)
    return rows


def _untimed(grades: dict[str, dict[str, Grade]], matches: list[Match], chosen: list[str]) -> list[str]:
    """A note per assignment whose exported hand-ins had a due date but no hand-in time (a Moodle zip's)."""
    counts = {a: sum(bool(g.due and not g.submitted) for m in matches if (g := grades[m.student].get(a))) for a in chosen}
    return [f"{n} exported hand-in(s) of {a} had a due date but no hand-in time: {NO_HAND_IN_TIME}"
            for a, n in counts.items() if n]


def export(graded: Path, roster: Roster, out: Path, assignments: list[str] | None = None,
           columns: dict[str, str] | None = None, new_columns: bool = False) -> dict:
    """Write OUT.csv for `roster`'s LMS and OUT.matching.csv; returns what was matched and what was not. `columns`
    (--column) and `new_columns` (--new-column) choose the roster columns the assignments fill (columns.py)."""
    grades = read_grades(graded)
    known = sorted({a for by in grades.values() for a in by})
    chosen = assignments or known
    unknown = [a for a in chosen if a not in known]
    if unknown:
        raise ExportError(f"{graded}/grades.csv has no assignment {unknown[0]!r} (it has {', '.join(known) or 'none'})")
    if roster.kind == "moodle-worksheet" and len(chosen) != 1:
        raise ExportError(f"a Moodle grading worksheet is for one assignment; grades.csv has {', '.join(chosen)}: "
                          "pass --assignment NAME")
    matches, unmatched, without = match_students(roster, sorted(grades))
    if not matches:
        raise ExportError(f"no hand-in in {graded}/grades.csv matches a row of {roster.path} (by id, login, email"
                          f"{' or full name' if roster.kind.startswith('moodle') else ''}; hand-ins: "
                          f"{', '.join(unmatched[:3])}{' …' if len(unmatched) > 3 else ''}): is it this class's roster?")
    maxima = {a: next(g[a].max_total for g in grades.values() if a in g) for a in chosen}
    rows: list[list[str]] = []
    notes = _untimed(grades, matches, chosen)
    filled = columns_for(roster.kind, roster.header, roster.path, chosen, columns or {}, new_columns, notes)
    if roster.kind == "canvas":
        identity = roster.header[:roster.header.index("Section") + 1]
        rows.append(identity + filled)
        # An assignment Canvas has keeps its points possible (the import would change them); a new one gets ours.
        possible = [roster.points[roster.header.index(c)] if c in roster.header and len(roster.points) == len(roster.header)
                    and roster.points[roster.header.index(c)] else maxima[a] for a, c in zip(chosen, filled)]
        for a, value in zip(chosen, possible):
            if _number(value) != _number(maxima[a]):
                notes.append(f"Canvas has {a} out of {value} points, grades.csv out of {maxima[a]}: "
                             "the totals are exported as they are")
        rows.append(["    Points Possible"] + [""] * (len(identity) - 1) + possible)
        for m in sorted(matches, key=lambda m: m.row):
            row = roster.rows[m.row]
            rows.append([roster.cell(row, c) for c in identity] +
                        [grades[m.student][a].total if a in grades[m.student] else "" for a in chosen])
    elif roster.kind == "moodle-gradebook":
        identity = [c for c in roster.header if c in MOODLE_IDENTITY]
        rows.append([roster.own(c) for c in identity] + filled)
        for m in sorted(matches, key=lambda m: m.row):
            row = roster.rows[m.row]
            rows.append([roster.cell(row, c) for c in identity] +
                        [grades[m.student][a].total if a in grades[m.student] else "" for a in chosen])
    elif roster.kind == "moodle-worksheet":
        (assignment,) = chosen
        rows += _worksheet(roster, matches, {m.student: grades[m.student].get(assignment) for m in matches},
                           maxima[assignment], notes)
        notes += [stale] if (stale := moodle.stale_worksheet(roster.path, graded / "grades.csv")) else []
    else:  # gradescope
        identity = [c for c in roster.header if c in GRADESCOPE_IDENTITY]
        header = list(identity)
        for a in chosen:
            header += [a, f"{a} - Max Points", f"{a} - Submission Time", f"{a} - Lateness (H:M:S)"]
        rows.append(header + ["Total Lateness (H:M:S)"])
        for m in sorted(matches, key=lambda m: m.row):
            row = [roster.cell(roster.rows[m.row], c) for c in identity]
            late_total = 0.0
            for a in chosen:
                g = grades[m.student].get(a)
                row += [g.total, g.max_total, g.submitted, _hms(g.late_by)] if g else ["", maxima[a], "", ""]
                late_total += float(g.late_by or 0) if g else 0.0
            rows.append(row + [_hms(str(late_total))])
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([[_safe(cell) for cell in row] for row in rows])
    sidecar = out.with_name(out.stem + ".matching.csv")
    with open(sidecar, "w", newline="", encoding="utf-8") as f:
        writer = _SafeWriter(f)
        writer.writerow(["outcome", "student", "roster row", "roster name", "matched by"])
        for m in sorted(matches, key=lambda m: m.student):
            writer.writerow(["matched", m.student, roster.lines[m.row], roster.name(roster.rows[m.row]), m.how])
        for student in unmatched:
            writer.writerow(["hand-in not in the roster: no grade exported", student, "", "", ""])
        for i in without:
            writer.writerow(["in the roster, no hand-in: no grade exported", "", roster.lines[i],
                             roster.name(roster.rows[i]), ""])
    return {"matched": matches, "unmatched": unmatched, "without": [roster.lines[i] for i in without],
            "without_names": [roster.name(roster.rows[i]) for i in without], "sidecar": sidecar,
            "assignments": chosen, "notes": notes}
