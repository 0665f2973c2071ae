"""The outflow rule: once the first hidden scenario starts, nothing the kernel produces reaches a page, a file or a
column but the trusted verdict — and the channel that verdict leaves open is measured.

A hostile class of notebook-01 hand-ins captures what the hidden tests run (IPython hooks, sys.settrace, audit
hooks) — the scenarios' source and the reference mse_grad that `uses_reference` sends for gradient_descent's
test — and tries every way out: prints and displays after the tests, exception names, returned strings, timing,
files, the kernel's own stdout and stderr, rewriting an earlier observation, forging one. Each hand-in has a
correct mse_grad of its own (einsum), so a reference mse_grad line anywhere in the output is a leak. The same
rules on in-memory records (fast): the message stream, the recorder, the messages a verdict may say.
"""

import copy
import html
import json
import re

import nbformat
import pytest
import torch
from conftest import REPO, autograde, read_rows, shown_lines

from grader.author.check import secret_lines
from grader.author.selftest import Expected, mismatches, put
from grader.course import assignment_named
from grader.judge import outflow
from grader.judge.grading import known_mistakes, plain_kernel_factory, reference_records
from grader.judge.judge import BadPayload, Opaque, compare, decode_messages, judge, out_of_order, vocabulary
from grader.judge.reference import reference_answers, reference_submission
from grader.kernel import harness, probe
from grader.kernel.harness import StepRun
from grader.results import NoteKind
from labkit import cells

ONE = "01_gradient_descent"
A = assignment_named(ONE)
FULL = A.grade_cells()
MARK = "LEAK:"  # what every attack prefixes to what it smuggles; its source spells it "LE" + "AK:"
EINSUM = ("def mse_grad(w, X, y):\n    r = torch.einsum('nd,d->n', X, w) - y\n"
          "    return 2 * torch.einsum('nd,n->d', X, r) / X.shape[0]\n")


def leak_helper(out, cls) -> str:
    """A cell of the student's own: `_seen` collects what was captured, `_leak(data)` tries every way out."""
    paths = ["~/leak.txt", "/tmp/leak.txt", "leak.txt", f"{out}/leak.txt", f"{cls}/leak.txt", f"{REPO}/leak.txt"]
    return (
        "import os, sys, time, torch\n_seen = []\n_MARK = 'LE' + 'AK:'\n"
        "def _leak(data):\n"
        "    text = _MARK + repr(data)[:4000]\n"
        "    print(text)\n    sys.stderr.write(text)\n"
        "    for fd in (1, 2):\n"
        "        try:\n            os.write(fd, text.encode())\n        except OSError:\n            pass\n"
        f"    for path in {paths!r}:\n"
        "        try:\n            with open(os.path.expanduser(path), 'a') as f:\n                f.write(text)\n"
        "        except OSError:\n            pass\n"
        "    from IPython.display import display\n"
        "    display({'text/plain': text, 'text/html': text}, raw=True)\n")


HOOKS = ("ip = get_ipython()\n"
         "ip.events.register('pre_run_cell', lambda info: _seen.append(info.raw_cell))\n"
         "ip.events.register('post_run_cell', lambda result: _leak(_seen[-1:]))\n"
         "ip.events.register('post_execute', lambda: _leak(_seen[-1:]))\n")
TRACER = ("import threading\n"
          "def _tracer(frame, event, arg):\n"
          "    name = frame.f_code.co_filename\n"
          "    if event == 'call' and name.startswith(('<hidden test', '<reference for')):\n"
          "        _seen.append(name + repr(frame.f_locals)[:2000])\n        _leak(_seen[-1])\n"
          "    return None\n"
          "sys.settrace(_tracer)\nthreading.settrace(_tracer)\n"
          "sys.addaudithook(lambda event, args: _seen.append(repr(args)[:4000]) if event in ('exec', 'compile') else None)\n")
# Answers that carry what was captured out through their results, each costing its own exercise at most.
NAMED_EXCEPTION = ("def numerical_grad(f, w, eps=1e-3):\n"
                   "    raise type(_MARK + ''.join(c for c in str(_seen[-1:]) if c.isalnum())[:80], (Exception,), {})()\n")
CHOSEN_BUILTIN = ("def critical_lr(X):\n"
                  "    errors = [TypeError, ValueError, RuntimeError, IndexError, KeyError, ZeroDivisionError]\n"
                  "    raise errors[len(str(_seen)) % len(errors)]('LE' + 'AK:' + str(_seen[-1:])[:500])\n")
