"""The course in stock nbgrader's own workflow, end to end, as on a JupyterHub (grader/nbgrader/).

`python -m grader nbgrader init`; the instructor's `nbgrader generate_assignment` and `release_assignment`; three
students, each a Unix user of their own, `fetch_assignment` and `submit` through a shared exchange (the
reference answers saved as Colab names a copy, a known mistake, a blank notebook); `collect`; `autograde`. Then:
the gradebook holds the course grader's points, the formgrader (in Chromium) lists the submissions and shows no
hidden test, a score changed there survives a second autograde and reaches `nbgrader export`, and
`generate_feedback`'s pages hold no hidden-test line and, for the blank hand-in, no reference answer.
"""

from __future__ import annotations

import csv
import html
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest
from conftest import CHROMIUM, PYTHON, REPO, autograde, read_rows, require_chromium, shown_lines
from unix_users import accounts, as_user, python_for, unavailable

from grader.author.check import secret_lines
from grader.author.mutants import blank_submission, load_mutants, mutant_submission
from grader.course import assignment_named
from grader.judge.reference import reference_submission

pytestmark = pytest.mark.slow

ASSIGNMENT = assignment_named("01")
# student (a Unix account, as on a hub) -> the file name they hand in; what each hands in is built in `hand_in`
STUDENTS = {"tml-ada": f"Copy of {ASSIGNMENT.notebook}", "tml-bo": ASSIGNMENT.notebook, "tml-cy": ASSIGNMENT.notebook}
MUTANT = next(m for m in load_mutants(ASSIGNMENT) if m.exercise == "mse_grad")


WRITTEN = next(iter(ASSIGNMENT.written_cells()))  # 01's written answer: nbgrader leaves it to the formgrader
# HTML in a student's markdown, which the formgrader would render in the instructor's browser
SCRIPT = '<img src="x" onerror="document.title=1"><script>document.title=2</script> [x](javascript:document.title=4)'
EXTRA_FILE = '<img src="x" onerror="document.title=3">'  # a file name the course's notes repeat
FORGED = "2099-01-01 00:00:00.000000 UTC"  # newer than every real submission: collect would prefer it


def hand_in(student: str) -> nbformat.NotebookNode:
    """ada: every reference answer and the written answer; bo: the reference with one known mistake; cy: the
    release untouched."""
    if student == "tml-ada":
        nb = reference_submission(ASSIGNMENT)
        next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == WRITTEN).source = (
            "One step overshoots when it is large for the curvature; 0.1 is no constant of training."
            f"{SCRIPT}")
        return nb
    return {"tml-bo": lambda: mutant_submission(ASSIGNMENT, [MUTANT]),
            "tml-cy": lambda: blank_submission(ASSIGNMENT)}[student]()


