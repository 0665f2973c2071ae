"""The pieces of grader/nbgrader/ that need no kernel and no nbgrader run: which notebook is the hand-in, what keys
a row, what the autograded notebook may show, and when a batch is stale. (The whole round trip:
tests/test_nbgrader_workflow.py.)"""

from __future__ import annotations

import os
from pathlib import Path

import nbformat

from grader.author.mutants import blank_submission, reference_submission
from grader.collect.submissions import collect
from grader.course import assignment_named, assignments
from grader.nbgrader.plugin import RENAMED_FILE, _state, as_text, canonical_names, summary_cell
from grader.results import Note, NoteKind, Result

A = assignment_named("01")


def _put(folder: Path, name: str, nb: nbformat.NotebookNode) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, folder / name)
    return folder / name


def test_the_hook_gives_nbgrader_the_notebook_the_course_grades(tmp_path):
    """Two Colab copies, or the hand-in only in a subfolder: nbgrader's file (the top-level one named for the
    assignment) becomes exactly the notebook the course's collection chose; the old name is recorded."""
    submitted = tmp_path / "course" / "submitted"
    two = submitted / "ann" / A.name
    _put(two, f"Copy of {A.name}.ipynb", blank_submission(A))
    _put(two, f"Copy of {A.name} (1).ipynb", reference_submission(A))
    nested = submitted / "bo" / A.name
    _put(nested / "work", A.notebook, reference_submission(A))
    chosen = {s.student: s.notebook.read_bytes() for s in collect(submitted, assignments(), A.name)}
    notebooks = [str(p) for p in two.glob("*.ipynb")]
    canonical_names(assignment=A.name, student="*", notebooks=notebooks)
    assert (two / A.notebook).read_bytes() == chosen["ann"] and (nested / A.notebook).read_bytes() == chosen["bo"]
    assert str(two / A.notebook) in notebooks and all(Path(n).exists() for n in notebooks)
    again = {s.student: s.notebook for s in collect(submitted, assignments(), A.name)}
    assert again == {"ann": two / A.notebook, "bo": nested / A.notebook}  # both sides see the same file now
    record = (tmp_path / "course" / "course-grading" / RENAMED_FILE).read_text()
    assert f"Copy of {A.name} (1).ipynb" in record and f"work/{A.notebook}" in record


def test_a_top_level_notebook_is_the_hand_in_before_one_in_a_subfolder(tmp_path):
    folder = tmp_path / "ann" / A.name
    top = _put(folder, A.notebook, blank_submission(A))
    _put(folder / "0", A.notebook, reference_submission(A))
    (sub,) = collect(tmp_path, assignments(), A.name)
    assert sub.notebook == top


def test_the_exchange_s_own_files_are_no_extra_files(tmp_path):
    """nbgrader's submit writes timestamp.txt and submission_secret.txt into every hand-in: no note for either."""
    folder = tmp_path / "ann" / A.name
    _put(folder, A.notebook, reference_submission(A))
    (folder / "timestamp.txt").write_text("2026-12-07 12:00:00.000000 UTC")
    (folder / "submission_secret.txt").write_text("0" * 128)
    (sub,) = collect(tmp_path, assignments(), A.name)
    assert sub.notes == [] and sub.submitted_at == "2026-12-07 12:00:00.000000 UTC"


def test_a_refused_folder_never_takes_a_students_key(tmp_path):
    """`bob-` is refused (an unsafe name); its row must not be keyed `bob`, or it would replace bob's grade."""
    _put(tmp_path / "bob" / A.name, A.notebook, reference_submission(A))
    _put(tmp_path / "bob-" / A.name, A.notebook, blank_submission(A))
    rows = collect(tmp_path, assignments(), A.name)
    assert [s.student for s in rows].count("bob") == 1
    refused = next(s for s in rows if s.student != "bob")
    assert refused.student.startswith("bob~") and "unsafe folder name 'bob-'" in refused.problem.text
    assert refused.student == next(s for s in collect(tmp_path, assignments(), A.name) if s.student != "bob").student


def test_the_summary_is_plain_text_whatever_the_file_names():
    """Notes name files the student named; as markdown they would be HTML in the instructor's formgrader."""
    name = '<img src="x" onerror="document.title=1">`[y](javascript:alert(1))`.ipynb'
    row = Result("ann", A.name, {"t": 1.0}, {"t": 2.0}, [Note(NoteKind.EXTRA_FILES, f"extra files ignored: {name}")])
    cell = summary_cell(row, name)
    assert cell.cell_type == "code" and cell.source == ""
    (shown,) = cell.outputs
    assert list(shown.data) == ["text/plain"] and name in shown.data["text/plain"]


def test_student_markdown_renders_as_its_text():
    """A fenced block shows HTML, links and images as text; no backtick run inside can close it."""
    from nbconvert.filters.markdown_mistune import markdown2html_mistune

    for text in ['<script>document.title=2</script> [x](javascript:alert(1)) ![i](https://example.org/t.png)',
                 "````\n</pre><script>alert(3)</script>\n```` and ``` too"]:
        page = markdown2html_mistune(as_text(text))
        assert "<script" not in page and "href=" not in page and "<img" not in page, page


def test_a_changed_hand_in_is_a_new_batch(tmp_path):
    """The batch cache is keyed by the hand-ins' state: a hand-in changed while a formgrader process lives on is
    graded again, never given the points of the file it replaced."""
    path = _put(tmp_path / "ann" / A.name, A.notebook, reference_submission(A))
    before = _state(tmp_path, A)
    assert _state(tmp_path, A) == before
    nbformat.write(blank_submission(A), path)
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1))
    assert _state(tmp_path, A) != before
