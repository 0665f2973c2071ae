"""Status notes are typed: every kind has its row in the report and its line in the grading page, and survives JSON."""

import re

from conftest import REPO

from grader.judge.grading import Graded, run_notes
from grader.kernel.harness import DIED, KILLED, NOT_RUN, OUTPUT_LIMIT, SKIPPED, TIMEOUT, Step, StepRun
from grader.report.report import ORDER, analyse
from grader.results import Note, NoteKind, Result, Spec, csv_cell, status_text


def test_every_kind_has_a_report_row_and_a_line_in_the_grading_page():
    page = (REPO / "docs/instructor/grading.md").read_text(encoding="utf-8")
    for kind in NoteKind:
        assert kind.value in ORDER
        line = re.search(rf"^\| `{re.escape(kind.value)}`( [★○])? \|", page, re.M)
        assert line, f"docs/instructor/grading.md has no line for the status kind {kind.value!r}"
        marks = line.group(1) or ""
        assert ("★" in marks) == kind.look_at and ("○" in marks) == (not kind.graded), kind


def test_the_report_files_each_note_by_its_kind_and_lists_those_to_look_at():
    rows = [{"student": f"s{i}", "assignment": "a", "scores": {"t": 1.0}, "max_scores": {"t": 1.0},
             "status": [Note(kind, f"text {i}").to_json()]} for i, kind in enumerate(NoteKind)]
    rows.append({"student": "fine", "assignment": "a", "scores": {"t": 1.0}, "max_scores": {"t": 1.0}, "status": []})
    data = analyse(rows)
    for i, kind in enumerate(NoteKind):
        assert data["status"][kind.value]["students"] == [f"s{i}/a: text {i}"]
    assert data["status"]["ok"]["students"] == ["fine/a"]
    assert {row["why"] for row in data["look_at"]} == {f"text {i}" for i, k in enumerate(NoteKind) if k.look_at}
    assert data["graded"] == 1 + sum(kind.graded for kind in NoteKind)


def test_what_went_wrong_in_a_run_becomes_a_note_of_the_right_kind():
    failures = {TIMEOUT: NoteKind.TIMEOUT, KILLED: NoteKind.TIMEOUT, DIED: NoteKind.KERNEL_DIED,
                OUTPUT_LIMIT: NoteKind.LIMIT_HIT, NOT_RUN: NoteKind.KERNEL_DIED, SKIPPED: NoteKind.SKIPPED}
    steps = [Step(label=f"cell {i}", code="pass", by_student=True) for i in range(len(failures))]
    runs = [StepRun(failure=failure) for failure in failures]
    notes = run_notes(Graded(steps, runs, {}))
    assert [n.kind for n in notes] == list(failures.values())
    assert status_text(notes).startswith("timeout in cell 0")


def test_spec_and_result_survive_json(tmp_path):
    spec = Spec(student="s", assignment="a", notebook="a.ipynb", submitted="", template="t", result="r", feedback="f",
                timeout=5, problem=Note(NoteKind.MISSING, "missing"), notes=[Note(NoteKind.RENAMED, "renamed")])
    assert Spec.from_json(spec.to_json()) == spec
    result = Result("s", "a", {"t": 1.0}, {"t": 2.0}, [Note(NoteKind.TAMPERED, "tampered: x")], penalty=0.5)
    result.write(tmp_path / "r.json")
    assert Result.read(tmp_path / "r.json") == result and result.total == 0.5
    assert status_text([]) == "ok"


def test_a_csv_cell_never_starts_a_formula():
    for text in ("=HYPERLINK(\"http://x\")", "+1", "-1", "@SUM(A1)"):
        assert csv_cell(text)[0] == "'"
    assert csv_cell("plain") == "plain"
    assert csv_cell("-") == "-"  # Moodle's worksheet: no grade
