"""A synthetic class of notebook-01 hand-ins with a known mix, for the instructor's tools (report, export, deadlines).

Not a test module: tests/test_report.py and test_lms.py build it, grade it once and check that what the
instructor gets — the report's counts, each LMS export, the late penalties — equals the mix exactly.
Every student is keyed `<name>_<id>` the way collection keys Canvas and Moodle hand-ins, except
`jdoe@uni.example` (a folder named by login, which is also the email) and `stranger_9999` (in no roster).
"""

from __future__ import annotations

import csv
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from factories import own_cell

from grader.author.mutants import blank_submission, load_mutants, mutant_submission, reference_submission
from grader.author.selftest import put
from grader.course import assignment_named

ONE = "01_gradient_descent"
A = assignment_named(ONE)
FULL = A.grade_cells()
MUTANTS = load_mutants(A)
COPIES = 2  # hand-ins per known mistake
DUE = "2030-01-15 23:59"  # Europe/Berlin, in the config below
ON_TIME = "2030-01-15 20:00:00"
CONFIG = f"""
timezone = "Europe/Berlin"

[due]
{ONE} = "{DUE}"

[late]
grace_minutes = 10
per_day = 10

[[extension]]
student = "ext-late_1040"
assignment = "{ONE}"
days = 3
"""
# (student, hand-in time, late_by hours, fraction of the earned points taken)
LATE = {
    "ref-c_1003": ("2030-01-16 09:59:00", 10.0, 0.1),   # 10 h late: 1 started day, 10 %
    "mut-late_1041": ("2030-01-17 11:59:00", 36.0, 0.2),  # 36 h late: 2 started days, 20 %
    "grace_1042": ("2030-01-16 00:04:00", 0.08, 0.0),   # 5 min late, inside the 10-minute grace
    "ext-late_1040": ("2030-01-17 11:59:00", 0.0, 0.0),  # late without the extension, on time with it
}
NO_TIME = "honest-einsum_1050"  # no timestamp.txt: the report asks to look at it

HONEST = {  # correct answers written differently: full marks
    "honest-einsum_1050": ("mse_grad_answer", "def mse_grad(w, X, y):\n"
                           "    r = torch.einsum('nd,d->n', X, w) - y\n    return 2 * torch.einsum('nd,n->d', X, r) / len(X)\n"),
    "honest-float64_1051": ("critical_lr_answer", "def critical_lr(X):\n    X = X.double()\n"
                            "    H = 2 * X.T @ X / X.shape[0]\n    return float(2 / torch.linalg.eigvalsh(H)[-1])\n"),
    "honest-eye_1052": ("numerical_grad_answer", "def numerical_grad(f, w, eps=1e-3):\n"
                        "    flat = torch.zeros(w.numel(), dtype=w.dtype)\n"
                        "    for i, e in enumerate(torch.eye(w.numel(), dtype=w.dtype)):\n        e = e.reshape(w.shape) * eps\n"
                        "        flat[i] = (float(f(w + e)) - float(f(w - e))) / (2 * eps)\n    return flat.reshape(w.shape)\n"),
}
UNRECOGNISED = {  # wrong in ways no known mistake describes: exercise -> (student, answer cell, source)
    "wrong-zeros_1060": ("mse_grad", "mse_grad_answer", "def mse_grad(w, X, y):\n    return torch.zeros_like(w)\n"),
    "wrong-half-lr_1061": ("gradient_descent", "gradient_descent_answer",
                           "def gradient_descent(w0, X, y, lr, steps):\n    w = w0.clone()\n    losses = []\n"
                           "    for _ in range(steps):\n        losses.append(((X @ w - y) ** 2).mean().item())\n"
                           "        w = w - 0.5 * lr * mse_grad(w, X, y)\n    return w, losses\n"),
}
JDOE = "jdoe@uni.example"  # no LMS id in the key: matched by login (Canvas) or email (Gradescope, Moodle)
ALL_WRONG = "all-wrong_1070"  # every answer returns None: zero points after a non-blank hand-in
STATUS_CASES = {  # student -> status category the report must put them in (besides full marks or nothing)
    "tampered_1080": "tampered",
    "sleepy_1081": "timeout",
    "empty-folder_1082": "no submission",
    "wrong-file_1083": "missing",
    "corrupt_1084": "invalid",
}


