"""The grader's core on small in-memory notebooks (tests/factories.py): fast, no kernel.

Rebuilding a submission from the release, splitting a hidden block into what a student's kernel runs and
what only the reference runs, decoding what a kernel sends back, judging it against the reference, and
writing a feedback page that shows nothing hidden and runs nothing.
"""

import base64
import copy
import json
import os
import subprocess
import sys
from queue import Empty

import nbformat
import pytest
import torch
from conftest import REPO
from factories import markdown, own_cell, plain_values, released
from hypothesis import given

from grader.course import assignment_named
from grader.judge import outflow, reference
from grader.judge.grading import Graded, known_mistakes, read_scenario, run_notes
from grader.judge.judge import (
    BadPayload,
    Observation,
    Opaque,
    ScenarioRecord,
    Unreadable,
    behaves_like,
    compare,
    decode_messages,
    decode_value,
    judge,
    shown_error,
)
from grader.judge.rebuild import ADDED, EARLIER_ANSWER_COPY, rebuild
from grader.judge.scenarios import split
from grader.kernel import probe
from grader.kernel.harness import DIED, Step, StepRun
from grader.report.feedback import write_feedback
from grader.results import NoteKind

# --- rebuild ----------------------------------------------------------------------------------------------

def test_rebuild_keeps_answers_and_added_cells_and_restores_the_rest():
    submitted = released()
    submitted.cells[2].source = "def f(x):\n    return 2 * x"
    submitted.cells[3].source = "print('all tests passed')"  # an edited test cell
    submitted.cells.insert(3, own_cell("scratch = 1", nbgrader="not a dict"))
    rebuilt, notes = rebuild(submitted, released())
    assert [c.source for c in rebuilt.cells] == ["import torch", "# Exercise", "def f(x):\n    return 2 * x",
                                                "scratch = 1", "assert f(1) == 2"]
    assert rebuilt.cells[3].metadata == {ADDED: True}
    assert [n.text for n in notes] == ["tampered: edited locked cell f restored"]


def test_rebuild_restores_deleted_cells_and_grades_the_last_copy_of_an_answer():
    submitted = released()
    draft, final = copy.deepcopy(submitted.cells[2]), copy.deepcopy(submitted.cells[2])
    draft.source, final.source = "def helper():\n    return 2", "def f(x):\n    return helper() * x"
    submitted.cells = [draft, final]  # a split (or copied) answer cell: both keep its metadata
    rebuilt, notes = rebuild(submitted, released())
    assert [c.source for c in rebuilt.cells] == ["def helper():\n    return 2", "import torch", "# Exercise",
                                                "def f(x):\n    return helper() * x", "assert f(1) == 2"]
    assert rebuilt.cells[0].metadata == {ADDED: True, EARLIER_ANSWER_COPY: True}  # runs whatever the budget
    assert [n.text for n in notes] == ["tampered: deleted cell setup restored", "tampered: deleted cell f restored"]
    assert {n.kind for n in notes} == {NoteKind.TAMPERED}  # a split cell's halves define different names: no note


def test_a_draft_copied_after_the_answer_is_graded_and_the_status_says_which_copy():
    submitted = released()
    draft = copy.deepcopy(submitted.cells[2])
    submitted.cells[2].source, draft.source = "def f(x):\n    return 2 * x", "def f(x):\n    return x  # try"
    submitted.cells.append(draft)  # copied to the end to try a mistake: Jupyter's copy keeps the metadata
    rebuilt, notes = rebuild(submitted, released())
    assert [c.source for c in rebuilt.cells] == ["import torch", "def f(x):\n    return 2 * x", "# Exercise",
                                                "def f(x):\n    return x  # try", "assert f(1) == 2"]
    assert rebuilt.cells[1].metadata == {ADDED: True, EARLIER_ANSWER_COPY: True}
    assert rebuilt.cells[3].metadata.nbgrader.solution
    [note] = notes
    assert note.kind == NoteKind.ANSWER_COPIED and note.kind.look_at
    assert note.text == ("answer copied: f_answer appears more than once and cells 3 and 5 of your notebook all "
                         "define `f`; the last one, cell 5, was graded, the earlier ones ran as your own cells")


@pytest.mark.parametrize("draft", ["%%time\ndef f(x):\n    return x", "for _ in range(1):\n    def f(x):\n        return x",
                                   "import torch\n!echo try\ndef f(x):\n    return x"])
def test_a_draft_under_a_magic_or_in_a_block_is_still_a_copy(draft):
    submitted = released()
    copied = copy.deepcopy(submitted.cells[2])
    submitted.cells[2].source, copied.source = "def f(x):\n    return 2 * x", draft
    submitted.cells.append(copied)
    _, notes = rebuild(submitted, released())
    assert [n.kind for n in notes] == [NoteKind.ANSWER_COPIED], draft


def test_halves_of_a_split_answer_that_both_import_torch_are_no_copy():
    submitted = released()
    second = copy.deepcopy(submitted.cells[2])
    submitted.cells[2].source = "import torch\ndef helper():\n    return 2"
    second.source = "import torch\ndef f(x):\n    return helper() * x"
    submitted.cells.insert(3, second)
    _, notes = rebuild(submitted, released())
    assert notes == []


