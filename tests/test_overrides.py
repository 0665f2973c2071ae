"""Grade overrides and one key per student (issue 22 items 3 and 4): `[[override]]` in grading.toml sets an exercise's
points after grading, on every run; a student may be named by key, LMS id or folder name; a wrong name stops autograde."""

import copy
import csv
import html
import json
import re
import subprocess

import pytest
from conftest import PYTHON, REPO, autograde
from instructor_class import ONE, A
from test_similarity import COPY, ORIGINAL

from grader.author.mutants import load_mutants, mutant_submission, reference_submission
from grader.author.selftest import put
from grader.collect.deadlines import ConfigError, check_students, lateness, parse_config, settle
from grader.results import NoteKind, Result
from labkit import cells

EXERCISES = {ONE: {**A.grade_cells(), **A.written_cells()}}
WRITTEN = next(iter(A.written_cells()))  # 01's written answer, graded by hand
OVERRIDE = f"""
[[override]]
student = "{{student}}"
assignment = "{ONE}"
exercise = "mse_grad"
points = 3
reason = "derivation explained in office hours"
"""


def config(text):
    return parse_config(text, [ONE], "grading.toml")


@pytest.mark.parametrize("name, key, how", [
    ("dee_1004", "dee_1004", ""),
    ("1004", "dee_1004", "by LMS id"),
    ("Dee", "dee_1004", "by name: the key without its LMS id"),
    ("ann_2001", "ann", "by name: the folder name"),
])
def test_a_student_is_named_by_key_lms_id_or_folder_name_and_autograde_says_which(name, key, how):
    resolved = check_students(config(OVERRIDE.format(student=name)), {"dee_1004", "ann", "bo_1005"}, EXERCISES)
    assert resolved.overrides[0].student == key
    assert resolved.matched == ((f"grading.toml: [[override]] 1: student {name!r} is {key} ({how})",) if how else ())


@pytest.mark.parametrize("text, students, says", [
    (OVERRIDE.format(student="dee"), {"dee_1004", "dee_1009"}, "student 'dee' could be dee_1004 or dee_1009"),
    (OVERRIDE.format(student="zed"), {"dee_1004"}, "student 'zed' handed nothing in and is not in the class"),
    (OVERRIDE.format(student="dee").replace('"mse_grad"', '"mse_gard"'), {"dee"},
     f"exercise 'mse_gard': {ONE} has no such exercise (did you mean 'mse_grad'?)"),
    (OVERRIDE.format(student="dee").replace("points = 3", "points = 4"), {"dee"}, "points = 4: mse_grad is worth 3 at most"),
    (OVERRIDE.format(student="dee") + OVERRIDE.format(student="1004"), {"dee_1004"}, "overridden already by [[override]] 1"),
])
def test_a_wrong_student_or_exercise_is_refused_with_the_name(text, students, says):
    with pytest.raises(ConfigError) as err:
        check_students(config(text), students, EXERCISES)
    assert says in str(err.value) and str(err.value).startswith("grading.toml: [[override]]")


@pytest.mark.parametrize("text, says", [
    (OVERRIDE.format(student="dee").replace(f'"{ONE}"', '"01_gradient"'), "assignment '01_gradient': no such assignment"),
    (OVERRIDE.format(student="dee").replace('reason = "derivation explained in office hours"', ""), "needs reason"),
    (OVERRIDE.format(student="dee").replace('reason = "derivation explained in office hours"', 'reason = " "'),
     "reason = ' ': must be a non-empty string"),
    (OVERRIDE.format(student="dee").replace("points = 3", "points = -1"), "points = -1: must be a number"),
    (OVERRIDE.format(student="dee") + "grade = 2\n", "unknown key 'grade'"),
])
def test_a_malformed_override_is_refused(text, says):
    with pytest.raises(ConfigError, match="grading.toml: ") as err:
        config(text)
    assert says in str(err.value)