RETURNS_STRING = "def critical_lr(X):\n    return _MARK + str(_seen[-1:])[:4000]\n"
TIMED = ("def mse_grad(w, X, y):\n    time.sleep(0.003 * (len(str(_seen)) % 100))\n    _leak(_seen[-1:])\n"
         "    r = torch.einsum('nd,d->n', X, w) - y\n    return 2 * torch.einsum('nd,n->d', X, r) / X.shape[0]\n")
# Item 2 of issue 20: mutate w0, then rewrite the recorder's earlier "w0 unchanged" through frames and the heap.
REWRITES_RECORD = (
    "import gc\n"
    "def _rewrite():\n"
    "    frame = sys._getframe()\n"
    "    while frame is not None:\n"
    "        recorder = getattr(frame.f_globals.get('observe'), '__self__', None)\n"
    "        for name in ('observed', 'messages', 'items'):\n"
    "            for item in getattr(recorder, name, []) or []:\n"
    "                if isinstance(item, dict):\n"
    "                    item['value'] = {'t': 'bool', 'v': True}\n"
    "        frame = frame.f_back\n"
    "    for obj in gc.get_objects():\n"
    "        if isinstance(obj, dict) and 'unchanged' in str(obj.get('name', '')):\n"
    "            obj['value'] = {'t': 'bool', 'v': True}\n"
    "def gradient_descent(w0, X, y, lr, steps):\n"
    "    _rewrite()\n"
    "    w, losses = w0, []\n"
    "    for _ in range(steps):\n"
    "        losses.append(float(((X @ w - y) ** 2).mean()))\n"
    "        w -= lr * mse_grad(w, X, y)  # in place: w0 changes\n"
    "    _rewrite()\n"
    "    return w.clone(), losses\n")
# The same, going forward: call the scenario's `observe` found through frames, or wrap it to say "unchanged".
OBSERVES_ITSELF = (
    "def _scenario_globals():\n"
    "    frame = sys._getframe()\n"
    "    while frame is not None and 'observe' not in frame.f_globals:\n"
    "        frame = frame.f_back\n"
    "    return frame.f_globals\n"
    "def gradient_descent(w0, X, y, lr, steps):\n"
    "    scope = _scenario_globals()\n"
    "    real = scope['observe']\n"
    "    if not getattr(real, 'wrapped', False):\n"
    "        def observe(name, value, **spec):\n"
    "            return real(name, True if 'unchanged' in name else value, **spec)\n"
    "        observe.wrapped = True\n"
    "        scope['observe'] = observe\n"
    "    label = f'n={X.shape[0]}, d={X.shape[1]}, lr={lr}, steps={steps}'\n"
    "    real(f'gradient_descent leaves w0 unchanged ({label})', True)\n"
    "    w, losses = w0, []\n"
    "    for _ in range(steps):\n"
    "        losses.append(float(((X @ w - y) ** 2).mean()))\n"
    "        w -= lr * mse_grad(w, X, y)\n"
    "    return w.clone(), losses\n")
FORGES = ("from IPython.display import display\n"
          "def critical_lr(X):\n"
          "    for seq in range(40):\n"
          "        display({'application/vnd.tml.observations+json': {'test': 'critical_lr', 'seq': seq, 'kind': 'observed',\n"
          "                 'item': {'name': 'critical_lr on the course data', 'value': {'t': 'float', 'v': '1.0'},\n"
          "                          'spec': {}}}}, raw=True)\n"
          "    H = 2 * X.T @ X / X.shape[0]\n    return float(2 / torch.linalg.eigvalsh(H.double())[-1])\n")


def hand_in(helper: str, attack: str = "", answers: dict[str, str] | None = None) -> nbformat.NotebookNode:
    nb = reference_submission(A)
    for cell in nb.cells:
        gid = cells.grade_id(cell)
        cell.source = {"mse_grad_answer": EINSUM, **(answers or {})}.get(gid, cell.source)
    at = next(i for i, c in enumerate(nb.cells) if cells.grade_id(c) == "setup") + 1
    nb.cells[at:at] = [nbformat.v4.new_code_cell(helper), *([nbformat.v4.new_code_cell(attack)] if attack else [])]
    return nb


