"""Deadlines: due dates, extensions and the late policy from one TOML file; a bad file stops autograde before grading."""

import subprocess

import pytest
from conftest import PYTHON, REPO
from instructor_class import ONE, A

from grader.author.mutants import reference_submission
from grader.author.selftest import put
from grader.collect.deadlines import ConfigError, Lateness, check_students, lateness, parse_config, penalty

NAMES = [ONE, "02_autograd_graph"]


def config(text):
    return parse_config(text, NAMES, "grading.toml")


POLICY = config(f"""
timezone = "Europe/Berlin"
[due]
{ONE} = "2030-01-15 23:59"
[late]
grace_minutes = 10
per_day = 25
max_days = 3

[[extension]]
student = "ada"
days = 1.5

[[extension]]
student = "bo"
assignment = "{ONE}"
due = "2030-02-01T12:00:00Z"
""")


@pytest.mark.parametrize("handed_in, late_by, fraction", [
    ("2030-01-15 23:59:00", 0.0, 0.0),  # on the minute
    ("2030-01-15T22:59:00Z", 0.0, 0.0),  # 23:59 in Berlin, written in UTC
    ("2030-01-16 00:09", 0.17, 0.0),  # inside the grace period
    ("2030-01-16 00:10:01", 0.18, 0.25),  # just past it: one started day
    ("2030-01-16 23:59:00", 24.0, 0.25),  # exactly a day
    ("2030-01-17 00:00:00", 24.02, 0.5),  # a second started day
    ("2030-01-18 23:59:00", 72.0, 0.75),  # three days: still within max_days
    ("2030-01-19 00:00:00", 72.02, 1.0),  # past max_days: nothing left
    ("2030-01-16 00:30:00.123456 Europe/Berlin", 0.52, 0.25),  # nbgrader's timestamp.txt format
])
def test_lateness_follows_the_policy(handed_in, late_by, fraction):
    late = lateness(POLICY, "someone", ONE, handed_in)
    assert (late.late_by, late.fraction) == (late_by, fraction)
    assert (late.note == "") == (late_by == 0.0)


def test_extensions_move_the_due_date_for_one_student():
    assert lateness(POLICY, "ada", ONE, "2030-01-17 11:59").late_by == 0.0  # 1.5 days more
    assert lateness(POLICY, "ada", ONE, "2030-01-17 12:59").late_by == 1.0
    assert lateness(POLICY, "bo", ONE, "2030-02-01 12:59").late_by == 0.0  # 13:00 Berlin is 12:00 UTC
    assert lateness(POLICY, "bo", ONE, "2030-02-01T13:00:01Z").fraction == 0.25


def test_no_due_date_or_no_hand_in_time_takes_nothing_and_says_why():
    assert lateness(POLICY, "someone", "02_autograd_graph", "2099-01-01 00:00") == Lateness()
    unknown = lateness(POLICY, "someone", ONE, "")
    assert unknown.late_by is None and unknown.fraction == 0 and unknown.note.startswith("hand-in time unknown")
    assert lateness(POLICY, "someone", ONE, "last tuesday").note.startswith("hand-in time unreadable")


def test_a_penalty_is_a_share_of_the_earned_or_the_maximum_points_and_never_more_than_earned():
    late = lateness(POLICY, "someone", ONE, "2030-01-17 00:00")  # 50 %
    assert penalty(8, 10, late) == 4.0
    of_max = config(f'[due]\n{ONE} = "2030-01-15 23:59"\n[late]\nper_day = 30\nof = "max"\n')
    late = lateness(of_max, "someone", ONE, "2030-01-16 12:00")  # 30 % of 10 = 3
    assert penalty(8, 10, late) == 3.0 and penalty(2, 10, late) == 2.0  # never below zero
    assert penalty(7, 10, Lateness()) == 0.0