def test_settle_applies_overrides_then_the_late_penalty_and_settling_again_changes_nothing():
    late_policy = config(f'[due]\n{ONE} = "2030-01-15 23:59"\n[late]\nper_day = 10\n')
    late = lateness(late_policy, "dee", ONE, "2030-01-16 08:00")
    row = Result("dee", ONE, {"mse_grad": 0.0, "critical_lr": 2.0}, {"mse_grad": 3.0, "critical_lr": 2.0})
    by_hand = check_students(config(OVERRIDE.format(student="dee")), {"dee"}, EXERCISES).overrides
    settle(row, late, by_hand)
    once = copy.deepcopy(row)
    assert row.scores == {"mse_grad": 3.0, "critical_lr": 2.0} and row.penalty == 0.5 and row.total == 4.5
    assert row.overrides == {"mse_grad": {"graded": 0.0, "points": 3.0, "reason": "derivation explained in office hours"}}
    assert [n.text for n in row.status if n.kind is NoteKind.REGRADED] == [
        "regraded by hand: mse_grad 0 → 3 of 3 (derivation explained in office hours)"]
    assert settle(row, late, by_hand) == once
    settle(row, late, [])  # the override taken out of grading.toml: the autograder's points again
    assert row.scores["mse_grad"] == 0.0 and row.overrides == {} and row.status == [] and row.penalty == 0.2


def test_a_written_answer_waits_for_a_hand_grade_apart_from_the_autograded_points():
    """Graded by nobody, a written answer leaves total and max_total as the tests make them and says it waits; an
    override gives it points on top; taken out, it waits again. Not answered, it is 0 and waits for nothing."""
    row = Result("dee", ONE, {"mse_grad": 3.0}, {"mse_grad": 3.0}, by_hand={WRITTEN: None}, by_hand_max={WRITTEN: 2.0})
    settle(row, {}, [])
    assert row.total == 3.0 and [n.kind for n in row.status] == [NoteKind.BY_HAND] and WRITTEN in row.status[0].text
    given = check_students(config(OVERRIDE.format(student="dee").replace('"mse_grad"', f'"{WRITTEN}"')
                                  .replace("points = 3", "points = 1.5")), {"dee"}, EXERCISES).overrides
    settle(row, {}, given)
    assert row.by_hand == {WRITTEN: 1.5} and row.total == 4.5 and row.scores == {"mse_grad": 3.0} and row.status == []
    settle(row, {}, [])
    assert row.by_hand == {WRITTEN: None} and row.total == 3.0 and [n.kind for n in row.status] == [NoteKind.BY_HAND]
    no_points = config(f'[due]\n{ONE} = "2030-01-15 23:59"\n[late]\nper_day = 10\nmax_days = 1\n')
    settle(row, lateness(no_points, "dee", ONE, "2030-01-20 08:00"), given)  # past max_days: nothing counts
    assert row.by_hand == {WRITTEN: 1.5} and row.penalty == 4.5 and row.total == 0.0
    blank = Result("ann", ONE, {"mse_grad": 3.0}, {"mse_grad": 3.0}, by_hand={WRITTEN: 0.0}, by_hand_max={WRITTEN: 2.0})
    assert settle(blank, {}, []).status == [] and blank.total == 3.0
    with pytest.raises(ConfigError, match="is worth 2 at most"):
        check_students(config(OVERRIDE.format(student="dee").replace('"mse_grad"', f'"{WRITTEN}"')), {"dee"}, EXERCISES)


# --- slow: two autograde runs, an override kept across them, a planted copy found --------------------------------

def answered(answers):
    nb = reference_submission(A)
    for cell in nb.cells:
        if cells.grade_id(cell) in answers:
            cell.source = answers[cells.grade_id(cell)]
    return nb


