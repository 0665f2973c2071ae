"""Issue 36 item 5: nothing a kernel sends or a notebook holds crashes grading.

Fast: the harness reads malformed IOPub messages (a `display_data` whose data is a string, a `stream` whose text is a
list) as no output, and keeps the well-formed ones of the same cell; a rebuilt hand-in holds only strings UTF-8 can
encode. Integration: notebook 01 with such messages sent from the student's own cell, half an emoji in an answer's
comment and in a markdown cell, NUL and RTL marks, graded in a kernel: full marks, no internal error.
"""

import json

import nbformat
import pytest
from factories import markdown, own_cell

from grader.author.mutants import reference_submission
from grader.course import assignment_named
from grader.judge.rebuild import rebuild
from grader.kernel import harness, probe

ONE = assignment_named("01_gradient_descent")
HALF_AN_EMOJI = "\ud83d"  # "😀" cut in half: JSON and Python hold it, UTF-8 cannot encode it
ODD = f"{HALF_AN_EMOJI} NUL \x00 RTL \u202e\u200f marks"
SHOWN = "\ufffd NUL \ufffd RTL \u202e\u200f marks"  # ODD as graded and shown: every RTL mark kept


class Replying:
    """A kernel client whose iopub brings `contents` (message type, content) for the request, then its idle."""

    def __init__(self, contents):
        self.contents = contents
        self.iopub: list[dict] = []

    def execute(self, code, **_):
        header = {"msg_id": "request"}
        self.iopub = [{"msg_type": kind, "parent_header": header, "content": content} for kind, content in self.contents]
        self.iopub.append({"msg_type": "status", "parent_header": header, "content": {"execution_state": "idle"}})
        return "request"

    def get_iopub_msg(self, timeout=None):
        return self.iopub.pop(0)


def _run(contents) -> harness.StepRun:
    kernel = harness.Kernel.__new__(harness.Kernel)  # no manager, no process: only the reading of messages
    kernel.client = Replying(contents)
    kernel.alive = lambda: True
    return kernel.run("", timeout=30)


MALFORMED = [
    ("display_data", {"data": "a string", "metadata": {}}),
    ("stream", {"name": "stdout", "text": ["a", 1]}),
    ("stream", {"name": ["stdout"], "text": "x"}),
    ("execute_result", {"data": {"text/plain": 3}, "metadata": {}, "execution_count": 1}),
    ("display_data", {"data": {"text/html": {"not": "text"}}}),
    ("error", {"ename": ["E"], "evalue": "", "traceback": []}),
    ("error", {"ename": "E", "evalue": "", "traceback": "not a list"}),
]


@pytest.mark.parametrize("kind, content", MALFORMED, ids=[f"{k}-{i}" for i, (k, _) in enumerate(MALFORMED)])
def test_a_malformed_message_is_no_output_and_costs_nothing_else(kind, content):
    run = _run([("stream", {"name": "stdout", "text": "before\n"}), (kind, content),
                ("stream", {"name": "stdout", "text": ["after", "\n"]})])
    assert run.outputs == [{"output_type": "stream", "name": "stdout", "text": "before\n"},
                           {"output_type": "stream", "name": "stdout", "text": "after\n"}]
    assert not run.failure and run.error is None
    nbformat.validate(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(outputs=run.outputs)]))


def test_a_message_nested_deeper_than_the_grader_walks_is_no_output():
    deep: list = []
    for _ in range(5000):
        deep = [deep]
    run = _run([("display_data", {"data": {"application/json": deep}}), ("stream", {"name": "stdout", "text": "x"})])
    assert run.outputs == [{"output_type": "stream", "name": "stdout", "text": "x"}]


def test_well_formed_outputs_are_kept_as_nbformat_outputs_with_every_string_encodable():
    run = _run([("display_data", {"data": {"text/plain": ["a", ODD], "application/json": {"k": [ODD]}}}),
                ("error", {"ename": "ValueError", "evalue": ODD, "traceback": [ODD]}),
                ("display_data", {"data": {probe.MIME: {"test": "t", "seq": 0}}})])
    text = json.dumps(run.outputs, ensure_ascii=False)
    text.encode("utf-8")
    assert run.outputs[0]["data"]["text/plain"] == f"a{SHOWN}" and run.error == "ValueError"
    assert run.payloads == [{"test": "t", "seq": 0}]
    nbformat.validate(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(outputs=run.outputs)]))