def test_a_verbatim_copy_of_a_test_cell_is_left_out_without_a_note_an_edited_one_is_tampering():
    submitted = released()
    submitted.cells[2].source = "def f(x):\n    return 2 * x"
    again = copy.deepcopy(submitted.cells[3])
    again.source = again.source.replace("\n", "\r\n") + "\n"  # saved by another editor: still the same cell
    submitted.cells.append(again)
    rebuilt, notes = rebuild(submitted, released())
    assert notes == [] and [c.source for c in rebuilt.cells] == [c.source for c in released().cells[:2]] + [
        "def f(x):\n    return 2 * x", "assert f(1) == 2"]
    again.source = "assert f(1) == 2 or True"
    assert [n.text for n in rebuild(submitted, released())[1]] == ["tampered: duplicated cell f ignored"]


def test_unknown_grade_ids_make_one_bounded_note_and_one_that_is_not_a_string_no_crash():
    """Review round 3: 3,000 cells with 2,000-character unknown grade ids made a 6 MB status of the student's text
    ('TA NOTE: regrade approved …'); a list as grade id crashed grading (TypeError)."""
    submitted = released()
    for i in range(3000):
        cell = copy.deepcopy(submitted.cells[3])
        cell.metadata["nbgrader"]["grade_id"] = f"{i}" + "x" * 2000
        submitted.cells.append(cell)
    (note,) = rebuild(submitted, released())[1]
    assert note.text == "tampered: 3000 cells with a grade id the release does not have removed"  # no student text
    odd = released()
    odd.cells[3].metadata["nbgrader"]["grade_id"] = ["f"]
    assert [n.text for n in rebuild(odd, released())[1]] == [
        "tampered: 1 cell with a grade id the release does not have removed", "tampered: deleted cell f restored"]


def test_cells_whose_metadata_a_tool_dropped_are_matched_by_id_and_locked_ones_still_restored():
    submitted = released()
    submitted.cells[2].source = "def f(x):\n    return 2 * x"
    submitted.cells[3].source = "assert True"  # a test cell edited and stripped: still the release's
    submitted.cells.append(own_cell("scratch = f(3)"))
    for cell in submitted.cells:
        cell.metadata = {}
    rebuilt, notes = rebuild(submitted, released())
    assert [c.source for c in rebuilt.cells] == ["import torch", "# Exercise", "def f(x):\n    return 2 * x",
                                                "assert f(1) == 2", "scratch = f(3)"]
    assert [c.metadata for c in rebuilt.cells] == [c.metadata for c in released().cells] + [{ADDED: True}]
    assert [(n.kind, n.text) for n in notes] == [
        (NoteKind.TAMPERED, "tampered: edited locked cell f restored"),
        (NoteKind.METADATA_RESTORED, "metadata restored: 3 cell(s) had lost their nbgrader metadata; they were "
                                     "matched to the release by cell id")]
    assert not NoteKind.METADATA_RESTORED.look_at


# --- scenarios --------------------------------------------------------------------------------------------

HIDDEN = '''from labkit.scenario import observe, expect, oracle, uses_reference
uses_reference("g")
for n in range(2):
    with oracle():
        secret = n * 100
        expect(f"case {n}", secret)
    observe(f"case {n}", f(n))
with oracle():
    expect("extra", 1)
'''


def test_the_students_kernel_never_gets_oracle_blocks():
    student, reference, needs = split(HIDDEN)
    assert needs == ["g"]
    assert "secret" not in student and "expect" not in student and "labkit.scenario" not in student
    assert "secret = n * 100" in reference and "uses_reference" not in reference
    compile(student, "student", "exec")  # an emptied block still parses


# --- decoding ---------------------------------------------------------------------------------------------



@given(plain_values)
def test_plain_values_survive_the_trip(value):
    assert decode_value(json.loads(json.dumps(probe.encode(value)))) == value


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_tensors_survive_the_trip(dtype):
    t = (torch.arange(12).reshape(3, 4) % 3).to(dtype)
    back = decode_value(json.loads(json.dumps(probe.encode(t))))
    assert back.dtype == dtype and torch.equal(back, t)


@pytest.mark.parametrize("node", [
    {"t": "tensor", "dtype": "float32", "shape": [2], "data": base64.b64encode(b"\0" * 4).decode()},  # too short
    {"t": "tensor", "dtype": "object", "shape": [1], "data": ""},
    {"t": "int", "v": "12ab"},  # not a number (a long one is a plain wrong value: test_odd_values_get_plain_verdicts…)
    {"t": "pickle", "v": "gASVAAAAAA=="},
    {"t": "list"},
    "not a dict",
])
def test_malformed_values_are_refused(node):
    with pytest.raises(BadPayload):
        decode_value(node)


def _observed(test: str, seq: int) -> dict:
    return {"test": test, "seq": seq, "kind": "observed", "item": {"name": "x", "value": probe.encode(1.0), "spec": {}}}


def _end(test: str, seq: int) -> dict:
    return {"test": test, "seq": seq, "kind": "end", "error": None}


@pytest.mark.parametrize("payloads, why", [
    ([], Unreadable.NO_RESULT),
    ([_observed("f", 0)], Unreadable.CUT_SHORT),
    # a thread forging messages beside the test's trips whichever check its timing meets first: one kind for all
    ([_observed("f", 0), _end("f", 1), _observed("f", 2)], Unreadable.FORGED),  # after the end
    ([_observed("g", 0), _observed("f", 0), _end("f", 1)], Unreadable.FORGED),  # for another test
    ([_observed("f", 0), _observed("f", 0), _end("f", 1)], Unreadable.FORGED),  # out of order
    ([{**_observed("f", 0), "item": "x"}, _end("f", 1)], Unreadable.FORGED),  # malformed
])
def test_an_unreadable_result_is_named_by_its_kind_not_by_the_check_that_caught_it(payloads, why):
    record, failure, kind = read_scenario("f", StepRun(payloads=payloads), 60)
    assert record is None and kind == why
    assert failure == f"{why.value} (something in the notebook interferes with the tests)"


