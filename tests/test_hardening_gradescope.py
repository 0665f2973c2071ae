"""Issue 36 item 4: Gradescope's `user` mode (kernels as tml-student, where the sandbox cannot be built).

The kernel's environment is the sandbox's, nothing of run_autograder's; no process of the student's user outlives
run_autograder; the canary and the set-up cells have time limits of their own, so a slow host under the zip's short
--timeout still grades (a test that runs out of time says so in the hand-in's status) instead of exiting 4.
"""

import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import nbformat
import pytest
from test_gradescope import ONE, hand_in, unused_uid
from unix_users import in_child

from grader.judge import grading
from grader.kernel import harness, sandbox
from grader.kernel.harness import Step, StepRun
from grader.platforms import gradescope
from grader.results import Result

A = gradescope.assignment_named(ONE)


@pytest.mark.integration  # forks a child that becomes the student
def test_the_kernels_environment_is_the_sandboxs_not_run_autograders(tmp_path, monkeypatch):
    from grader.platforms.student_kernel import become_student

    uid = unused_uid()
    kernel = Path(tempfile.mkdtemp(prefix="kernel-"))
    (kernel / "connection.json").write_text("{}")

    def student_s_environment() -> dict:
        os.environ.update(TML_STUDENT_UID=str(uid), GRADESCOPE_API_TOKEN="an instructor's secret")
        become_student(str(kernel / "connection.json"), sandbox.kernel_env())
        return dict(os.environ)

    found = in_child(student_s_environment)
    shutil.rmtree(kernel)
    assert found == {**sandbox.kernel_env(), "HOME": str(kernel), "USER": "tml-student", "LOGNAME": "tml-student",
                     "MPLCONFIGDIR": str(kernel / ".matplotlib")}


def _processes_of(uid: int) -> list[int]:
    alive = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        if f"\nUid:\t{uid}\t" in status and "State:\tZ" not in status:
            alive.append(int(pid))
    return alive


@pytest.mark.integration  # forks a daemon that runs as the student
def test_no_process_of_the_students_user_outlives_run_autograder(tmp_path, monkeypatch):
    import grader.batch.autograde

    uid = unused_uid()

    def autograde_that_leaves_a_daemon(*_, **__):
        """What a kernel can do: start a daemon in a session of its own, which outlives the kernel."""
        child = os.fork()
        if child == 0:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            if os.fork() == 0:
                os.setsid()
                os.execvp("sleep", ["sleep", "300"])
            os._exit(0)
        os.waitpid(child, 0)
        return [Result("submission", ONE, {}, A.grade_cells())]

    monkeypatch.setattr(grader.batch.autograde, "autograde", autograde_that_leaves_a_daemon)
    monkeypatch.setattr(gradescope, "_settings", lambda: {"assignments": [ONE], "feedback": "at-once", "timeout": 10})
    for name, value in (("TML_GRADESCOPE_ISOLATION", "user"), ("TML_STUDENT_UID", str(uid)), ("JUPYTER_PATH", ""),
                        (gradescope.NETWORK_ENV, "")):
        monkeypatch.setenv(name, value)
    hand_in(tmp_path / "submission", {f"{ONE}.ipynb": nbformat.read(A.release, as_version=4)})
    try:
        assert gradescope.grade(tmp_path)["score"] == 0
        time.sleep(0.1)
        assert _processes_of(uid) == []
    finally:
        for pid in _processes_of(uid):
            os.kill(pid, signal.SIGKILL)


class Timed:
    """A kernel that records the time limit each step is run under."""

    def __init__(self, limits: list[float]) -> None:
        self.limits = limits

    def run(self, code, timeout, store_history=True):
        self.limits.append(timeout)
        return StepRun()

    def stop(self):
        pass


def test_set_up_before_the_students_first_cell_has_a_time_limit_of_its_own():
    """After the student's first cell, a step of the grader's can run student code (builtins it patched): the
    per-cell limit holds there."""
    limits: list[float] = []
    steps = [Step("setup", "import torch", by_student=False), Step("setup (names)", "", by_student=False, history=False),
             Step("mse_grad_answer", "def f(): pass", by_student=True), Step("setup_2", "X = 1", by_student=False),
             Step("mse_grad (place)", "", by_student=False, history=False),
             Step("mse_grad", "observe()", by_student=False, test="mse_grad")]
    harness.run_steps(steps, lambda: Timed(limits), 10)
    assert limits == [harness.SETUP_TIMEOUT_S, harness.SETUP_TIMEOUT_S, 10, 10, 10, 10]
    limits.clear()
    harness.run_steps(steps, lambda: Timed(limits), 600)
    assert limits == [600] * 6


def test_the_canary_runs_under_a_time_limit_of_its_own(monkeypatch):
    seen = []

    def grade_notebook(nb, assignment, new_kernel, timeout, records):
        seen.append(timeout)
        return grading.Graded([], [], {})

    monkeypatch.setattr(grading, "grade_notebook", grade_notebook)
    assert grading.canary(A, lambda: None, 10, {}, nbformat.read(A.release, as_version=4)) == ""
    assert seen == [grading.CANARY_TIMEOUT_S]