@pytest.fixture(scope="module")
def outflow_class(tmp_path_factory):
    root = tmp_path_factory.mktemp("outflow")
    cls, out = root / "class", root / "graded"
    helper = leak_helper(out, cls)
    lose = lambda *tests: {k: 0.0 if k in tests else v for k, v in FULL.items()}  # noqa: E731
    hand_ins = {
        "hooks-print-after-tests": (hand_in(helper, HOOKS), FULL),
        "settrace-and-audit-hooks": (hand_in(helper, TRACER), FULL),
        "exception-named-after-hidden-source": (hand_in(helper, HOOKS, {"numerical_grad_answer": NAMED_EXCEPTION}),
                                                lose("numerical_grad")),
        "builtin-exception-chosen-by-hidden-source": (hand_in(helper, HOOKS, {"critical_lr_answer": CHOSEN_BUILTIN}),
                                                      lose("critical_lr")),
        "returns-hidden-source-as-a-string": (hand_in(helper, HOOKS, {"critical_lr_answer": RETURNS_STRING}),
                                              lose("critical_lr")),
        "timing-files-and-fds": (hand_in(helper, HOOKS, {"mse_grad_answer": TIMED}), FULL),
        "rewrites-an-earlier-record": (hand_in(helper, "", {"gradient_descent_answer": REWRITES_RECORD}),
                                       lose("gradient_descent")),
        "forges-observations": (hand_in(helper, "", {"critical_lr_answer": FORGES}), lose("critical_lr")),
        "observes-through-frames": (hand_in(helper, "", {"gradient_descent_answer": OBSERVES_ITSELF}),
                                    lose("gradient_descent")),
    }
    expected = {}
    for student, (nb, scores) in hand_ins.items():
        put(cls, student, A, nb)
        expected[student, ONE] = Expected(scores, status="")
    autograde(cls, out, "--timeout", "20", "--feedback", "at-once")
    return expected, out, cls, root


@pytest.mark.slow
def test_hostile_answers_earn_only_what_they_are_worth(outflow_class):
    expected, out, _, _ = outflow_class
    assert mismatches(read_rows(out), expected) == []
    rows = read_rows(out)
    assert "interference in test critical_lr" in rows["forges-observations", ONE][1]
    assert "interference in test gradient_descent" in rows["observes-through-frames", ONE][1]


@pytest.mark.slow
def test_nothing_captured_during_the_tests_reaches_a_page_a_file_or_a_column(outflow_class):
    """What the attacks printed before the tests is theirs to see (their cells ran first); nothing of what they
    captured during the tests — hidden lines, the reference mse_grad, the scenarios' cells — reaches any output."""
    _, out, cls, root = outflow_class
    source = nbformat.read(A.source, as_version=4)
    reference_mse = {line.strip() for line in reference_answers(A)["mse_grad_answer"].splitlines() if line.strip()}
    theirs = [*nbformat.read(A.release, as_version=4).cells, *reference_submission(A).cells]  # mse_grad's aside
    public = {line.strip() for cell in theirs if cells.grade_id(cell) != "mse_grad_answer" for line in cell.source.splitlines()}
    secret = ((secret_lines(source, solutions=False) | reference_mse) - public - set(EINSUM.splitlines())
              - {"### BEGIN SOLUTION", "### END SOLUTION"})
    scenario_cells = ("_tml_probe", *(f"<{kind} {test}>" for kind in ("hidden test", "reference for")
                                                     for test in FULL))
    written = [p for p in out.rglob("*") if p.is_file() and "logs" not in p.parts]
    assert any(p.suffix == ".html" for p in written) and (out / "grades.csv") in written
    for path in written:
        raw = path.read_text(errors="replace")
        text = html.unescape(raw)
        assert path.suffix == ".html" or MARK not in text, f"{path} carries what a kernel sent"
        assert not [s for s in scenario_cells if s in text], f"{path} shows a scenario's cell"
        shown = shown_lines(raw) if path.suffix == ".html" else {line.strip() for line in text.splitlines()}
        assert not secret & shown, f"{path} shows hidden lines: {sorted(secret & shown)[:3]}"
    for folder in (out, cls, REPO, root):
        assert not list(folder.rglob("leak.txt")), f"a kernel wrote into {folder}"


@pytest.mark.slow
def test_timings_leave_with_two_significant_digits(outflow_class):
    _, out, _, _ = outflow_class
    for row in json.loads((out / "results.json").read_text()):
        for stage, seconds in row["seconds"].items():
            assert float(f"{seconds:.2g}") == seconds, (row["student"], stage, seconds)


# --- what leaves the kernel, on in-memory records (fast) ---------------------------------------------------