@dataclass
class Mix:
    """What the class holds, student by student: expected raw points per exercise, and who is what."""

    scores: dict[str, dict[str, float]] = field(default_factory=dict)  # graded hand-ins only
    mistakes: dict[str, dict[str, str]] = field(default_factory=dict)  # student -> exercise -> known mistake
    unanswered: dict[str, set[str]] = field(default_factory=dict)  # student -> exercises left as stubs
    not_graded: dict[str, str] = field(default_factory=dict)  # student -> status category
    status: dict[str, str] = field(default_factory=dict)  # student -> status category of a graded hand-in

    @property
    def students(self) -> list[str]:
        return sorted([*self.scores, *self.not_graded])

    def penalty(self, student: str) -> float:
        fraction = LATE.get(student, (None, None, 0.0))[2]
        return round(sum(self.scores[student].values()) * fraction, 2)

    def total(self, student: str) -> float:
        return round(sum(self.scores[student].values()) - self.penalty(student), 6)

    def totals(self) -> Counter:
        return Counter(self.total(s) for s in self.scores)


def _with(cell: str, source: str, base: nbformat.NotebookNode | None = None) -> nbformat.NotebookNode:
    nb = base or reference_submission(A)
    for c in nb.cells:
        if c.metadata.get("nbgrader", {}).get("grade_id") == cell:
            c.source = source
    return nb


def build_class(root: Path) -> Mix:
    """Write the class under `root` (<student>/01_gradient_descent/…); returns what it holds."""
    mix = Mix()

    def hand_in(student: str, nb: nbformat.NotebookNode, scores: dict[str, float]) -> None:
        path = put(root, student, A, nb)
        if student != NO_TIME:
            (path.parent / "timestamp.txt").write_text(LATE.get(student, (ON_TIME,))[0])
        mix.scores[student] = scores

    for name in ["ref-a_1001", "ref-b_1002", "ref-c_1003"]:
        hand_in(name, reference_submission(A), dict(FULL))
    for name in ["blank-a_1010", "blank-b_1011"]:
        hand_in(name, blank_submission(A), {k: 0.0 for k in FULL})
        mix.unanswered[name] = set(FULL)
    number = 2000
    for mutant in MUTANTS:
        for copy in range(COPIES):
            number += 1
            name = f"{mutant.name.replace('_', '-')}-{copy}_{number}"
            hand_in(name, mutant_submission(A, [mutant]), {k: 0.0 if k == mutant.exercise else v for k, v in FULL.items()})
            mix.mistakes[name] = {mutant.exercise: mutant.name}
    # A late mutant hand-in, one inside the grace period, one saved by an extension.
    factor2 = MUTANTS[0]
    hand_in("mut-late_1041", mutant_submission(A, [factor2]), {k: 0.0 if k == factor2.exercise else v for k, v in FULL.items()})
    mix.mistakes["mut-late_1041"] = {factor2.exercise: factor2.name}
    hand_in("grace_1042", reference_submission(A), dict(FULL))
    hand_in("ext-late_1040", reference_submission(A), dict(FULL))
    for name, (cell, source) in HONEST.items():
        hand_in(name, _with(cell, source), dict(FULL))
    for name, (exercise, cell, source) in UNRECOGNISED.items():
        hand_in(name, _with(cell, source), {k: 0.0 if k == exercise else v for k, v in FULL.items()})
    wrong = reference_submission(A)
    for cell, signature in [("mse_grad_answer", "mse_grad(w, X, y)"), ("numerical_grad_answer", "numerical_grad(f, w, eps=1e-3)"),
                            ("gradient_descent_answer", "gradient_descent(w0, X, y, lr, steps)"),
                            ("critical_lr_answer", "critical_lr(X)"), ("best_momentum_answer", "best_momentum(X)")]:
        wrong = _with(cell, f"def {signature}:\n    return None\n", wrong)
    hand_in(ALL_WRONG, wrong, {k: 0.0 for k in FULL})
    # What goes wrong with hand-ins, each once: a locked cell edited (restored), a scratch cell that sleeps
    # past the limit, an empty folder, a folder with the wrong file, a corrupt notebook.
    tampered = reference_submission(A)
    setup = next(c for c in tampered.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "setup")
    setup.source += "\n# my note"
    hand_in("tampered_1080", tampered, dict(FULL))
    sleepy = reference_submission(A)
    sleepy.cells.insert(len(sleepy.cells), own_cell("import time\ntime.sleep(120)"))
    hand_in("sleepy_1081", sleepy, dict(FULL))
    for name, category in STATUS_CASES.items():
        if name in mix.scores:
            mix.status[name] = category
    (root / "empty-folder_1082").mkdir(parents=True)
    (root / "wrong-file_1083" / ONE).mkdir(parents=True)
    (root / "wrong-file_1083" / ONE / "notes.txt").write_text("I could not finish")
    (root / "corrupt_1084" / ONE).mkdir(parents=True)
    (root / "corrupt_1084" / ONE / A.notebook).write_text('{"cells": [')
    mix.not_graded.update({k: v for k, v in STATUS_CASES.items() if k not in mix.scores})
    # Matched by login only (Canvas's SIS Login ID), and matched by nobody.
    hand_in(JDOE, reference_submission(A), dict(FULL))
    hand_in("stranger_9999", reference_submission(A), dict(FULL))
    return mix


