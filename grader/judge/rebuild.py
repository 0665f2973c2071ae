"""Put a submission back together: the released notebook, with the student's answers and own cells in place."""

from __future__ import annotations

import copy

import nbformat

from grader.results import Note, NoteKind
from labkit import cells

# Metadata key the rebuilt notebook puts on cells the student added (code or prose).
ADDED = "tml_added_by_student"
# Cells a student may add; beyond this the rest are left out (and the status says so).
MAX_ADDED_CELLS = 500


def rebuild(submitted: nbformat.NotebookNode, released: nbformat.NotebookNode) -> tuple[nbformat.NotebookNode, list[Note]]:
    """The released notebook with the student's answers and own cells put back in; plus what was tampered with.

    Locked cells, tests and their metadata always come from the release, so an edited, deleted,
    duplicated or re-labelled cell is undone; the student's answer cells and the cells they added
    (no nbgrader metadata) are kept in their place. An answer cell that appears more than once (copied,
    or split in two: both halves keep the metadata) is graded in its last copy; the earlier ones run
    as the student's own cells, where they stand.
    """
    notes: list[str] = []
    known = {cells.grade_id(c) for c in released.cells if cells.nbgrader(c)}
    answers: dict[str, nbformat.NotebookNode] = {}
    extras: dict[str | None, list[nbformat.NotebookNode]] = {}
    released_ids = {c.get("id") for c in released.cells}
    anchor: str | None = None
    added = 0
    answer_ids = {cells.grade_id(c) for c in released.cells if cells.kind(c) == cells.ANSWER}
    last = {cells.grade_id(c): i for i, c in enumerate(submitted.cells) if cells.grade_id(c) in answer_ids}
    for index, cell in enumerate(submitted.cells):
        info = cells.nbgrader(cell)
        if info.get("grade_id") in answer_ids and last[info["grade_id"]] != index:
            info = {}  # an earlier copy of an answer: the student's own code, run where it stands
        if not info:
            # The student's own cells: code they added, and prose cells the release does not have.
            if cell.cell_type == "code" or cell.get("id") not in released_ids:
                added += 1
                if added > MAX_ADDED_CELLS:
                    continue
                cell = copy.deepcopy(cell)
                cell["metadata"] = {ADDED: True}  # their metadata means nothing to the grader
                extras.setdefault(anchor, []).append(cell)
            continue
        grade_id = info.get("grade_id")
        if grade_id not in known:
            notes.append(f"unknown cell {grade_id!r} removed")
        elif grade_id in answers:
            notes.append(f"duplicated cell {grade_id} ignored")
        else:
            answers[grade_id] = cell
            anchor = grade_id
    rebuilt = copy.deepcopy(released)
    kept = list(extras.get(None, []))
    for cell in rebuilt.cells:
        kept.append(cell)
        info = cells.nbgrader(cell)
        if not info:
            continue
        grade_id = info["grade_id"]
        theirs = answers.get(grade_id)
        if theirs is None:
            notes.append(f"deleted {'answer ' if info.get('solution') else ''}cell {grade_id} restored")
        elif info.get("solution"):
            cell.source = theirs.source
        else:
            if theirs.source != cell.source:
                notes.append(f"edited locked cell {grade_id} restored")
            their_info = cells.nbgrader(theirs)
            if any(their_info.get(k) != info.get(k) for k in ("grade", "solution", "locked", "points")):
                notes.append(f"changed metadata of {grade_id} restored")
        kept.extend(extras.get(grade_id, []))
    rebuilt.cells = kept
    status = [Note(NoteKind.TAMPERED, f"tampered: {n}") for n in notes]
    if added > MAX_ADDED_CELLS:
        status.append(Note(NoteKind.LIMIT_HIT,
                           f"too many cells: only the first {MAX_ADDED_CELLS} of the {added} cells you added were run"))
    return rebuilt, status