def test_a_class_the_student_named_is_never_named_back():
    class Sneaky:  # a type name is a channel: hidden-test text could be smuggled out through it
        pass

    Sneaky.__name__ = "gen = torch.Generator().manual_seed(101)"
    assert decode_value(probe.encode(Sneaky())) == Opaque("an object of another type")
    assert decode_value(probe.encode(object())) == Opaque("an object of another type")
    assert (compare(Opaque("an object of another type"), torch.zeros(2), "f", {})
            == "f should be a torch.Tensor, got an object of another type.")


def test_half_precision_hides_no_mistake_and_float32_rounding_is_forgiven():
    exact = torch.tensor([3.01, 12.01], dtype=torch.float64)
    tight = {"rtol": 1e-9, "atol": 1e-9}
    assert compare(exact.float(), exact, "f", tight) is None  # right, in float32
    assert compare((exact * 1.0008).float(), exact, "f", tight) is not None  # 0.08 % off: not rounding
    assert compare(exact.bfloat16(), exact, "f", tight) is not None  # bfloat16 rounding would hide 0.4 %
    assert compare(exact + 12345j, exact, "f", {}) == "f should be a real tensor, got a complex one."


def test_a_value_too_large_for_a_float_is_a_failed_test_with_its_digits_bounded():
    reference = record(("f on 1", 2.0, {}))
    verdict = judge("f", 2, reference, record(("f on 1", 10**350, {})))
    assert not verdict.passed and verdict.message == "f on 1: expected 2, got 1e+350."
    assert not behaves_like(record(("f on 1", 10**350, {})), record(("f on 1", 3.0, {})), reference)


# --- judging ----------------------------------------------------------------------------------------------

def record(*observed, error=None, expected=None):
    return ScenarioRecord("f", tuple(Observation(n, v, s) for n, v, s in observed), expected or {}, error)


REFERENCE = record(("f on 1", torch.tensor([2.0, 4.0]), {"factor_hints": {0.5: "the factor 2 is missing"}}),
                   ("f keeps x", True, {"message": "f changed x in place"}))


def test_a_right_answer_earns_the_points_and_a_float32_one_too():
    assert judge("f", 2, REFERENCE, record(("f on 1", torch.tensor([2.0, 4.0]), {}), ("f keeps x", True, {}))).passed
    float32 = torch.tensor([2.0, 4.0], dtype=torch.float32) + 1e-7
    reference64 = record(("f on 1", torch.tensor([2.0, 4.0], dtype=torch.float64), {"rtol": 1e-12, "atol": 0}))
    assert judge("f", 2, reference64, record(("f on 1", float32, {}))).passed


def test_the_message_names_the_mistake_and_comes_from_the_reference():
    wrong = record(("f on 1", torch.tensor([1.0, 2.0]), {"factor_hints": {0.5: "LIES"}}), ("f keeps x", True, {}))
    verdict = judge("f", 2, REFERENCE, wrong)
    assert verdict.points == 0 and "the factor 2 is missing" in verdict.message and "LIES" not in verdict.message
    moved = judge("f", 2, REFERENCE, record(("f on 1", torch.tensor([2.0, 4.0]), {}), ("f keeps x", False, {})))
    assert moved.message == "f changed x in place"


def test_a_second_bug_is_named_after_the_first_message_by_the_references_names():
    both = judge("f", 2, REFERENCE, record(("f on 1", torch.tensor([1.0, 2.0]), {}), ("f keeps x", False, {})))
    assert both.message.startswith("f on 1") and both.message.endswith(" Also failed: “f keeps x”.")
    assert ". Also failed" in both.message or "? Also failed" in both.message  # the first message ends its sentence
    many = record(*((f"f on {i}", float(i), {}) for i in range(20)))
    wrong = judge("f", 2, many, record(*((f"f on {i}", float(i) + 1, {}) for i in range(20))))
    assert wrong.message.count("“") == outflow.MAX_ALSO_FAILED and wrong.message.endswith(
        f" and {19 - outflow.MAX_ALSO_FAILED} more.")
    odd = judge("f", 2, REFERENCE, record(("f on 1", torch.tensor([1.0, 2.0]), {}), ("f keeps x", object(), {})))
    assert odd.message.endswith("Also failed: “f keeps x”.")  # a later value no comparison takes is just failed
    stopped = judge("f", 2, many, record(("f on 0", 5.0, {}), ("f on 1", 1.0, {}), ("f on 2", 7.0, {})))
    assert stopped.message.endswith("Also failed: “f on 2”.")  # the checks after the scenario stopped are not named


def test_missing_observations_say_why():
    assert "not answered yet" in judge("f", 2, REFERENCE, record(error="NotImplementedError")).message
    assert "raised an exception" in judge("f", 2, REFERENCE, record(error="MyOwnError")).message
    assert "time limit" in judge("f", 2, REFERENCE, None, "the test ran past the time limit of 5 s").message
    assert shown_error("ValueError") == "ValueError" and shown_error("Evil<b>") == "an exception"


def test_an_oracle_value_overrides_the_reference_answer():
    reference = record(("f on 1", 3.0, {}), expected={"f on 1": 2.0})
    assert judge("f", 2, reference, record(("f on 1", 2.0, {}))).passed
    assert not judge("f", 2, reference, record(("f on 1", 3.0, {}))).passed


def test_lists_and_tuples_are_interchangeable_but_lengths_are_not():
    assert compare((1.0, 2.0), [1.0, 2.0], "x", {}) is None
    assert "should have 2 items" in compare([1.0], [1.0, 2.0], "x", {})


