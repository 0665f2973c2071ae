"""Put a submission back together: the released notebook, with the student's answers and own cells in place."""

from __future__ import annotations

import copy
import unicodedata

import nbformat

from grader.kernel.outputs import safe_text
from grader.results import Note, NoteKind
from labkit import cells

# Metadata key the rebuilt notebook puts on cells the student added (code or prose).
ADDED = "tml_added_by_student"
# An earlier copy (or first half) of an answer cell: the student's own code, but part of their answer, so it runs
# whatever the own cells' time budget (grader/kernel/harness.py own_cells_budget)
EARLIER_ANSWER_COPY = "tml_earlier_answer_copy"
# Cells a student may add; beyond this the rest are left out (and the status says so).
MAX_ADDED_CELLS = 500
MAX_EXEMPT_COPIES = 2  # earlier copies of one answer that run outside the own cells' time budget


def normalised(source: object) -> str:
    """A cell's source as editors may have saved it, made comparable: a list of lines joined, line endings (CRLF,
    CR) as LF, a byte-order mark dropped, Unicode in NFC form, trailing whitespace on lines and at the end
    removed. VS Code on Windows, Colab and older Jupyter differ in exactly these; none of them is an edit."""
    text = "".join(map(str, source)) if isinstance(source, list) else str(source)
    text = unicodedata.normalize("NFC", text.replace("\r\n", "\n").replace("\r", "\n").lstrip("\ufeff"))
    return "\n".join(line.rstrip() for line in text.split("\n")).rstrip()


def _own_source(source: str) -> str:
    """The student's own cell with LF line endings (what it means is unchanged: Python reads CRLF as LF) and only
    characters a kernel can take and a page can show (outputs.safe_text: half an emoji or a NUL in a comment)."""
    return safe_text(source.replace("\r\n", "\n").replace("\r", "\n"))


def _metadata(submitted: nbformat.NotebookNode, released: nbformat.NotebookNode) -> tuple[list[dict], int]:
    """Each submitted cell's nbgrader metadata, and how many cells had theirs back from the release.

    A tool that drops cell metadata (nbconvert's ClearMetadataPreprocessor, some editors) keeps cell ids: a
    cell with no nbgrader metadata whose id is a released nbgrader cell's takes that cell's metadata. That
    gives a student nothing they could not have by keeping the metadata: the release's locked and test
    cells are still put back from the release, and an answer matched by id is graded like any answer."""
    by_id = {c.get("id"): cells.nbgrader(c) for c in released.cells if cells.nbgrader(c) and c.get("id")}
    infos, restored = [], 0
    for cell in submitted.cells:
        info = cells.nbgrader(cell)
        if not info and cell.get("id") in by_id:
            info, restored = by_id[cell.get("id")], restored + 1
        if info and not isinstance(info.get("grade_id"), str):  # a list, a number: names no cell, never a crash
            info = {**info, "grade_id": "(not a name)"}
        infos.append(info)
    return infos, restored


def _copied_note(grade_id: str, indices: list[int], submitted: nbformat.NotebookNode) -> Note | None:
    """The note on an answer cell whose copies define the same names: which copy was graded, what the others did.

    None for a cell split in two (its halves define different names: both run, nothing is hidden)."""
    def bound(index: int) -> list[str]:  # imports left out: both halves of a split cell may import torch
        return cells.defined_names(normalised(submitted.cells[index].source), imports=False)

    names = bound(indices[-1])
    rivals = [i for i in indices[:-1] if set(names) & set(bound(i))]
    if not rivals:
        return None
    shown = ", ".join(f"`{n}`" for n in names if any(n in bound(i) for i in rivals))
    return Note(NoteKind.ANSWER_COPIED,
                f"answer copied: {grade_id} appears more than once and cells {', '.join(str(i + 1) for i in rivals)} "
                f"and {indices[-1] + 1} of your notebook all define {shown}; the last one, cell {indices[-1] + 1}, "
                "was graded, the earlier ones ran as your own cells")


def _same_as_released(cell: nbformat.NotebookNode, info: dict, release: nbformat.NotebookNode) -> bool:
    """Whether a locked or test cell is the release's, source (as editors save it) and metadata alike."""
    theirs = cells.nbgrader(release)
    return (normalised(cell.source) == normalised(release.source)
            and all(info.get(k) == theirs.get(k) for k in ("grade", "solution", "locked", "points")))


def _unknown_note(unknown: list[str]) -> str:
    """One note for the cells whose grade ids the release lacks: how many, never the ids (the student's own text,
    which a status column would show the instructor as if it were the grader's: 'TA NOTE: regrade approved')."""
    return f"{len(unknown)} cell{'s' if len(unknown) > 1 else ''} with a grade id the release does not have removed"