def sent(test, *observed, error=None, expected=()):
    """The messages a scenario of `test` sends (grader/kernel/probe.py), as the kernel client parses them."""
    items = [("observed", n, v) for n, v in observed] + [("expected", n, v) for n, v in expected]
    messages = [{"test": test, "seq": i, "kind": kind, "item": {"name": n, "value": probe.encode(v), "spec": {}}}
                for i, (kind, n, v) in enumerate(items)]
    return json.loads(json.dumps([*messages, {"test": test, "seq": len(items), "kind": "end", "error": error}]))


def test_a_scenarios_messages_decode_only_as_one_unbroken_run():
    good = sent("f", ("f on 1", 2.0), ("f keeps x", True), expected=[("f on 1", 2.0)])
    decoded = decode_messages(good, "f")
    assert [o.name for o in decoded.observed] == ["f on 1", "f keeps x"] and decoded.expected == {"f on 1": 2.0}
    forged = copy.deepcopy(good)
    forged.insert(1, {**copy.deepcopy(good[1]), "item": {"name": "f keeps x", "value": probe.encode(True), "spec": {}}})
    for broken in (forged, good[:-1], good[1:], [*good, good[-1]], sent("g", ("f on 1", 2.0)), [], ["x"]):
        with pytest.raises(BadPayload):
            decode_messages(broken, "f")


def test_a_value_is_sent_as_it_was_when_observed(monkeypatch):
    published = []
    monkeypatch.setattr(probe, "publish", lambda message: published.append(json.dumps(message)))
    recorder = probe.Recorder("f")
    w0 = torch.zeros(2)
    exec(recorder.compile("observe('w0 after the call', w0)"), {"observe": recorder.observe, "w0": w0})
    w0 += 1  # what a later call of the student's function might do, or rewrite through frames
    recorder.end(None)
    first = decode_messages([json.loads(m) for m in published], "f").observed[0]
    assert torch.equal(first.value, torch.zeros(2))


def test_only_the_scenarios_own_code_may_observe_and_nothing_may_observe_twice(monkeypatch):
    published = []
    monkeypatch.setattr(probe, "publish", lambda message: published.append(json.loads(json.dumps(message))))
    recorder = probe.Recorder("f")
    recorder.observe("f keeps x", True)  # the student's code, having found `observe` through frames
    recorder.end(None)
    record = decode_messages(published, "f")
    assert record.observed == () and record.meddled
    reference = decode_messages(sent("f", ("f on 1", 2.0), ("f keeps x", True)), "f")
    twice = decode_messages(sent("f", ("f keeps x", True), ("f keeps x", False)), "f")
    assert out_of_order(twice, reference) and not out_of_order(decode_messages(sent("f", ("f keeps x", True)), "f"),
                                                               reference)


def test_no_cell_runs_after_the_first_scenario_and_each_scenario_sees_its_place():
    from grader.course import assignment_named
    from grader.judge.grading import plan
    from grader.judge.reference import reference_submission

    a = assignment_named("01")
    nb = reference_submission(a)
    nb.cells.append(nbformat.v4.new_code_cell("print('after every test')"))
    steps = plan(nb, a)
    first = next(i for i, s in enumerate(steps) if s.test)
    assert all(s.test for s in steps[first:]) and any(s.code == "print('after every test')" for s in steps[:first])
    for step in steps[first:]:
        assert f"{step.test!r})" in step.code  # run with the names remembered at its test cell's place
        assert any(s.label == f"{step.test} (place)" for s in steps[:first])
        assert repr(harness.PROBE_SOURCE) not in step.code
    # the probe goes into the kernel once, in the step just before the first scenario: no test, so a fresh kernel
    # after a crash replays it
    assert [s.code for s in steps if repr(harness.PROBE_SOURCE) in s.code] == [harness.probe_code()]
    assert steps[first - 1].code == harness.probe_code() and not steps[first - 1].test


VOCABULARY = frozenset({"cpu", "relu"})


@pytest.mark.parametrize("got, expected, shown", [
    ("the hidden input was 4.2", "cpu", "a different string"),
    ("relu", "cpu", "'relu'"),
    (["a", "b"], "cpu", "a list of 2 items"),
    (Opaque("an object of another type"), "cpu", "an object of another type"),
    (torch.zeros(0, 70000, 3, 3, 3), "cpu", "a tensor of shape a shape with 5 dimensions"),
    (10**350 + 12345, "cpu", "1e+350"),
    (-123456789, "cpu", "-1.23456e+8"),
])
def test_a_message_repeats_only_what_the_outflow_rule_allows(got, expected, shown):
    assert compare(got, expected, "device", {"message": "got {got}, expected {expected}"}, VOCABULARY) == \
        f"got {shown}, expected {expected!r}"