# --- rosters, as each LMS exports them ------------------------------------------------------------------------

ROSTER_ONLY = ("Nobody, Noah", "5555")  # in every roster, handed nothing in


def _people(mix: Mix) -> list[tuple[str, str, str]]:
    """(student key, display name, LMS id) of everyone the rosters know: all but jdoe's id and the stranger."""
    people = []
    for student in mix.students:
        if student == "stranger_9999":
            continue
        if student == JDOE:
            people.append((student, "Doe John", "4321"))
            continue
        stem, _, number = student.rpartition("_")
        people.append((student, stem.replace("-", " ").title(), number))
    return people


def _email(student: str, number: str) -> str:
    return JDOE if student == JDOE else f"s{number}@uni.example"


def canvas_roster(mix: Mix, path: Path) -> Path:
    """Canvas's gradebook export: Student, ID, SIS User ID, SIS Login ID, Section, assignments…, with its
    Points Possible row; jdoe's folder is his login, not his Canvas ID."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["Student", "ID", "SIS User ID", "SIS Login ID", "Section", f"{ONE} (777)", "Current Score"])
        w.writerow(["    Points Possible", "", "", "", "", "10", "(read only)"])
        for student, name, number in _people(mix):
            w.writerow([name, number, f"S{number}", JDOE if student == JDOE else f"login{number}", "Lab 1", "", ""])
        w.writerow([ROSTER_ONLY[0], ROSTER_ONLY[1], "S5555", "nnobody", "Lab 2", "", ""])
    return path


def gradescope_roster(mix: Mix, path: Path) -> Path:
    """Gradescope's roster: First Name, Last Name, SID, Email, Role."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["First Name", "Last Name", "SID", "Email", "Role"])
        for student, name, number in _people(mix):
            first, _, last = name.partition(" ")
            w.writerow([first, last, number, _email(student, number), "Student"])
        w.writerow(["Noah", "Nobody", ROSTER_ONLY[1], "nnobody@uni.example", "Student"])
    return path


def moodle_worksheet(mix: Mix, path: Path) -> Path:
    """Moodle's grading worksheet: Identifier 'Participant <the number in the zip's file names>'."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["Identifier", "Full name", "Email address", "Status", "Grade", "Maximum Grade",
                    "Grade can be changed", "Last modified (submission)", "Last modified (grade)", "Feedback comments"])
        for student, name, number in _people(mix):
            w.writerow([f"Participant {number}", name, _email(student, number), "Submitted for grading", "", "10.00",
                        "Yes", "Monday, 14 January 2030, 8:00 PM", "-", ""])
        w.writerow([f"Participant {ROSTER_ONLY[1]}", ROSTER_ONLY[0], "nnobody@uni.example", "No submission", "",
                    "10.00", "Yes", "-", "-", ""])
    return path