def test_a_known_mistake_is_recognised_only_when_every_probe_agrees():
    mistake = record(("f on 1", torch.tensor([1.0, 2.0]), {}), ("f keeps x", True, {}))
    assert behaves_like(record(("f on 1", torch.tensor([1.0, 2.0]), {}), ("f keeps x", True, {})), mistake, REFERENCE)
    assert not behaves_like(record(("f on 1", torch.tensor([1.0, 2.0]), {}), ("f keeps x", False, {})), mistake, REFERENCE)
    nan = record(("f on 1", torch.tensor([float("nan"), 2.0]), {}), ("f keeps x", True, {}))
    assert behaves_like(nan, nan, REFERENCE)


# --- feedback ---------------------------------------------------------------------------------------------

def test_feedback_is_inert_and_shows_only_what_ran_before_the_tests(tmp_path):
    nb = released()
    nb.cells.insert(1, markdown("<script>alert(1)</script><img src=x onerror=alert(2)>", **{ADDED: True}))
    nb.cells.insert(2, own_cell("print('<b>mine</b>')", **{ADDED: True}))
    nb.cells.append(own_cell("print(_i)", **{ADDED: True}))
    steps = [Step("setup", "import torch", False), Step("cell 3", "print", True), Step("f_answer", "def f", True),
             Step("f", "scenario", False, test="f"), Step("cell 6", "print(_i)", True)]
    runs = [StepRun(), StepRun(outputs=[{"output_type": "stream", "name": "stdout", "text": "<b>mine</b>\n"}]),
            StepRun(), StepRun(outputs=[{"output_type": "stream", "name": "stdout", "text": "HIDDEN INPUT 42"}]),
            StepRun(outputs=[{"output_type": "stream", "name": "stdout", "text": "observe('secret case')"}])]
    from grader.judge.judge import Verdict

    graded = Graded(steps, runs, {"f": Verdict("f", 0, 2, "f on 1 is wrong <i>")})
    page_path = tmp_path / "page.html"
    write_feedback(page_path, student="<s>", assignment="a", notebook=nb, graded=graded, status=[])
    page = page_path.read_text()
    assert "<script" not in page and "onerror=" not in page.replace("onerror=alert", "")  # only as escaped text
    assert "&lt;script&gt;" in page and "&lt;b&gt;mine&lt;/b&gt;" in page
    assert "HIDDEN INPUT" not in page and "secret case" not in page
    assert "f on 1 is wrong &lt;i&gt;" in page and "Content-Security-Policy" in page


# --- running steps ------------------------------------------------------------------------------------------

class FakeKernel:
    """A kernel that takes `seconds` per step and never fails (for run_steps' bookkeeping)."""

    def __init__(self, seconds):
        self.seconds, self.ran = seconds, []

    def run(self, code, timeout, store_history=True):
        self.ran.append(code)
        return StepRun(seconds=self.seconds)

    def stop(self):
        pass


def test_slow_cells_of_the_students_own_cost_only_those_cells(monkeypatch):
    from grader.kernel import harness

    kernel = FakeKernel(seconds=50.0)
    steps = [Step(f"cell {i}", f"own {i}", True, added=True) for i in range(5)]
    steps += [Step("f_answer", "def f", True), Step("f", "scenario", False, test="f")]
    runs = harness.run_steps(steps, lambda: kernel, timeout=30)  # own cells get max(120, 4 × 30) s together
    assert [r.failure for r in runs] == ["", "", "", harness.SKIPPED, harness.SKIPPED, "", ""]
    assert kernel.ran[-2:] == ["def f", "scenario"]  # the answer and its test still ran


def test_a_kernel_that_dies_in_a_step_of_the_graders_gets_that_step_again_and_only_its_students_cells_are_dropped():
    from grader.kernel import harness

    class DiesOnce(FakeKernel):
        died: set[str] = set()

        def run(self, code, timeout, store_history=True):
            self.ran.append(code)
            if code.startswith("die") and code not in self.died:  # e.g. a hook of the student's kills it once
                self.died.add(code)
                return StepRun(failure=DIED)
            return StepRun()

    kernels: list[DiesOnce] = []

    def new_kernel():
        kernels.append(DiesOnce(0.0))
        return kernels[-1]

    steps = [Step("setup", "setup", False), Step("cell 2", "die: own", True, added=True),
             Step("f_answer", "def f", True), Step("f (probe)", "die: probe", False, history=False),
             Step("f", "scenario f", False, test="f"), Step("g", "scenario g", False, test="g")]
    runs = harness.run_steps(steps, new_kernel, timeout=30)
    assert [r.failure for r in runs] == ["", harness.DIED, "", harness.DIED, "", ""]  # no test lost
    assert kernels[1].ran == ["setup", "def f", "die: probe"]  # the student's cell that died is not replayed
    assert kernels[2].ran == ["setup", "def f", "die: probe", "scenario f", "scenario g"]  # the probe is
    notes = [note.text for note in run_notes(Graded(steps, runs, {}))]
    assert notes == ["kernel died in cell 2", "kernel died in the grader's step f (probe)"]


class DiesAlways(FakeKernel):
    """A kernel that dies in every step whose code starts with 'die'."""

    def run(self, code, timeout, store_history=True):
        self.ran.append(code)
        return StepRun(failure=DIED) if code.startswith("die") else StepRun()