def _odd_hand_in() -> nbformat.NotebookNode:
    """The reference answers with half an emoji, NUL and RTL marks in an answer's comment and in a markdown cell,
    and a cell of the student's own that sends malformed messages."""
    nb = reference_submission(ONE)
    at = next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == "mse_grad_answer")
    nb.cells[at].source += f"\n# {ODD}\n"
    send = "".join(f"k.session.send(k.iopub_socket, {kind!r}, {content!r}, parent=k.get_parent())\n"
                   for kind, content in MALFORMED)
    nb.cells[at + 1:at + 1] = [markdown(f"my notes {ODD}"),
                               own_cell(f"k = get_ipython().kernel\n{send}print('sent {HALF_AN_EMOJI}')")]
    return nb


class Sending:
    """A kernel each of whose steps sends `chars` characters of scenario payload (as Kernel.run reports them)."""

    def __init__(self, chars):
        self.chars = chars

    def run(self, code, timeout, store_history=True):
        return harness.StepRun(payloads=[{"kind": "observed"}], payload_chars=self.chars)

    def stop(self):
        pass


def test_payloads_are_kept_only_from_scenarios_and_bounded_for_the_notebook():
    """Review round 3: payload messages sent from the student's own cells (or many copies of an answer) were all kept,
    parsed, in the grader's memory; now only a test step's are read, and all of them together are bounded."""
    own = [harness.Step(f"cell {i}", "display(...)", True, added=True) for i in range(50)]
    tests = [harness.Step(f"t{i}", "scenario", False, test=f"t{i}") for i in range(6)]
    per_test = harness.MAX_TOTAL_PAYLOAD_CHARS // 4 + 1  # the fourth test goes past the notebook's bound
    runs = harness.run_steps(own + tests, lambda: Sending(per_test), timeout=30)
    assert all(not run.payloads for run in runs[:50])
    assert [bool(run.payloads) for run in runs[50:]] == [True, True, True, False, False, False]
    assert [run.failure for run in runs[50:]] == ["", "", "", *[harness.OUTPUT_LIMIT] * 3]


def test_a_forged_value_decoding_cannot_raise_is_read_as_forged():
    """Review round 3: a forged message whose spec or value made decoding raise ValueError, OverflowError or
    TypeError took the whole notebook down (the exception's name in the status column)."""
    from grader.judge.judge import BadPayload, Unreadable, decode_messages

    for hints in ([[1, 2, 3]], [[10**400, "x"]], [5]):
        item = {"name": "x", "value": {"t": "none"}, "spec": {"factor_hints": hints}}
        forged = [{"test": "mse_grad", "seq": 0, "kind": "observed", "item": item},
                  {"test": "mse_grad", "seq": 1, "kind": "end"}]
        with pytest.raises(BadPayload) as bad:
            decode_messages(forged, "mse_grad")
        assert bad.value.why == Unreadable.FORGED


def test_a_rebuilt_hand_in_holds_only_strings_utf8_can_encode():
    rebuilt, notes = rebuild(_odd_hand_in(), nbformat.read(ONE.release, as_version=4))
    nbformat.writes(rebuilt).encode("utf-8")
    assert not notes and any(f"# {SHOWN}" in c.source for c in rebuilt.cells)
    assert any(c.cell_type == "markdown" and c.source == f"my notes {SHOWN}"
               for c in rebuilt.cells)


@pytest.mark.integration  # grades notebook 01 in a kernel
def test_odd_strings_and_malformed_messages_from_the_students_cell_keep_full_marks():
    from grader.judge.grading import grade_notebook, plain_kernel_factory, reference_records, run_notes

    rebuilt, _ = rebuild(_odd_hand_in(), nbformat.read(ONE.release, as_version=4))
    graded = grade_notebook(rebuilt, ONE, plain_kernel_factory(), 30, reference_records(ONE, plain_kernel_factory(), 120))
    assert all(v.passed for v in graded.verdicts.values()), [v.message for v in graded.verdicts.values()]
    assert run_notes(graded) == []
    own = next(run for step, run in zip(graded.steps, graded.runs) if "k.session.send" in step.code)
    assert own.outputs == [{"output_type": "stream", "name": "stdout", "text": "sent \ufffd\n"}]