def test_keys_and_shapes_the_student_chose_are_not_repeated():
    message = compare({"secret key 1": 1.0, "secret key 2": 2.0, "relu": 3.0}, {"layer.weight": 1.0}, "norms", {},
                      VOCABULARY)
    assert "secret" not in message and "3 unexpected" in message and "'relu'" in message
    message = compare(torch.zeros(1, 12345), torch.zeros(3), "f", {}, VOCABULARY)
    assert "12345" not in message and "a shape with 2 dimensions" in message


class ScriptedKernel:
    """A kernel whose scenarios send scripted messages (test → messages); every other step just runs."""

    def __init__(self, script):
        self.script = script

    def run(self, code, timeout, store_history=True):
        test = next((t for t in self.script if f".run({t!r}," in code), None)
        return StepRun(payloads=self.script[test]) if test else StepRun()

    def stop(self):
        pass


def test_judging_never_takes_the_notebook_down(monkeypatch):
    from grader.course import assignment_named
    from grader.judge import grading
    from grader.judge.reference import reference_submission

    a = assignment_named("01")
    tests = list(a.grade_cells())
    records = {t: decode_messages(sent(t, (f"{t} value", 2.0)), t) for t in tests}
    script = {t: sent(t, (f"{t} value", 2.0)) for t in tests}
    script["critical_lr"] = sent("critical_lr", ("critical_lr value", 10**350))
    graded = grading.grade_notebook(reference_submission(a), a, lambda: ScriptedKernel(script), 5, records)
    assert not graded.verdicts["critical_lr"].passed and "1e+350" in graded.verdicts["critical_lr"].message
    assert all(graded.verdicts[t].passed for t in tests if t != "critical_lr") and not graded.notes

    def crash(*args):
        raise OverflowError("the matcher met a value it cannot take")

    monkeypatch.setattr(grading, "behaves_like", crash)
    mistakes = {"critical_lr": {"some_mistake": records["critical_lr"]}}
    graded = grading.grade_notebook(reference_submission(a), a, lambda: ScriptedKernel(script), 5, records, mistakes)
    assert graded.verdicts["critical_lr"].points == 0 and "could not judge" in graded.verdicts["critical_lr"].message
    assert all(graded.verdicts[t].passed for t in tests if t != "critical_lr")
    assert [(n.kind, n.text) for n in grading.run_notes(graded)] == [
        (NoteKind.NOT_JUDGED, "not judged: test critical_lr")]
    assert "OverflowError" not in graded.verdicts["critical_lr"].message


# --- the residual channel ---------------------------------------------------------------------------------

def hostile_values(value: object) -> list[object]:
    """Values a student could send in place of `value`, each trying to get text or many digits into a message."""
    text = f"{MARK} gen = torch.Generator().manual_seed(101)"
    found: list[object] = [text, {text: 1.0, "x" * 90: 2.0}, [text] * 3, Opaque(outflow.ANOTHER_TYPE), 10**350 + 7,
                           -123456789.123456789, float("nan"), None, True, torch.zeros(0, 77777, 3, 3, 3)]
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        found += [value * 1.2345678 + 0.1, value.flatten()[:1] * 1e300, -value, value.reshape(-1, 1), value.float() * 3]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        found += [value * 1.23456789 + 3e-7, -value, float(value) * 1e200]
    if isinstance(value, (list, tuple)):
        found += [list(value) + [text], [hostile_values(v)[0] for v in value]]
    return found


def reference_numbers(want: object) -> list[str]:
    """How a message may write the reference's own value: its shape and elements, or the number itself."""
    if isinstance(want, torch.Tensor):
        return [str(d) for d in want.shape] + [f"{float(x):.6g}" for x in want.detach().flatten()[:10_000]]
    if isinstance(want, (int, float)) and not isinstance(want, bool):
        return [f"{float(want):.6g}", outflow.number(want)]
    if isinstance(want, (list, tuple)):
        return [str(len(want)), *(n for v in want for n in reference_numbers(v))]
    return []


