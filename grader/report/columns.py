"""Which roster column each course assignment fills when grades go into Canvas or Moodle's gradebook (lms.py).

Each exported course assignment fills one existing assignment column of the roster, under that column's exact
header, so the LMS's import updates that assignment rather than making a new one (Canvas's importer updates
assignment `id` for a column `Title (id)` and creates one for a column it cannot place; Moodle's gradebook import
maps each column to a grade item). `--column 01_gradient_descent="01 Gradient descent (123)"` (repeatable) names the
column; otherwise the column is the one whose title — the header less Canvas's `(id)`, or less Moodle's
`<activity type>: ` and ` (<display type>)` — fits the assignment: its words (letters and numbers, case and leading
zeros ignored) are the name's (`01 Gradient descent` for `01_gradient_descent`), the name's number alone (`01`, `1`)
or the name without its number (`Gradient descent`). Several fitting columns are a ColumnError listing them; so is
none, unless `--new-column` asks for a new column titled with the assignment's name. A Moodle grading worksheet
(one grade column, its own assignment's) and a Gradescope file (columns named after the assignments) take neither.
"""

from __future__ import annotations

import re
from pathlib import Path

# Canvas's computed columns, which its importer skips (NON_ASSIGNMENT_COLUMN_HEADERS, "Unposted …" included)
CANVAS_COMPUTED = re.compile(r"(Current|Final|Override) (Score|Points|Grade)|Override Status")
NEW_COLUMN = {"canvas": "Canvas's import creates a new assignment for it",
              "moodle-gradebook": "map it to a new grade item when importing"}
NO_COLUMNS = {"moodle-worksheet": "a Moodle grading worksheet, whose one grade column is its own Moodle assignment's: "
                                  "--assignment chooses which of grades.csv's assignments fills it",
              "gradescope": "a Gradescope roster: OUT.csv's columns are named after the assignments"}


class ColumnError(ValueError):
    """No single roster column can be told to be an assignment's, or the column options do not fit the roster."""


def parse_columns(pairs: list[str]) -> dict[str, str]:
    """`--column ASSIGNMENT=COLUMN` options: course assignment → the roster's column header, exactly as written."""
    columns: dict[str, str] = {}
    for pair in pairs:
        name, equals, header = (part.strip() for part in pair.partition("="))
        if not (name and equals and header):
            raise ColumnError(f"--column {pair!r}: write ASSIGNMENT=COLUMN, e.g. --column "
                              '01_gradient_descent="01 Gradient descent (123)"')
        if name in columns:
            raise ColumnError(f"--column {name}=…: given twice ({columns[name]!r} and {header!r})")
        columns[name] = header
    return columns


def _words(text: str) -> list[str]:
    """Lower-case words and numbers without leading zeros: `01_Gradient-descent` → ['1', 'gradient', 'descent']."""
    return [w.lstrip("0") or "0" if w.isdigit() else w for w in re.findall(r"[^\W_]+", text.lower())]


def _fits(title: str, assignment: str) -> bool:
    """Whether a column title names the assignment: its words, its number alone, or its words without the number."""
    name = _words(assignment)
    number = name[:1] if name and name[0].isdigit() else []
    return bool(_words(title)) and _words(title) in (name, number, name[len(number):])


def _candidates(kind: str, header: list[str]) -> dict[str, str]:
    """The roster's columns that can be an assignment's, each with the assignment title it carries."""
    if kind == "canvas":  # after the student columns, less Canvas's computed ones
        after = header[header.index("Section") + 1:]
        return {h: re.sub(r"\s*\(\d+\)$", "", h) for h in after if h and not CANVAS_COMPUTED.search(h)}
    # Moodle's grade items: `<activity type>: <name> (<display type>)`; no user field ends in parentheses
    return {h: re.sub(r"^[^:]*:\s*|\s*\([^()]*\)$", "", h) for h in header if re.search(r"\([^()]*\)$", h)}


def columns_for(kind: str, header: list[str], where: Path, chosen: list[str], named: dict[str, str], new: bool,
                notes: list[str]) -> list[str]:
    """The roster column each chosen assignment fills (none for a roster of `NO_COLUMNS`): named with --column, else
    the one whose title fits; a new one, titled with the assignment's name, only when `new`. Each goes to `notes`."""
    if stray := [a for a in named if a not in chosen]:
        raise ColumnError(f"--column {stray[0]}=…: {stray[0]} is not an exported assignment ({', '.join(chosen)})")
    if kind in NO_COLUMNS:
        if named or new:
            raise ColumnError("--column and --new-column choose among a Canvas or Moodle gradebook roster's "
                              f"assignment columns; {where} is {NO_COLUMNS[kind]}")
        return []
    candidates = _candidates(kind, header)
    listed = ", ".join(map(repr, candidates)) or "none"
    columns = []
    for a in chosen:
        if a in named:
            if named[a] not in candidates:
                raise ColumnError(f"--column {a}={named[a]!r}: {where} has no such assignment column (it has {listed})")
            column, how = named[a], "--column"
        elif len(fits := [h for h, title in candidates.items() if _fits(title, a)]) == 1:
            column, how = fits[0], "its title fits"
        elif fits:
            raise ColumnError(f"{len(fits)} columns of {where} fit {a}: {', '.join(map(repr, fits))} — "
                              f"choose one with --column {a}=\"{fits[0]}\"")
        elif new:
            column, how = a, f"--new-column: {NEW_COLUMN[kind]}"
        else:
            raise ColumnError(f"{where} has no column for {a} (its assignment columns: {listed}): create the "
                              f"assignment in {'Canvas' if kind == 'canvas' else 'Moodle'} and export the roster again, "
                              f"name its column with --column {a}=\"COLUMN\", or pass --new-column to write a new column")
        notes.append(f"{a} fills the column {column!r} ({how})")
        columns.append(column)
    if twice := next((c for c in columns if columns.count(c) > 1), None):
        raise ColumnError(f"{', '.join(a for a, c in zip(chosen, columns) if c == twice)} would all fill the column "
                          f"{twice!r}: name each one's column with --column")
    return columns