def _answer_copies(infos: list[dict], answer_ids: set[str]) -> dict[str, list[int]]:
    """Where each answer cell stands in the hand-in, in order: the last is graded, those before it are copies."""
    copies: dict[str, list[int]] = {}
    for index, info in enumerate(infos):
        if info.get("grade_id") in answer_ids:
            copies.setdefault(info["grade_id"], []).append(index)
    return copies


def rebuild(submitted: nbformat.NotebookNode, released: nbformat.NotebookNode) -> tuple[nbformat.NotebookNode, list[Note]]:
    """The released notebook with the student's answers and own cells put back in; plus what was tampered with.

    Locked cells, tests and their metadata always come from the release, so an edited, deleted,
    duplicated or re-labelled cell is undone; the student's answer cells and the cells they added
    (no nbgrader metadata) are kept in their place. An answer cell that appears more than once (copied,
    or split in two: both halves keep the metadata) is graded in its last copy; the earlier ones run as the
    student's own cells, where they stand, and when they define a name the last copy defines too (a draft of
    the answer, not the other half of a split cell) a note says which copy was graded. A verbatim copy of a locked or test
    cell (a student running a check again further down) is left out without a note: it never runs.
    """
    notes: list[str] = []
    release_cells = {cells.grade_id(c): c for c in released.cells if cells.nbgrader(c)}
    answers: dict[str, tuple[nbformat.NotebookNode, dict]] = {}  # grade id -> the student's cell, its metadata
    extras: dict[str | None, list[nbformat.NotebookNode]] = {}
    released_ids = {c.get("id") for c in released.cells}
    anchor: str | None = None
    added = 0
    answer_ids = {cells.grade_id(c) for c in released.cells if cells.kind(c) == cells.ANSWER}
    infos, restored = _metadata(submitted, released)
    unknown: list[str] = []
    copies = _answer_copies(infos, answer_ids)
    for index, (cell, info) in enumerate(zip(submitted.cells, infos)):
        earlier_copy = info.get("grade_id") in answer_ids and copies[info["grade_id"]][-1] != index
        # the first half of a split answer runs whatever the budget; a pile of older copies cannot (review round 3)
        exempt = earlier_copy and index in copies[info["grade_id"]][-1 - MAX_EXEMPT_COPIES:-1]
        if earlier_copy:
            info = {}  # an earlier copy of an answer: the student's own code, run where it stands
        if not info:
            # The student's own cells: code they added, and prose cells the release does not have.
            if cell.cell_type == "code" or cell.get("id") not in released_ids:
                added += 1
                if added > MAX_ADDED_CELLS:
                    continue
                cell = copy.deepcopy(cell)
                cell["metadata"] = {ADDED: True, **({EARLIER_ANSWER_COPY: True} if exempt else {})}
                cell.source = _own_source(cell.source)
                extras.setdefault(anchor, []).append(cell)
            continue
        grade_id = info.get("grade_id")
        if grade_id not in release_cells:
            unknown.append(str(grade_id))
        elif grade_id in answers:
            if not _same_as_released(cell, info, release_cells[grade_id]):
                notes.append(f"duplicated cell {grade_id} ignored")
        else:
            answers[grade_id] = cell, info
            anchor = grade_id
    rebuilt = copy.deepcopy(released)
    kept = list(extras.get(None, []))
    for cell in rebuilt.cells:
        kept.append(cell)
        info = cells.nbgrader(cell)
        if not info:
            continue
        grade_id = info["grade_id"]
        theirs, their_info = answers.get(grade_id, (None, {}))
        if theirs is None:
            notes.append(f"deleted {'answer ' if info.get('solution') else ''}cell {grade_id} restored")
        elif info.get("solution"):
            cell.source = _own_source(theirs.source)
        else:
            if normalised(theirs.source) != normalised(cell.source):
                notes.append(f"edited locked cell {grade_id} restored")
            if any(their_info.get(k) != info.get(k) for k in ("grade", "solution", "locked", "points")):
                notes.append(f"changed metadata of {grade_id} restored")
        kept.extend(extras.get(grade_id, []))
    rebuilt.cells = kept
    notes[:0] = [_unknown_note(unknown)] if unknown else []
    status = [Note(NoteKind.TAMPERED, f"tampered: {n}") for n in notes]
    status += [note for gid, indices in copies.items() if (note := _copied_note(gid, indices, submitted))]
    if restored:
        status.append(Note(NoteKind.METADATA_RESTORED,
                           f"metadata restored: {restored} cell(s) had lost their nbgrader metadata; "
                           "they were matched to the release by cell id"))
    if added > MAX_ADDED_CELLS:
        status.append(Note(NoteKind.LIMIT_HIT,
                           f"too many cells: only the first {MAX_ADDED_CELLS} of the {added} cells you added were run"))
    return rebuilt, status