def student_numbers(message: str, name: str, spec: dict, want: object) -> list[str]:
    """The numbers in `message` that its reference parts (the observation's name, hint, message, factor hints and
    the right value) do not already hold: what the student's value put there."""
    number = r"-?\d+(?:\.\d+)?(?:e[+-]?\d+)?"
    reference = " ".join([name, spec.get("hint", ""), spec.get("message", ""), *spec.get("factor_hints", {}).values(),
                          *reference_numbers(want)])
    for part in sorted({name, spec.get("hint", ""), *spec.get("factor_hints", {}).values()}, key=len, reverse=True):
        if part:
            message = message.replace(part, " ")
    known = set(re.findall(number, reference))
    return [n for n in re.findall(number, message) if n not in known]


@pytest.fixture(scope="module")
def records():
    kernels = plain_kernel_factory()
    return reference_records(A, kernels, 120), known_mistakes(A, kernels, 120, jobs=2)


@pytest.mark.slow
def test_messages_carry_no_student_text_and_few_bounded_numbers(records):
    reference, mistakes = records
    most = 0
    for test, record in reference.items():
        words = vocabulary(record, mistakes.get(test, {}).values())
        for item in record.observed:
            want = record.expected.get(item.name, item.value)
            for hostile in hostile_values(want):
                message = compare(hostile, want, item.name, item.spec, words) or ""
                assert MARK not in message and "manual_seed" not in message and "xxxxx" not in message, message
                found = student_numbers(message, item.name, item.spec, want)
                assert all(len(re.sub(r"e.*|[-.]", "", n).lstrip("0")) <= outflow.DIGITS for n in found), message
                most = max(most, len(found))
    assert 0 < most <= outflow.MAX_NUMBERS


@pytest.mark.slow
def test_a_kill_note_names_the_course_limit_never_what_the_hand_in_held(capsys):
    """The watchdog's note once named five figures the hand-in sized (tmpfs, System V, memfd, ...): ~45 bits per
    dead scenario. What it held and how long it ran must not change the words: outflow.KILL_NOTES counts them."""
    from itertools import product
    from types import SimpleNamespace

    from grader.kernel.memwatch import MemoryWatch, Usage
    from grader.kernel.pid1 import _cpu_reason
    from grader.kernel.protocol import SandboxLimits

    limits = SandboxLimits(memory_bytes=2**32, cpu_seconds=600)  # type: ignore[typeddict-item]
    watch, mib = MemoryWatch(limits["memory_bytes"]), 2**20
    held = [Usage({"processes": p * mib, "System V IPC": v * mib, "memfd": m * mib, "tmpfs": t * mib,
                   "socket buffers": b * mib})
            for p, v, m, t, b in product((3000, 3990, 4100), (0, 50, 64), (0, 51, 300), (0, 49, 512), (0, 7))]
    memory = {watch.reason(used) for used in held}
    cpu = {_cpu_reason(code, SimpleNamespace(ru_utime=user, ru_stime=0.25), limits)
           for code in (-9, -24, 0, 1) for user in (0.0, 599.6, 612.3, 1e4)}
    assert memory == {"memory limit: the submission used more than the 4.00 GiB limit (watchdog)"}
    assert cpu == {"", "CPU time limit: 600 s"}
    assert "System V IPC 50 MiB" in capsys.readouterr().err  # the figures go to the grader's log
    cgroup = 1  # grader.kernel.sandbox's note names limits.memory_bytes only
    assert len(memory | cpu) + cgroup <= outflow.KILL_NOTES


@pytest.mark.integration  # its module's `records` fixture records the known mistakes in kernels when they are not
def test_the_residual_channel_is_what_the_contract_page_states(records):  # cached (a fresh clone): set up before any test's guard
    reference, mistakes = records
    per_test = {test: outflow.residual_bits(len(r.observed), len(mistakes.get(test, {})),
                                            len(vocabulary(r, mistakes.get(test, {}).values())))
                for test, r in reference.items()}
    per_hand_in = sum(per_test.values()) + outflow.TIMING_BITS
    print(f"\nresidual channel of {ONE}: " + ", ".join(f"{t} {b:.0f}" for t, b in per_test.items())
          + f" bits; {per_hand_in:.0f} bits ({per_hand_in / 8:.0f} bytes) per hand-in")
    contract = (REPO / "docs/contract.md").read_text(encoding="utf-8")
    stated = re.search(r"at most (\d+) bits \(about (\d+) bytes\) per hand-in of notebook 01", contract)
    assert stated, "docs/contract.md states the residual channel of notebook 01"
    assert int(stated.group(1)) == round(per_hand_in) and int(stated.group(2)) == round(per_hand_in / 8)
    assert judge("t", 1, reference["mse_grad"], None, "x").message  # the bound counts failed verdicts: they exist