def test_a_step_that_kills_every_kernel_is_dropped_from_the_replay_after_killing_it_once():
    from grader.kernel import harness

    kernels: list[DiesAlways] = []

    def new_kernel():
        kernels.append(DiesAlways(0.0))
        return kernels[-1]

    steps = [Step("setup", "setup", False), Step("f_answer", "def f", True),
             Step("f (place)", "die: place", False, history=False), Step("f (probe)", "probe", False, history=False),
             Step("f", "scenario f", False, test="f")]
    runs = harness.run_steps(steps, new_kernel, timeout=30)
    assert [r.failure for r in runs] == ["", "", harness.DIED, "", ""]
    assert [k.ran for k in kernels[1:]] == [["setup", "def f", "die: place"], ["setup", "def f", "probe", "scenario f"]]


def test_a_step_of_the_graders_that_found_no_kernel_is_replayed_when_one_starts_again():
    from grader.kernel import harness

    kernels: list[DiesAlways] = []

    def new_kernel():
        if len(kernels) == 1 and kernels[0].ran[-1] == "die: own" and not hasattr(new_kernel, "refused"):
            new_kernel.refused = True  # type: ignore[attr-defined]
            raise RuntimeError("no kernel this time")
        kernels.append(DiesAlways(0.0))
        return kernels[-1]

    steps = [Step("setup", "setup", False), Step("cell 2", "die: own", True, added=True),
             Step("f (probe)", "probe", False, history=False), Step("f", "scenario f", False, test="f")]
    runs = harness.run_steps(steps, new_kernel, timeout=30)
    assert [r.failure for r in runs] == ["", harness.DIED, harness.NOT_RUN, ""]
    assert kernels[-1].ran == ["setup", "probe", "scenario f"]


def test_cells_that_only_define_things_still_run_after_the_own_cells_budget():
    from grader.kernel import harness

    helper = "import torch\n\ndef _top(H, k: int = 1) -> float:\n    return torch.linalg.eigvalsh(H).max().item()"
    kernel = FakeKernel(seconds=25.0)
    steps = [Step(f"cell {i}", f"sleep {i}", True, added=True) for i in range(5)]  # 125 s: the budget is spent
    steps += [Step("cell 6", helper, True, added=True), Step("cell 7", "print(_top(H))", True, added=True),
              Step("cell 8", "K = 3", True, added=True), Step("cell 9", "class C:\n    n = 2", True, added=True)]
    runs = harness.run_steps(steps, lambda: kernel, timeout=30)
    assert [r.failure for r in runs] == ["", "", "", "", "", "", harness.SKIPPED, "", harness.SKIPPED]
    assert kernel.ran[5:] == [helper, "K = 3"]  # one --timeout of definitions past the budget (25 + 25 > 30)


def test_what_counts_as_only_defining_things():
    from grader.kernel.harness import defines_only
    from labkit.cells import defined_names

    for source in ("import torch\nfrom math import pi as PI", "def f(x, n=-1, *a, k: int | None = None):\n    return g()",
                   'class Net(torch.nn.Module):\n    """doc"""\n    size: int = 3\n    def forward(self, x):\n'
                   "        return x", "LR = 0.1\nSIZES = (1, 2.5, 'a')\nA, B = 1, 2", "x: 'torch.Tensor'",
                   "@torch.no_grad()\ndef f():\n    pass", "@functools.cache\ndef f():\n    pass",
                   "@dataclass(frozen=True)\nclass C:\n    x: int = 0"):
        assert defines_only(source), source
    for source in ("time.sleep(25)", "x = f()", "def f(x=g()):\n    pass", "@register(make())\ndef f():\n    pass",
                   "x = 10 ** 10 ** 10", "class C(metaclass=M):\n    pass", "class C:\n    f()", "for i in []:\n    pass",
                   "def f(:", "x = [i for i in y]"):
        assert not defines_only(source), source
    assert defined_names("import torch.nn as nn, math\nfrom a import b\ndef f(): pass\nclass C: pass\nx, (y, z) = t\n"
                         "f(1)") == ["nn", "math", "b", "f", "C", "x", "y", "z"]
    assert defined_names("def f(:") == []
    # loop and `with … as` targets bind; an attribute or an item assigned binds no name of the notebook's
    assert defined_names("for i, (j, *k) in z:\n    pass\nwith open(p) as f, g() as (a, b), h():\n    pass\n"
                         "model.w = 1\nd[key] = v\nm.layer[0].bias, n = 1, 2") == ["i", "j", "k", "f", "a", "b", "n"]
    assert defined_names('x = "a\u2028b\x0cc"\r\n%time y = 1\rz = 2') == ["x", "z"]  # inside a string: no line break