@pytest.mark.slow
def test_an_override_survives_a_second_run_and_the_report_finds_the_planted_copy(tmp_path):
    factor2 = next(m for m in load_mutants(A) if m.name == "mse_grad_missing_factor_2")
    dee = mutant_submission(A, [factor2])
    next(c for c in dee.cells if cells.grade_id(c) == WRITTEN).source = "It depends on the curvature, not on 0.1."
    put(tmp_path / "class", "dee_1004", A, dee)
    put(tmp_path / "class", "planted-p_1005", A, answered(ORIGINAL))
    put(tmp_path / "class", "planted-q_1006", A, answered(COPY))
    hand_graded = OVERRIDE.format(student="dee").replace('"mse_grad"', f'"{WRITTEN}"').replace("points = 3", "points = 2")
    (tmp_path / "grading.toml").write_text(OVERRIDE.format(student="dee") + hand_graded)
    out = tmp_path / "graded"
    for run in (1, 2):  # the second run grades nothing again, and keeps the override
        done = autograde(tmp_path / "class", out, "--timeout", "10", "--config", str(tmp_path / "grading.toml"))
        assert "grading.toml: [[override]] 1: student 'dee' is dee_1004 (by name: the key without its LMS id)" in done.stdout
        rows = {r["student"]: r for r in json.loads((out / "results.json").read_text())}
        dee = rows["dee_1004"]
        assert dee["scores"]["mse_grad"] == 3.0 and dee["overrides"]["mse_grad"]["graded"] == 0.0, run
        assert dee["messages"]["mse_grad"], "the autograder's own verdict is kept beside the override"
        assert "regraded by hand: mse_grad 0 → 3 of 3 (derivation explained in office hours)" in (out / "grades.csv").read_text()
        assert all(r["scores"] == {k: v for k, v in A.grade_cells().items()} for s, r in rows.items() if s != "dee_1004"), run
        with open(out / "grades.csv", newline="") as f:
            csv_rows = {r["student"]: r for r in csv.DictReader(f)}
        dee_row = csv_rows["dee_1004"]
        assert (dee_row[WRITTEN], dee_row["total"], dee_row["max_total"]) == ("2", "12", "10"), run
        assert csv_rows["planted-p_1005"][WRITTEN] == "0" and csv_rows["planted-p_1005"]["status"] == "ok", run
    page = html.unescape(re.sub(r"<[^>]+>", "", (out / "feedback" / "dee_1004" / ONE / f"{ONE}.html").read_text()))
    assert ("Regraded by hand: mse_grad: 0 → 3 points — derivation explained in office hours; "
            f"{WRITTEN}: 2 points for the written answer — derivation explained in office hours.") in page
    assert "10 / 10" in page
    report = json.loads((out / "report" / "report.json").read_text())
    assert report["status"]["regraded by hand"]["students"] == [
        f"dee_1004/{ONE}: regraded by hand: mse_grad 0 → 3 of 3 (derivation explained in office hours)"]
    assert [p["students"] for p in report["similarity"]["assignments"][ONE]["pairs"]] == [["planted-p_1005", "planted-q_1006"]]
    # Taken out of grading.toml: the autograder's points come back, and the written answer waits again.
    (tmp_path / "grading.toml").write_text("")
    autograde(tmp_path / "class", out, "--timeout", "10", "--config", str(tmp_path / "grading.toml"))
    dee = next(r for r in json.loads((out / "results.json").read_text()) if r["student"] == "dee_1004")
    assert dee["scores"]["mse_grad"] == 0.0 and dee["overrides"] == {} and dee["by_hand"] == {WRITTEN: None}
    assert f"written answer waiting for a hand grade: {WRITTEN}" in (out / "grades.csv").read_text()


@pytest.mark.slow
def test_an_override_for_an_unknown_exercise_stops_autograde_with_exit_2(tmp_path):
    put(tmp_path / "class", "dee_1004", A, reference_submission(A))
    (tmp_path / "grading.toml").write_text(OVERRIDE.format(student="1004").replace('"mse_grad"', '"mse"'))
    run = subprocess.run([PYTHON, "-m", "grader", "autograde", str(tmp_path / "class"), "--out", str(tmp_path / "out"),
                          "--config", str(tmp_path / "grading.toml"), "--unsandboxed"],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2, run.stdout + run.stderr
    assert f"[[override]] 1: exercise 'mse': {ONE} has no such exercise" in run.stderr
    assert not (tmp_path / "out" / "grades.csv").exists()