@pytest.mark.parametrize("text, says", [
    (f'[due]\n{ONE}x = "2030-01-15 23:59"', "[due] 01_gradient_descentx: no such assignment (did you mean 01_gradient_descent?)"),
    (f'[due]\n{ONE} = "2030-13-15 23:59"', f"[due] {ONE} = '2030-13-15 23:59': not a date and time"),
    (f'[due]\n{ONE} = "2030-01-15"', "a date needs a time too"),
    (f"[due]\n{ONE} = 2030-01-15", "a date needs a time too"),
    ('timezone = "Mars/Olympus"', "timezone = 'Mars/Olympus': not a time zone"),
    ("[late]\nper_days = 10", "[late]: unknown key 'per_days' (did you mean 'per_day'?)"),
    ("[late]\nper_day = 150", "[late] per_day = 150: must be a number between 0 and 100"),
    ('[late]\nof = "median"', "must be 'earned' or 'max'"),
    ('feedback = "later"', "feedback = 'later': must be one of after-release, at-once"),
    ('[[extension]]\nstudent = "ada"\ndays = 2',
     "[[extension]] 1 (student 'ada'): days = 2 extends a due date, but [due] lists none"),
    (f'[due]\n{ONE} = "2030-01-15 23:59"\n[[extension]]\nstudent = "ada"', "give either due"),
    (f'[due]\n{ONE} = "2030-01-15 23:59"\n[[extension]]\nstudent = "ada"\ndue = "soon"',
     "(student 'ada') due = 'soon': not a date"),
    ("due = [", "grading.toml: not valid TOML"),
])
def test_a_malformed_config_is_refused_with_the_key_named(text, says):
    with pytest.raises(ConfigError) as err:
        config(text)
    assert says in str(err.value) and str(err.value).startswith("grading.toml")


def test_an_extension_for_a_student_with_no_hand_in_is_a_warning_and_waits_for_one():
    assert not check_students(POLICY, {"ada", "bo", "cy"}).warnings
    checked = check_students(POLICY, {"adam", "bo"})
    assert checked.extensions == POLICY.extensions   # kept as written: it applies once 'ada' hands in
    (warning,) = checked.warnings
    assert warning.startswith("warning: grading.toml: [[extension]] 1: student 'ada' handed nothing in")
    assert "(did you mean 'adam'?)" in warning and "waits for their hand-in" in warning


BAD = {
    "override for an unknown student": (f'[[override]]\nstudent = "alise"\nassignment = "{ONE}"\nexercise = "mse_grad"\n'
                                        'points = 1\nreason = "a typo"',
                        "student 'alise' handed nothing in and is not in the class (did you mean 'alice'?)"),
    "malformed date": (f'[due]\n{ONE} = "15.01.2030 23:59"', f"[due] {ONE} = '15.01.2030 23:59': not a date and time"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_autograde_stops_before_grading_on_a_bad_config(tmp_path, case):
    from grader.batch.autograde import autograde
    from grader.collect.deadlines import load_config

    toml, says = BAD[case]
    put(tmp_path / "class", "alice", A, reference_submission(A))
    (tmp_path / "grading.toml").write_text(toml)
    with pytest.raises(ConfigError) as err:
        autograde(tmp_path / "class", tmp_path / "out", config=load_config(tmp_path / "grading.toml", NAMES),
                  sandboxed=False, progress=False)
    assert says in str(err.value)
    assert not (tmp_path / "out" / "grades.csv").exists() and not (tmp_path / "out" / ".work" / "results").exists()


@pytest.mark.integration
def test_autograde_grades_the_class_and_warns_of_an_extension_for_a_student_with_no_hand_in(tmp_path, capsys):
    from grader.batch.autograde import autograde
    from grader.collect.deadlines import load_config

    put(tmp_path / "class", "alice", A, reference_submission(A))
    (tmp_path / "grading.toml").write_text(f'[due]\n{ONE} = "2030-01-15 23:59"\n[[extension]]\nstudent = "alise"\ndays = 2')
    results = autograde(tmp_path / "class", tmp_path / "out", config=load_config(tmp_path / "grading.toml", NAMES),
                        sandboxed=False, progress=False)
    assert [r.student for r in results] == ["alice"] and (tmp_path / "out" / "grades.csv").exists()
    assert "student 'alise' handed nothing in" in capsys.readouterr().err


@pytest.mark.slow
def test_the_autograde_command_exits_2_and_says_nothing_was_graded(tmp_path):
    toml, says = BAD["override for an unknown student"]
    put(tmp_path / "class", "alice", A, reference_submission(A))
    (tmp_path / "grading.toml").write_text(toml)
    run = subprocess.run([PYTHON, "-m", "grader", "autograde", str(tmp_path / "class"), "--out", str(tmp_path / "out"),
                          "--config", str(tmp_path / "grading.toml"), "--unsandboxed"],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2, run.stdout + run.stderr
    assert says in run.stderr and "nothing graded" in run.stderr and not (tmp_path / "out" / "grades.csv").exists()
