"""Issue 36 item 6: an observation counts only when the scenario's own code object made it, in the reference's order.

The student's code runs inside the scenario (it is what the scenario calls), so it can find `observe` through frames,
compile code under the scenario's file name, or run the scenario's own code object again. Each is `interference`:
the probe sends nothing for a caller that is not one of the scenario's code objects (and says it was meddled with),
and the judge refuses observations that repeat or come before one the reference made first.
"""

import json

import pytest

from grader.judge.judge import decode_messages, out_of_order
from grader.kernel import probe

SCENARIO = """\
got = f(2.0)
observe('f on 2', got)
observe('f leaves its input alone', True)
"""
HONEST = "def f(x):\n    return 2 * x\n"
FORGERS = {  # the student's code, and what the scenario may send with it
    # observe found through frames, called from code compiled under the scenario's own file name
    "same file name": ("import sys\n"
                      "def f(x):\n"
                      "    sys._getframe(1).f_globals['observe']('f leaves its input alone', True)\n"
                      "    raise ValueError\n", []),
    # the same, from a function whose text is the scenario's own line
    "same text": ("import sys\n"
                 "def f(x):\n"
                 "    observe = sys._getframe(1).f_globals['observe']\n"
                 "    exec(compile(\"observe('f on 2', 4.0)\", '<hidden test f>', 'exec'), {'observe': observe})\n"
                 "    return 0.0\n", [("f on 2", 0.0), ("f leaves its input alone", True)]),
}
# the scenario's own code object, run again from inside the call with the right answer in place of the student's
RERUN = ("import sys\n"
         "def f(x):\n"
         "    frame = sys._getframe(1)\n"
         "    if frame.f_globals.get('f') is f:\n"
         "        exec(frame.f_code, {**frame.f_globals, 'f': lambda x: 2 * x})\n"
         "    return 0.0\n")


def scenario_run(student: str, monkeypatch) -> list[dict]:
    """The messages the scenario of test `f` sends with `student` as the answer cell (probe._scenario, in process;
    the student's code compiled under the scenario's file name, as a forger would)."""
    published: list[dict] = []
    monkeypatch.setattr(probe, "publish", lambda message: published.append(json.loads(json.dumps(message))))
    recorder = probe.Recorder("f")
    user_ns: dict = {}
    exec(compile(student, recorder.source, "exec"), user_ns)
    error = None
    try:
        probe._scenario(user_ns, "f", SCENARIO, ("f",), "", (), recorder)
    except Exception as exc:
        error = type(exc).__name__
    recorder.end(error)
    return published


def test_an_honest_answer_is_sent_unmeddled(monkeypatch):
    record = decode_messages(scenario_run(HONEST, monkeypatch), "f")
    assert not record.meddled and [(o.name, o.value) for o in record.observed] == [("f on 2", 4.0),
                                                                                   ("f leaves its input alone", True)]


@pytest.mark.parametrize("forger", FORGERS)
def test_an_observation_from_code_that_is_not_the_scenarios_is_not_sent_and_says_meddled(monkeypatch, forger):
    student, real = FORGERS[forger]
    record = decode_messages(scenario_run(student, monkeypatch), "f")
    assert record.meddled and [(o.name, o.value) for o in record.observed] == real


def test_the_scenarios_own_code_run_again_is_out_of_order(monkeypatch):
    reference = decode_messages(scenario_run(HONEST, monkeypatch), "f")
    rerun = decode_messages(scenario_run(RERUN, monkeypatch), "f")
    assert [o.name for o in rerun.observed][:2] == ["f on 2", "f leaves its input alone"]  # the right value, first
    assert out_of_order(rerun, reference)


def _record(*names: str):
    messages = [{"test": "f", "seq": i, "kind": "observed", "item": {"name": n, "value": probe.encode(1), "spec": {}}}
                for i, n in enumerate(names)]
    return decode_messages([*messages, {"test": "f", "seq": len(names), "kind": "end", "error": None}], "f")


@pytest.mark.parametrize("names, forged", [
    (("a", "b", "c"), False),
    (("a",), False),  # stopped early
    (("a", "c"), False),  # a branch skipped one
    (("a", "extra", "b", "c"), False),  # one the reference never made: judged as nothing
    (("b", "a", "c"), True),  # b before a: a forged b came first
    (("a", "a", "b", "c"), True),  # a twice
    (("a", "c", "b"), True),
])
def test_only_the_references_order_with_some_left_out_is_not_forged(names, forged):
    assert out_of_order(_record(*names), _record("a", "b", "c")) is forged