@pytest.mark.integration  # a kernel in a Python subprocess of its own
def test_a_kernel_that_dies_starting_fails_at_once_and_leaves_nothing_to_hang_on(tmp_path):
    # A kernel killed at start (a memory limit, say) once left its client's sockets open; the garbage
    # collector then blocked forever terminating their zmq context, and the whole batch with it.
    script = tmp_path / "dies.py"
    script.write_text(
        "import gc, sys\n"
        "from jupyter_client import KernelManager\n"
        "from jupyter_client.kernelspec import KernelSpec\n"
        "from grader.kernel.harness import Kernel\n"
        "manager = KernelManager()\n"
        "manager._kernel_spec = KernelSpec(argv=[sys.executable, '-c', 'raise SystemExit(3)'], language='python')\n"
        "try:\n"
        "    Kernel(manager, startup_timeout=30)\n"
        "except RuntimeError as exc:\n"
        "    print('raised:', exc)\n"
        "gc.collect()\n"
        "print('collected')\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=90, cwd=REPO)
    assert "raised: Kernel died before replying to kernel_info" in done.stdout, done.stdout + done.stderr
    assert done.stdout.rstrip().endswith("collected"), done.stdout + done.stderr


def test_a_scenario_leaves_torch_settings_as_it_found_them():
    from torch.overrides import _get_current_function_mode_stack

    modes = list(_get_current_function_mode_stack())
    with probe.course_defaults():
        assert torch.get_default_dtype() == torch.float32
    assert list(_get_current_function_mode_stack()) == modes  # no DeviceContext left behind for later cells
    torch.set_default_dtype(torch.float64)  # a student's scratch cell
    try:
        with probe.course_defaults():
            assert torch.get_default_dtype() == torch.float32 and torch.ones(1).dtype == torch.float32
        assert torch.get_default_dtype() == torch.float64
    finally:
        torch.set_default_dtype(torch.float32)


# --- editors, switches, places ------------------------------------------------------------------------------

def test_locked_cells_saved_by_other_editors_are_not_tampering():
    for edit in (lambda s: s.replace("\n", "\r\n"), lambda s: s + "\n", lambda s: s.replace("\n", "\r"),
                 lambda s: "\ufeff" + s + "  \n\n", lambda s: s.splitlines(keepends=True)):
        submitted = released()
        submitted.cells[2].source = "def f(x):\r\n    return 2 * x\r\n"
        for cell in submitted.cells:
            if cell.metadata.get("nbgrader", {}).get("locked"):
                cell.source = edit(cell.source + "\n# a second line")
        theirs = released()
        for cell, mine in zip(theirs.cells, submitted.cells):
            cell.source = mine.source
        rebuilt, notes = rebuild(submitted, released_with_second_lines())
        assert notes == [], edit
        assert rebuilt.cells[2].source == "def f(x):\n    return 2 * x\n"


def released_with_second_lines():
    nb = released()
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("locked"):
            cell.source += "\n# a second line"
    return nb


# Each global switch a scratch cell can flip, flipped as a student would (OMP_NUM_THREADS=2 in these tests).
FLIPS = {
    "default dtype": lambda: torch.set_default_dtype(torch.float64),
    "default device": lambda: torch.set_default_device("meta"),
    "grad mode": lambda: torch.set_grad_enabled(False),
    "anomaly mode": lambda: torch.set_anomaly_enabled(True, check_nan=False),
    "flush denormal": lambda: torch.set_flush_denormal(True),
    "float32 matmul precision": lambda: torch.set_float32_matmul_precision("medium"),
    "deterministic algorithms": lambda: torch.use_deterministic_algorithms(True, warn_only=True),
    "cpu autocast": lambda: torch.set_autocast_enabled("cpu", True),
    "threads": lambda: torch.set_num_threads(1),
    "global random state": lambda: torch.manual_seed(1234),
    "inference mode": lambda: INFERENCE.__enter__(),
}
INFERENCE = torch.inference_mode()


def fresh_state():
    """What a scenario computes with; the same in a fresh kernel."""
    return (torch.get_default_dtype(), torch.ones(1).device.type, torch.is_grad_enabled(), torch.is_anomaly_enabled(),
            float((torch.full((1,), 2.0 ** -140) * torch.ones(1)).item()) > 0, torch.get_float32_matmul_precision(),
            torch.are_deterministic_algorithms_enabled(), torch.is_autocast_enabled("cpu"), torch.get_num_threads(),
            float(torch.rand(1)), torch.is_inference_mode_enabled())


@pytest.mark.parametrize("switch", FLIPS, ids=list(FLIPS))
def test_a_scenario_computes_with_every_switch_as_fresh_and_puts_the_students_back(switch, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    with probe.course_defaults():
        fresh = fresh_state()
    assert fresh[:-3] == (torch.float32, "cpu", True, False, True, "highest", False, False) and fresh[-3] == 2
    try:
        FLIPS[switch]()
        flipped = fresh_state() if switch != "default device" else None
        with probe.course_defaults():
            assert fresh_state() == fresh
        assert switch == "default device" or fresh_state()[:-2] == flipped[:-2]  # the student's settings are back
    finally:
        torch.set_default_dtype(torch.float32)
        torch.set_default_device(None)
        torch.set_grad_enabled(True)
        torch.set_anomaly_enabled(False)
        torch.set_flush_denormal(False)
        torch.set_float32_matmul_precision("highest")
        torch.use_deterministic_algorithms(False)
        torch.set_autocast_enabled("cpu", False)
        torch.set_num_threads(threads)
        if switch == "inference mode":
            INFERENCE.__exit__(None, None, None)
    assert not torch.is_inference_mode_enabled()


def test_a_test_given_another_exercises_reference_runs_after_that_exercises_own_test():
    from grader.judge.scenarios import Scenario, _dependencies_first

    def scenario(test):
        return Scenario(test, 1.0, "", "", (), "", ())

    found = [scenario("uses_g"), scenario("f"), scenario("g"), scenario("uses_f_and_uses_g")]
    after = {"uses_g": {"g"}, "f": set(), "g": set(), "uses_f_and_uses_g": {"f", "uses_g"}}
    assert [s.test for s in _dependencies_first(found, after)] == ["f", "g", "uses_g", "uses_f_and_uses_g"]
    with pytest.raises(ValueError, match="circle"):
        _dependencies_first([scenario("a"), scenario("b")], {"a": {"b"}, "b": {"a"}})


def test_a_scenario_sees_the_names_folder_and_environment_of_its_place(tmp_path, monkeypatch):
    monkeypatch.setenv("TML_PLACE", "at the test")
    namespace = {"helper": "at the test"}
    place = (dict(namespace), str(tmp_path), dict(os.environ))
    namespace["helper"] = "redefined below"
    monkeypatch.setenv("TML_PLACE", "changed below")
    here = os.getcwd()
    with probe._place(namespace, place):
        assert namespace["helper"] == "at the test" and os.environ["TML_PLACE"] == "at the test"
        assert os.getcwd() == str(tmp_path)
    assert namespace["helper"] == "redefined below" and os.environ["TML_PLACE"] == "changed below"
    assert os.getcwd() == here


class StartingClient:
    """A kernel client whose kernel answers kernel_info late: each reply answers the request before the last."""

    def __init__(self, idle_lost_for=()):
        self.sent, self.replies, self.iopub = [], [], []
        self.idle_lost_for = set(idle_lost_for)  # requests whose idle went out before iopub was subscribed

    def kernel_info(self):
        self.sent.append(f"request-{len(self.sent)}")
        if len(self.sent) >= 2:  # the kernel listens from the second request on and answers the first
            answered = self.sent[len(self.sent) - 2]
            self.replies.append({"msg_type": "kernel_info_reply", "parent_header": {"msg_id": answered}})
            if answered not in self.idle_lost_for:
                self.iopub.append({"msg_type": "status", "parent_header": {"msg_id": answered},
                                   "content": {"execution_state": "idle"}})
        return self.sent[-1]

    def get_shell_msg(self, timeout=None):
        if not self.replies:
            raise Empty
        return self.replies.pop(0)

    def get_iopub_msg(self, timeout=None):
        if not self.iopub:
            raise Empty
        return self.iopub.pop(0)


def _starting_kernel(client, alive=True):
    from grader.kernel.harness import Kernel

    kernel = Kernel.__new__(Kernel)  # no manager, no process: only the readiness handshake
    kernel.client = client
    kernel.alive = lambda: alive
    return kernel


def test_a_kernel_is_ready_when_a_reply_and_its_own_idle_arrived_even_if_it_answers_an_older_request():
    client = StartingClient()
    _starting_kernel(client)._wait_until_ready(timeout=30)
    assert client.sent == ["request-0", "request-1"]  # the reply to request-0 came after request-1 was sent


def test_a_reply_whose_idle_iopub_missed_is_asked_again():
    client = StartingClient(idle_lost_for={"request-0"})
    _starting_kernel(client)._wait_until_ready(timeout=30)
    assert len(client.sent) == 3


def test_a_kernel_that_never_answers_is_dead_or_late():
    with pytest.raises(RuntimeError, match="Kernel died before replying to kernel_info"):
        _starting_kernel(StartingClient(idle_lost_for={f"request-{i}" for i in range(9)}), alive=False)._wait_until_ready(30)


@pytest.mark.integration  # grades notebook 01 in a kernel
def test_a_helper_skipped_by_the_own_cells_budget_is_named_in_the_hint(monkeypatch):
    from grader.author.mutants import reference_submission
    from grader.course import assignment_named
    from grader.judge.grading import grade_notebook, plain_kernel_factory, reference_records, run_notes
    from grader.kernel import harness

    monkeypatch.setattr(harness, "own_cells_budget", lambda timeout: 0.5)
    one = assignment_named("01_gradient_descent")
    nb, _ = rebuild(reference_submission(one), nbformat.read(one.release, as_version=4))
    at = next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == "mse_grad_answer")
    helper = "import time\ntime.sleep(0)\n\ndef _residual(w, X, y):\n    return X @ w - y"  # a call: not definitions only
    nb.cells[at].source = "def mse_grad(w, X, y):\n    return 2.0 / X.shape[0] * X.T @ _residual(w, X, y)"
    nb.cells[at:at] = [own_cell("import time\ntime.sleep(0.6)", **{ADDED: True}), own_cell(helper, **{ADDED: True})]
    graded = grade_notebook(nb, one, plain_kernel_factory(), 30, reference_records(one, plain_kernel_factory(), 120))
    message = graded.verdicts["mse_grad"].message
    assert "NameError" in message and f"cell {at + 2} (defines `time`, `_residual`)" in message, message
    assert "budget of 0.5 s" in message and graded.verdicts["critical_lr"].passed
    assert [n.kind for n in run_notes(graded)] == [NoteKind.SKIPPED]


def test_a_huge_cell_costs_the_graders_own_process_no_syntax_tree():
    import tracemalloc

    from grader.kernel import harness
    from grader.report import similarity
    from labkit import cells

    huge = "def helper():\n    return 1\n" * 200_000  # 5.6 MB: its syntax tree would take gigabytes
    tracemalloc.start()
    try:
        assert not harness.defines_only(huge) and cells.defined_names(huge) == []
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20, f"{peak / 2**20:.0f} MiB to look at one cell"
    # Its tokens, for the similarity report, come from its first 256 KiB only (outside tracemalloc, which makes the
    # tokenizer ten times slower): a bounded count of tokens bounds their memory.
    assert len(similarity.tokens(huge)) < 200_000
    assert harness.defines_only("def helper():\n    return 1\n")  # an ordinary cell is still read


def test_the_first_half_of_a_split_answer_runs_whatever_the_own_cells_budget():
    from grader.author.mutants import reference_submission
    from grader.course import assignment_named
    from grader.judge.grading import plan

    one = assignment_named("01_gradient_descent")
    submitted = reference_submission(one)
    at = next(i for i, c in enumerate(submitted.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == "mse_grad_answer")
    first_half = copy.deepcopy(submitted.cells[at])
    first_half.source = "def _residual(w, X, y):\n    return X @ w - y"
    submitted.cells.insert(at, first_half)  # the answer split in two: both halves keep the answer's metadata
    submitted.cells.insert(at, own_cell("scratch = 1"))
    rebuilt, _ = rebuild(submitted, nbformat.read(one.release, as_version=4))
    steps = {step.code: step for step in plan(rebuilt, one)}
    assert steps["scratch = 1"].added and not steps[first_half.source].added  # only the scratch cell is budgeted
    # Review round 3: eight earlier copies all ran outside the budget (each up to --timeout); only the last two do.
    for i in range(8):
        older = copy.deepcopy(submitted.cells[at + 1])
        older.source = f"def _older_{i}():\n    return {i}"
        submitted.cells.insert(at, older)
    rebuilt, _ = rebuild(submitted, nbformat.read(one.release, as_version=4))
    budgeted = [step.added for step in plan(rebuilt, one) if step.code.startswith(("def _older_", "def _residual"))]
    assert budgeted == [True] * 7 + [False, False]


def test_known_mistakes_are_not_kept_when_no_kernel_could_run_them(tmp_path, monkeypatch):
    """A recording cut short (the batch stopping, a fork server gone) is not cached for the version: the next run
    records again instead of naming no mistake for good."""
    monkeypatch.setattr(reference, "REFERENCE_CACHE", tmp_path)

    def no_kernel():
        raise RuntimeError("the fork server is gone")

    assert known_mistakes(assignment_named("01"), no_kernel, 30) == {}
    assert [p.name for p in tmp_path.iterdir() if p.suffix != ".lock"] == []  # the recorders' lock only


def test_torchs_version_is_read_without_importing_it_even_without_its_metadata(monkeypatch):
    """The records' cache key names torch's version; a torch installed without dist-info still has one."""
    from importlib import metadata

    assert reference.torch_version() == metadata.version("torch")
    installed = metadata.version

    def no_torch_metadata(name: str) -> str:
        if name == "torch":
            raise metadata.PackageNotFoundError(name)
        return installed(name)

    monkeypatch.setattr(metadata, "version", no_torch_metadata)
    assert torch.__version__ in reference.torch_version()


def test_a_scenario_says_when_a_launch_of_ranks_inside_it_ran_out_of_time(monkeypatch):
    from labkit import launch

    published: list = []
    monkeypatch.setattr(probe, "publish", lambda message: published.append(json.loads(json.dumps(message))))
    before = probe._launches_timed_out()
    launch.finish("2 ranks", -9, "", False, 1.0, ["ranks"], check=False, timeout=20)
    probe.Recorder("f").end(None, probe._launches_timed_out() > before)
    launch.finish("2 ranks", -9, "", True, 20.0, ["ranks"], check=False, timeout=20)
    probe.Recorder("f").end(None, probe._launches_timed_out() > before)
    assert [decode_messages([m], "f").ran_out_of_time for m in published] == [False, True]
    with pytest.raises(BadPayload):
        decode_messages([{**published[1], "ran_out_of_time": "yes"}], "f")


def _scenario_runs(steps, late: bool) -> list[StepRun]:
    """What harness.run_steps returns when every scenario observes one number; `late`: a launch inside ran out of time."""
    return [StepRun(payloads=[{"test": s.test, "seq": 0, "kind": "observed",
                               "item": {"name": "x", "value": probe.encode(1.0), "spec": {}}},
                              {"test": s.test, "seq": 1, "kind": "end", "error": None, "ran_out_of_time": late}]
                    if s.test else []) for s in steps]


@pytest.mark.parametrize("late_runs", [1, 2], ids=["in time when recorded again", "late again"])
def test_a_known_mistake_cut_short_by_a_time_limit_is_recorded_again_alone(tmp_path, monkeypatch, late_runs):
    """On a busy machine a launch of ranks can hit its time limit in a mutant's test (CI once recorded a mistake of
    07 that way, and then never named it): that group is recorded once more; what is still late serves this run
    but is not cached for the version."""
    from grader.judge import grading

    monkeypatch.setattr(reference, "REFERENCE_CACHE", tmp_path)
    calls: list[list[Step]] = []

    def run_steps(steps, new_kernel, timeout):
        calls.append(steps)
        return _scenario_runs(steps, late=steps == calls[0] and calls.count(steps) <= late_runs)

    monkeypatch.setattr(grading.harness, "run_steps", run_steps)
    one = assignment_named("01")
    mistakes = known_mistakes(one, lambda: None, 30, jobs=1)
    groups = grading.pack_mutants(grading.load_mutants(one))
    assert len(calls) == len(groups) + 1 and calls[-1] == calls[0]
    assert sum(len(by_name) for by_name in mistakes.values()) == sum(len(group) for group in groups)
    late = [name for by_name in mistakes.values() for name, record in by_name.items() if record.ran_out_of_time]
    assert late == ([] if late_runs == 1 else [m.name for m in groups[0]])
    assert bool(list(tmp_path.rglob("*.json"))) == (late_runs == 1)


def test_a_reference_run_a_time_limit_stopped_is_run_once_more(tmp_path, monkeypatch):
    from grader.judge import grading

    monkeypatch.setattr(reference, "REFERENCE_CACHE", tmp_path)
    outcomes = iter([True, False, True, True])  # late, then in time; then late twice

    def run_steps(steps, new_kernel, timeout):
        return _scenario_runs(steps, late=next(outcomes))

    monkeypatch.setattr(grading.harness, "run_steps", run_steps)
    assert grading.reference_records(assignment_named("01"), lambda: None, 30)
    assert list(tmp_path.rglob("*.json"))
    monkeypatch.setattr(reference, "REFERENCE_CACHE", tmp_path / "again")
    with pytest.raises(grading.RanOutOfTime):
        grading.reference_records(assignment_named("01"), lambda: None, 30)
    assert not list((tmp_path / "again").rglob("*.json"))
