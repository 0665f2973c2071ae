"""Moodle in any language: which column of a grading worksheet or gradebook export holds what, read from the file.

Moodle writes every header in the language of the person who downloads the file and reads a worksheet back by
exact equality with the translated strings of the person who uploads it (`Identifier`, `Grade`, `Last modified
(grade)`: mod/assign/feedback/offline/importgradeslib.php in moodle/moodle) — so a worksheet is never rewritten
with English headers: OUT.csv keeps the file's own header and only fills its grade column. To find that column
(and the ids, names and emails to match students by) in a file of any language, grader/report/lms.py maps the
header to the English names it knows with `english_header`, from what the columns hold and where Moodle puts them:

- grading worksheet (mod/assign/gradingtable.php, download mode): the first column is the Identifier, every cell
  one word and a number ("Participant 12345", "Teilnehmer/in 12345", "Participante 12345": the number is the one
  in the submissions zip's folder names); the Maximum grade column holds one number in every row (written with
  the site's decimal separator), and Grade is the column right before it; Full name is the second column
  unless it holds numbers or addresses (blind marking leaves it out); the email column is the one whose every
  cell is an address; Last modified (grade) is the last column of dates (or "-") before the feedback columns.
- gradebook export (Grades → Export → Plain text file): the email column is found by its contents; Moodle
  puts the user fields first, First name and Last name in the first two columns and, with the default field
  list (firstname, lastname, idnumber, institution, department, email), ID number, Institution and Department
  between them and the email.

An English file is read by its headers as it always was.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

IDENTIFIER = re.compile(r"^(?P<word>\D*?)\s*(?P<number>\d+)$")
NUMBER = re.compile(r"^\d+(?:[.,]\d+)?$")
EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
YEAR = re.compile(r"\b(?:19|20)\d\d\b")
ENGLISH_MARKS = {"Identifier", "Email address", "First name"}
# The gradebook export's user fields in Moodle's default order ($CFG->grade_export_userprofilefields).
GRADEBOOK_FIELDS = ["First name", "Last name", "ID number", "Institution", "Department", "Email address"]
STALE_HELP = ("if grades were uploaded to this assignment since the worksheet was downloaded, Moodle skips every "
              "row whose grade changed since then, without saying so: download the worksheet again before uploading, "
              "or tick \"Ignore modified\"")


def _column(rows: list[list[str]], index: int) -> list[str]:
    return [row[index].strip() for row in rows if index < len(row) and row[index].strip()]


def _all(rows: list[list[str]], index: int, pattern: re.Pattern) -> bool:
    cells = _column(rows, index)
    return bool(cells) and all(pattern.match(c) for c in cells)


def worksheet_word(rows: list[list[str]]) -> str | None:
    """The word before the number in every Identifier cell ("Participant" in English), or None: not a worksheet."""
    words = {m.group("word").strip() if (m := IDENTIFIER.match(c)) else None for c in _column(rows, 0)}
    return words.pop() if len(words) == 1 and None not in words and "" not in words else None


def english_header(header: list[str], rows: list[list[str]]) -> tuple[list[str], str]:
    """(the header with the columns it recognises named in English, the Identifier cells' word)."""
    if ENGLISH_MARKS & set(header):
        return header, "Participant"
    english = list(header)
    emails = [i for i in range(len(header)) if _all(rows, i, EMAIL)]
    for i in emails[:1]:
        english[i] = "Email address"
    word = worksheet_word(rows)
    if word is None:  # a gradebook export: names first; the default field list puts the email sixth
        if emails:
            user_fields = GRADEBOOK_FIELDS[:-1] if emails[0] == len(GRADEBOOK_FIELDS) - 1 else GRADEBOOK_FIELDS[:2]
            english[:len(user_fields)] = user_fields
        return english, ""
    english[0] = "Identifier"
    if len(header) > 1 and not _all(rows, 1, NUMBER) and 1 not in emails:
        english[1] = "Full name"
    for i in range(2, len(header)):
        top = _column(rows, i)
        if top and all(NUMBER.match(c) for c in top) and len(set(top)) == 1 and i - 1 not in emails and \
                all(NUMBER.match(c) or c == "-" for c in _column(rows, i - 1)):
            english[i - 1], english[i] = "Grade", "Maximum Grade"
            dates = [j for j in range(i + 1, len(header))
                     if _column(rows, j) and all(YEAR.search(c) or c == "-" for c in _column(rows, j))]
            if dates:
                english[dates[-1]] = "Last modified (grade)"
            break
    return english, word


def stale_worksheet(worksheet: Path, grades: Path) -> str:
    """A warning when the worksheet was downloaded (its file time) before the grades were written; '' otherwise."""
    try:
        downloaded, graded = worksheet.stat().st_mtime, grades.stat().st_mtime
    except OSError:
        return ""
    if downloaded >= graded:
        return ""
    when = datetime.fromtimestamp(downloaded).isoformat(sep=" ", timespec="minutes")
    made = datetime.fromtimestamp(graded).isoformat(sep=" ", timespec="minutes")
    return f"the worksheet {worksheet.name} ({when}) is older than these grades ({made}): {STALE_HELP}"