@dataclass
class Hub:
    root: Path
    course: Path
    exchange: Path
    homes: dict[str, Path]
    uids: dict[str, int]
    python_for_students: str
    collected: Path  # a copy of submitted/ as `collect` left it, before autograde renamed anything
    autograde_s: float

    def instructor(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        """An nbgrader command run by the instructor in the course directory, with the course's environment."""
        env = dict(os.environ, PATH=f"{Path(PYTHON).parent}{os.pathsep}{os.environ.get('PATH', '')}")
        done = subprocess.run([PYTHON, "-m", "nbgrader", *argv], cwd=self.course, env=env, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0 or not check, done.stdout[-4000:] + done.stderr[-6000:]
        return done

    def student(self, name: str, *argv: str) -> subprocess.CompletedProcess:
        """An nbgrader command run by student `name`, as their own Unix user, in their home."""
        uid = self.uids[name]
        home = self.homes[name]
        env = {"HOME": str(home), "USER": name, "LOGNAME": name, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8",
               "JUPYTER_CONFIG_DIR": str(home / ".jupyter"), "JUPYTER_DATA_DIR": str(home / ".local/share/jupyter")}
        done = subprocess.run(as_user(uid, self.python_for_students, "-m", "nbgrader", *argv), cwd=home, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return done

    def gradebook_points(self) -> dict[str, dict[str, float]]:
        from nbgrader.api import Gradebook

        with Gradebook(f"sqlite:///{self.course / 'gradebook.db'}") as gb:
            return {s: {g.name: g.score for g in gb.find_submission_notebook(ASSIGNMENT.name, ASSIGNMENT.name, s).grades
                        if g.name in ASSIGNMENT.grade_cells()} for s in STUDENTS}


@pytest.fixture(scope="module")
def hub() -> Iterator[Hub]:
    if os.geteuid() != 0:
        unavailable("students as Unix users of their own need root (CI runs as root)")
    root = Path(tempfile.mkdtemp(prefix="nbgrader-hub-"))  # under /tmp: students cannot reach pytest's tmp_path
    os.chmod(root, 0o755)
    course, exchange = root / "course", root / "exchange"
    homes = {name: root / "home" / name for name in STUDENTS}
    try:
        init = subprocess.run([PYTHON, "-m", "grader", "nbgrader", "init", str(course), "--exchange", str(exchange)],
                              cwd=REPO, capture_output=True, text=True)
        assert init.returncode == 0, init.stdout + init.stderr
        with accounts(*STUDENTS) as uids:
            yield _round_trip(Hub(root, course, exchange, homes, uids, python_for(uids["tml-ada"], root),
                                  root / "collected", 0.0))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _round_trip(hub: Hub) -> Hub:
    """Release, fetch and submit as each student, collect, and autograde; returns `hub`."""
    course = hub.course
    hub.instructor("generate_assignment", ASSIGNMENT.name)
    hub.instructor("release_assignment", ASSIGNMENT.name)
    for name, file_name in STUDENTS.items():
        uid, home = hub.uids[name], hub.homes[name]
        (home / ".jupyter").mkdir(parents=True)
        shutil.copyfile(course / "student_nbgrader_config.py", home / ".jupyter" / "nbgrader_config.py")
        for path in (home, *home.rglob("*")):
            os.chown(path, uid, uid)
        hub.student(name, "fetch_assignment", ASSIGNMENT.name)
        fetched = home / ASSIGNMENT.name / ASSIGNMENT.notebook
        nbformat.write(hand_in(name), fetched)  # the student's work, saved (as root: chown it back)
        os.chown(fetched, uid, uid)
        fetched.rename(fetched.with_name(file_name))
        if name == "tml-bo":
            (fetched.parent / EXTRA_FILE).write_text("")
            os.chown(fetched.parent / EXTRA_FILE, uid, uid)
        hub.student(name, "submit", ASSIGNMENT.name)
    _plant_in_inbound(hub)
    hub.instructor("collect", ASSIGNMENT.name)
    shutil.copytree(course / "submitted", hub.collected)
    began = time.perf_counter()
    hub.instructor("autograde", ASSIGNMENT.name)
    hub.autograde_s = time.perf_counter() - began
    return hub


def _plant_in_inbound(hub: Hub) -> None:
    """What cy can do to the world-writable inbound folder: a submission of hers that is a link to the course's
    source (the reference answers), and a folder named as bo's submission, newer than his."""
    inbound = hub.exchange / "training-mechanics-lab" / "inbound"
    forged = inbound / f"tml-bo+{ASSIGNMENT.name}+{FORGED}+forged"
    script = (f'ln -s "$0" "{inbound}/tml-cy+{ASSIGNMENT.name}+{FORGED}+link" && mkdir "{forged}" '
              f'&& cp "$0/{ASSIGNMENT.notebook}" "{forged}/"')
    done = subprocess.run(as_user(hub.uids["tml-cy"], "/bin/sh", "-c", script, str(hub.course / "source" / ASSIGNMENT.name)),
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_init_writes_the_release_nbgrader_generates_exactly(hub):
    """source/ is framed: `nbgrader generate_assignment` writes the course's own release, byte for byte in content."""
    generated = nbformat.read(hub.course / "release" / ASSIGNMENT.name / ASSIGNMENT.notebook, as_version=4)
    assert generated == nbformat.read(ASSIGNMENT.release, as_version=4)


def test_each_student_fetched_and_submitted_as_their_own_user(hub):
    """Each student's own submission was collected: not cy's link to the reference answers, not the folder she
    named as bo's (nbgrader's collect would copy the source through the link, and take the newer folder)."""
    collected = {p.parent.parent.name: p.name for p in hub.collected.glob(f"*/{ASSIGNMENT.name}/*.ipynb")}
    assert collected == STUDENTS
    for name in STUDENTS:
        got = nbformat.read(next((hub.collected / name / ASSIGNMENT.name).glob("*.ipynb")), as_version=4)
        assert [c.source for c in got.cells] == [c.source for c in hand_in(name).cells], name
    assert (hub.collected / "tml-bo" / ASSIGNMENT.name / EXTRA_FILE).exists()
    inbound = [p for p in (hub.exchange / "training-mechanics-lab" / "inbound").iterdir() if FORGED not in p.name]
    assert sorted(p.stat().st_uid for p in inbound) == sorted(hub.uids.values())


def test_the_gradebook_holds_the_course_graders_points(hub, tmp_path):
    """Per student and test cell, nbgrader's gradebook has exactly what `python -m grader autograde` gives the
    same collected files — the renamed hand-in graded as its assignment, the known mistake losing its exercise."""
    autograde(hub.collected, tmp_path / "graded", "--assignment", ASSIGNMENT.name)
    course_points = {student: scores for (student, _), (scores, *_) in read_rows(tmp_path / "graded").items()}
    assert hub.gradebook_points() == course_points
    full = ASSIGNMENT.grade_cells()
    assert course_points["tml-ada"] == full
    assert course_points["tml-bo"] == {**full, "mse_grad": 0.0}
    assert set(course_points["tml-cy"].values()) == {0.0}
    print(f"\nnbgrader autograde with the course's grading: {hub.autograde_s:.1f} s for {len(STUDENTS)} hand-ins")


def test_written_answers_are_left_to_the_formgrader(hub):
    """A written answer gets no autograded score: nbgrader asks for a hand grade where one was written, and gives 0
    where the cell still says YOUR ANSWER HERE."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{hub.course / 'gradebook.db'}") as gb:
        grades = {s: gb.find_grade(WRITTEN, ASSIGNMENT.name, ASSIGNMENT.name, s) for s in STUDENTS}
        seen = {s: (g.auto_score, g.needs_manual_grade) for s, g in grades.items()}
    assert seen == {"tml-ada": (None, True), "tml-bo": (0, False), "tml-cy": (0, False)}


def test_autograded_notebooks_hold_no_hidden_test_and_only_verdicts(hub):
    hidden, _ = _secrets()
    for name in STUDENTS:
        nb = nbformat.read(hub.course / "autograded" / name / ASSIGNMENT.name / ASSIGNMENT.notebook, as_version=4)
        text = {line.strip() for cell in nb.cells for line in cell.source.splitlines()}
        assert not hidden & text
        outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
        # the summary on top, then a verdict and its points per test: nothing else
        assert len(outputs) == 1 + 2 * len(ASSIGNMENT.grade_cells())
        assert nb.cells[0].outputs[0].data["text/plain"].startswith("Autograded by the course's grader")
        assert "BEGIN HIDDEN" not in nbformat.writes(nb)
    ada = nbformat.read(hub.course / "autograded" / "tml-ada" / ASSIGNMENT.name / ASSIGNMENT.notebook, as_version=4)
    summary = ada.cells[0].outputs[0].data["text/plain"]
    assert f"Handed in as 'Copy of {ASSIGNMENT.notebook}'; graded as this assignment." in summary


def _secrets() -> tuple[set[str], set[str]]:
    """Lines of 01's hidden tests, and of its reference answers that the release does not show anywhere (a hint
    may quote a fragment of an answer)."""
    source = nbformat.read(ASSIGNMENT.source, as_version=4)
    release = nbformat.writes(nbformat.read(ASSIGNMENT.release, as_version=4))
    return (secret_lines(source, solutions=False),
            {line for line in secret_lines(source, hidden_tests=False) if line not in release})


def _formgrader_pages(hub: Hub, manual_score: float) -> dict[str, str]:
    """Open the formgrader in Chromium as the instructor would: the assignment list, the submissions, and bo's
    notebook, where the score of mse_grad is changed by hand. Returns each page's HTML."""
    from browser_lab import CHROMIUM_ARGS, LabServer
    from nbgrader.api import Gradebook
    from playwright.sync_api import sync_playwright

    server = LabServer(hub.course, hub.root / "instructor-lab")
    pages: dict[str, str] = {}
    with Gradebook(f"sqlite:///{hub.course / 'gradebook.db'}") as gb:
        submission_ids = {s: gb.find_submission_notebook(ASSIGNMENT.name, ASSIGNMENT.name, s).id for s in STUDENTS}
    try:
        server.start()
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.goto(f"{server.url}/formgrader/manage_assignments?token={server.token}")
            page.wait_for_selector(f"text={ASSIGNMENT.name}", timeout=60_000)
            pages["assignments"] = page.content()
            page.goto(f"{server.url}/formgrader/manage_submissions/{ASSIGNMENT.name}")
            for name in STUDENTS:
                page.wait_for_selector(f"text={name}", timeout=60_000)
            pages["submissions"] = page.content()
            for name, submission in submission_ids.items():
                page.goto(f"{server.url}/formgrader/submissions/{submission}/")
                page.wait_for_selector("input.score#mse_grad", timeout=60_000)
                if name == "tml-ada":  # the written answer, graded by hand
                    page.fill(f"input.score#{WRITTEN}", "2")
                    page.press(f"input.score#{WRITTEN}", "Tab")
                    _wait_for_manual_score(hub, "tml-ada", WRITTEN, 2.0)
                if name == "tml-bo":
                    page.fill("input.score#mse_grad", str(manual_score))
                    page.fill("textarea#mse_grad_answer-comment", "the factor 2 is missing; see me")
                    page.press("textarea#mse_grad_answer-comment", "Tab")
                    _wait_for_manual_score(hub, "tml-bo", "mse_grad", manual_score)
                assert page.title() not in ("1", "2", "3"), "a student's HTML ran in the formgrader"
                pages[name] = page.content()
            browser.close()
    finally:
        server.stop()
    return pages


def _wait_for_manual_score(hub: Hub, student: str, grade: str, score: float, timeout: float = 30) -> None:
    from nbgrader.api import Gradebook

    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        with Gradebook(f"sqlite:///{hub.course / 'gradebook.db'}") as gb:
            if gb.find_grade(grade, ASSIGNMENT.name, ASSIGNMENT.name, student).manual_score == score:
                return
        time.sleep(0.2)
    raise AssertionError(f"the formgrader did not save {student}'s {grade} = {score} within {timeout} s")


def _exported(hub: Hub) -> dict[str, float]:
    out = hub.root / "export.csv"
    hub.instructor("export", "--to", str(out))
    with open(out, newline="") as f:
        return {row["student_id"]: float(row["score"]) for row in csv.DictReader(f)}


def test_formgrader_shows_submissions_and_a_manual_score_reaches_export(hub):
    require_chromium()
    hidden, answers = _secrets()
    before = _exported(hub)
    assert before == {"tml-ada": 10.0, "tml-bo": 10.0 - ASSIGNMENT.grade_cells()["mse_grad"], "tml-cy": 0.0}
    pages = _formgrader_pages(hub, manual_score=1.5)
    for name, page in pages.items():
        assert not hidden & shown_lines(page), name
    assert not answers & shown_lines(pages["tml-cy"])  # a blank hand-in's page shows no reference answer
    assert '<img src="x"' not in pages["tml-ada"] + pages["tml-bo"] and "<script>document" not in pages["tml-ada"]
    assert 'href="javascript' not in pages["tml-ada"]
    assert "document.title=2" in html.unescape(pages["tml-ada"])  # shown as the text it is
    assert "✗ 0 of 3 point(s), from the course's grader" in pages["tml-bo"]
    after = _exported(hub)
    assert after == {**before, "tml-ada": before["tml-ada"] + 2, "tml-bo": before["tml-bo"] + 1.5}
    # a second autograde of unchanged hand-ins keeps the instructor's score
    hub.instructor("autograde", ASSIGNMENT.name, "--force")
    assert _exported(hub) == after


def test_feedback_pages_hold_no_hidden_test_line(hub):
    hub.instructor("generate_feedback", ASSIGNMENT.name)
    hidden, answers = _secrets()
    pages = {name: (hub.course / "feedback" / name / ASSIGNMENT.name / f"{ASSIGNMENT.name}.html").read_text()
             for name in STUDENTS}
    for name, page in pages.items():
        assert not hidden & shown_lines(page), name
        assert "BEGIN HIDDEN" not in page
    assert not answers & shown_lines(pages["tml-cy"])
    hub.instructor("release_feedback", ASSIGNMENT.name)
    hub.student("tml-cy", "fetch_feedback", ASSIGNMENT.name)
    fetched = list((hub.homes["tml-cy"] / ASSIGNMENT.name / "feedback").rglob("*.html"))
    assert fetched and not hidden & shown_lines(fetched[0].read_text())


def test_a_changed_hand_in_loses_its_manual_grade(hub):
    """A resubmission is a new hand-in: the score given by hand to the old one does not carry over."""
    from nbgrader.api import Gradebook

    submitted = hub.course / "submitted" / "tml-bo" / ASSIGNMENT.name
    nbformat.write(reference_submission(ASSIGNMENT), submitted / ASSIGNMENT.notebook)
    (submitted / "timestamp.txt").write_text("2099-01-01 00:00:00.000000 UTC")  # newer: nbgrader grades it again
    hub.instructor("autograde", ASSIGNMENT.name)
    with Gradebook(f"sqlite:///{hub.course / 'gradebook.db'}") as gb:
        grade = gb.find_grade("mse_grad", ASSIGNMENT.name, ASSIGNMENT.name, "tml-bo")
        assert (grade.manual_score, grade.auto_score) == (None, ASSIGNMENT.grade_cells()["mse_grad"])


def test_late_hand_ins_follow_nbgrader_s_due_date_and_late_penalty_plugin(hub):
    """nbgrader's own due date and late-penalty plugin decide lateness: with a due date before the hand-ins and its
    'zero' method, a regraded hand-in scores 0 in nbgrader's export, the penalty in its own column."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{hub.course / 'gradebook.db'}") as gb:
        gb.update_or_create_assignment(ASSIGNMENT.name, duedate="2000-01-01 00:00:00 UTC")
    config = hub.course / "nbgrader_config.py"
    config.write_text(config.read_text() + '\nc.LateSubmissionPlugin.penalty_method = "zero"\n')
    hub.instructor("autograde", ASSIGNMENT.name, "--force", "--student", "tml-ada")
    out = hub.root / "late.csv"
    hub.instructor("export", "--to", str(out))
    with open(out, newline="") as f:
        ada = next(row for row in csv.DictReader(f) if row["student_id"] == "tml-ada")
    assert float(ada["score"]) == 0 and float(ada["late_submission_penalty"]) == float(ada["raw_score"]) > 0, ada


def test_init_again_keeps_the_gradebook(hub):
    before = hub.gradebook_points()
    again = subprocess.run([PYTHON, "-m", "grader", "nbgrader", "init", str(hub.course), "--exchange",
                            str(hub.exchange)], cwd=REPO, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert hub.gradebook_points() == before
