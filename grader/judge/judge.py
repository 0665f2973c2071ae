"""Trusted side of grading: decode what a scenario sent, compare it with the reference, decide the points.

Runs in the grader's own process, never in the student's kernel. A scenario's payload is plain JSON
(grader/kernel/probe.py); it is decoded here without pickle, with every size and type checked, into Python
numbers, strings, lists, dicts and tensors. What a value is compared against, the tolerances and the
message a student reads all come from the reference run (grader/judge/grading.py) — never from the
student's payload, of which only the values are used.
"""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum

import torch

from grader.judge import outflow
from grader.judge.outflow import Opaque
from helpers.checks import CheckFailure, check_scalar, check_tensor

MAX_NAME_CHARS = 500
# What probe.encode sends, as "other", for a value it reads without running it: shown as it is.
DESCRIBED = frozenset({"a tensor on the meta device", *(f"a tensor of dtype {name}" for name in (
    "uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
    "float8_e8m0fnu", "complex32", "bits8", "bits16", "quint8", "qint8", "qint32"))})
MAX_INT_DIGITS = 4300  # Python's own limit for reading an int from text (sys.int_info.default_max_str_digits)
DTYPES = {name: getattr(torch, name) for name in (
    "float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
    "complex64", "complex128")}


class Unreadable(str, Enum):
    """Why what a scenario sent cannot be judged, in the words feedback and status notes use: the kind only, never
    which check caught it (a notebook forging messages from a thread trips a different check from run to run)."""

    NO_RESULT = "no result"
    CUT_SHORT = "the scenario's messages were cut short"
    FORGED = "a result did not come from the test"  # forged, out of order, malformed, for another test, meddled


class BadPayload(ValueError):
    """The kernel sent something that is not a well-formed scenario result: its kind, and (for trusted logs only)
    the check that caught it."""

    def __init__(self, detail: str, why: Unreadable = Unreadable.FORGED) -> None:
        super().__init__(detail)
        self.why = why


@dataclass(frozen=True)
class Observation:
    """One recorded value: its name (the message's subject), the value and, from the reference, how to compare."""

    name: str
    value: object
    spec: dict = field(default_factory=dict)


@dataclass(frozen=True)
class ScenarioRecord:
    """What one scenario produced in one kernel: observations in order, oracle values, and the error that ended it."""

    test: str
    observed: tuple[Observation, ...]
    expected: dict[str, object]
    error: str | None
    meddled: bool = False  # something besides the scenario's code called observe (grader/kernel/probe.py)
    ran_out_of_time: bool = False  # a launch of ranks in the scenario hit its time limit (a busy machine can do that)


@dataclass(frozen=True)
class Verdict:
    """One test cell's outcome: the points and, when it failed, the message the student reads."""

    test: str
    points: float
    max_points: float
    message: str = ""

    @property
    def passed(self) -> bool:
        return self.points == self.max_points


def shown_error(name: str | None) -> str:
    """An exception's class name as a message may repeat it (grader/judge/outflow.py)."""
    return outflow.error_name(name)


# --- decoding ---------------------------------------------------------------------------------------------

def _expect(condition: bool, what: str, why: Unreadable = Unreadable.FORGED) -> None:
    if not condition:
        raise BadPayload(what, why)


def decode_value(node: object, depth: int = 0) -> object:
    """A value from its plain-JSON form (see grader/probe.encode); raises BadPayload on anything malformed."""
    _expect(isinstance(node, dict) and isinstance(node.get("t"), str) and depth <= 8, "malformed value")
    assert isinstance(node, dict)
    kind = node["t"]
    if kind == "none":
        return None
    if kind == "bool":
        _expect(isinstance(node.get("v"), bool), "malformed bool")
        return node["v"]
    if kind == "int":
        text = node.get("v")
        _expect(isinstance(text, str) and re.fullmatch(r"-?\d+", text) is not None, "malformed int")
        assert isinstance(text, str)
        if len(text.lstrip("-")) > MAX_INT_DIGITS:  # a plain wrong value, too long for Python to read as a number
            return Opaque(f"an integer of more than {MAX_INT_DIGITS} digits")
        return int(text)
    if kind == "float":
        text = node.get("v")
        _expect(isinstance(text, str) and len(text) <= 40, "malformed float")
        try:
            return float(text)  # type: ignore[arg-type]
        except ValueError:
            raise BadPayload("malformed float") from None
    if kind == "str":
        _expect(isinstance(node.get("v"), str), "malformed str")
        return node["v"]
    if kind in ("list", "tuple"):
        items = node.get("v")
        _expect(isinstance(items, list), "malformed list")
        values = [decode_value(v, depth + 1) for v in items]  # type: ignore[union-attr]
        return values if kind == "list" else tuple(values)
    if kind == "dict":
        pairs = node.get("v")
        _expect(isinstance(pairs, list) and all(isinstance(p, list) and len(p) == 2 for p in pairs), "malformed dict")
        decoded = {}
        for key_node, value_node in pairs:  # type: ignore[union-attr]
            key = decode_value(key_node, depth + 1)
            try:
                hash(key)
            except TypeError:
                raise BadPayload("unhashable dict key") from None
            decoded[key] = decode_value(value_node, depth + 1)
        return decoded
    if kind == "tensor":
        return _decode_tensor(node)
    if kind == "other":
        text = node.get("type", "?")
        return Opaque(text if text in DESCRIBED else outflow.type_name(text))
    raise BadPayload("unknown value kind")


def _decode_tensor(node: dict) -> torch.Tensor:
    dtype = DTYPES.get(node.get("dtype", ""))
    shape = node.get("shape")
    data = node.get("data")
    _expect(dtype is not None, "tensor of an unknown dtype")
    _expect(isinstance(shape, list) and len(shape) <= 8 and all(isinstance(s, int) and s >= 0 for s in shape),
            "malformed tensor shape")
    _expect(isinstance(data, str), "malformed tensor data")
    assert dtype is not None and isinstance(shape, list) and isinstance(data, str)
    numel = math.prod(shape)
    _expect(numel <= 2**31, "tensor too large")
    itemsize = torch.empty((), dtype=dtype).element_size()
    try:
        raw = base64.b64decode(data, validate=True)
    except ValueError:
        raise BadPayload("malformed tensor data") from None
    _expect(len(raw) == numel * itemsize, "tensor data does not match its shape")
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(raw), dtype=dtype).reshape(shape).clone()


def _spec(node: object) -> dict:
    if not isinstance(node, dict):
        return {}
    spec: dict = {}
    for key in ("rtol", "atol"):
        if isinstance(node.get(key), (int, float)) and not isinstance(node.get(key), bool):
            spec[key] = float(node[key])
    for key in ("hint", "message"):
        if isinstance(node.get(key), str):
            spec[key] = node[key]
    if isinstance(node.get("any_shape"), bool):
        spec["any_shape"] = node["any_shape"]
    hints = node.get("factor_hints")
    if isinstance(hints, list):
        spec["factor_hints"] = {float(k): str(v) for k, v in hints
                                if isinstance(k, (int, float)) and isinstance(v, str)}
    return spec


def decode_messages(messages: object, test: str) -> ScenarioRecord:
    """A scenario's messages (grader/kernel/probe.py `Message`, JSON already parsed by the kernel client), in the
    order they came, as a ScenarioRecord; BadPayload unless they are exactly one run of `test`'s scenario:
    observations and oracle values numbered 0, 1, 2, … and then one end message (anything forged beside them
    repeats or skips a number). Whatever else decoding raises is BadPayload too: its type never leaves the grader."""
    try:
        return _decode_messages(messages, test)
    except BadPayload:
        raise
    except Exception:
        raise BadPayload("malformed message") from None


def _decode_messages(messages: object, test: str) -> ScenarioRecord:
    _expect(isinstance(messages, list) and bool(messages), "no result", Unreadable.NO_RESULT)
    assert isinstance(messages, list)
    items: list[Observation] = []
    oracle: dict[str, object] = {}
    for seq, message in enumerate(messages):
        _expect(isinstance(message, dict), "malformed message")
        _expect(message.get("test") == test, "a result for another test")
        _expect(message.get("seq") == seq and type(message.get("seq")) is int, "messages out of order or forged")
        kind = message.get("kind")
        if kind == "end":
            _expect(seq == len(messages) - 1, "messages after the end")
            error, meddled = message.get("error"), message.get("meddled", False)
            late = message.get("ran_out_of_time", False)
            _expect((error is None or isinstance(error, str)) and isinstance(meddled, bool) and isinstance(late, bool),
                    "malformed end message")
            return ScenarioRecord(test, tuple(items), oracle, error, meddled, late)
        item = message.get("item")
        _expect(kind in ("observed", "expected") and isinstance(item, dict) and isinstance(item.get("name"), str),
                "malformed observation")
        assert isinstance(item, dict)
        name = item["name"][:MAX_NAME_CHARS]
        if kind == "observed":
            items.append(Observation(name, decode_value(item.get("value")), _spec(item.get("spec"))))
        else:
            oracle[name] = decode_value(item.get("value"))
    raise BadPayload("no end message", Unreadable.CUT_SHORT)


# --- comparing ----------------------------------------------------------------------------------------------

def _kind(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return "a torch.Tensor"
    if isinstance(value, bool):
        return "True or False"
    if isinstance(value, (int, float)):
        return "a number"
    return f"a {type(value).__name__}"


def _loosened_for(actual: object, spec: dict, expected: object) -> dict:
    """A correct answer in float32 for float64 inputs is not a wrong answer: allow what rounding the right
    value to float32 costs (twice over). Half precision gets nothing: its rounding would hide real mistakes."""
    if not (isinstance(actual, torch.Tensor) and actual.dtype == torch.float32):
        return spec
    if isinstance(expected, torch.Tensor) and expected.is_floating_point() and expected.dtype != torch.float64:
        return spec
    exact = expected.detach().double() if isinstance(expected, torch.Tensor) else torch.tensor(float(expected),  # type: ignore[arg-type]
                                                                                                dtype=torch.float64)
    rounding = float((exact - exact.float().double()).abs().max()) if exact.numel() else 0.0
    loosened = dict(spec)
    loosened["atol"] = spec.get("atol", 1e-6) + 2 * rounding
    loosened["rtol"] = max(spec.get("rtol", 1e-4), 2 * torch.finfo(torch.float32).eps)
    return loosened


def _format(template: str, got: object, expected: object, vocabulary: frozenset[str]) -> str:
    """`template` (the reference's) with {got} as the outflow rule lets a message repeat it, {expected} as it is."""
    right = f"a tensor of shape {list(expected.shape)}" if isinstance(expected, torch.Tensor) else repr(expected)
    return (template.replace("{got}", outflow.shown(got, vocabulary))
            .replace("{expected}", right if len(right) <= 80 else right[:77] + "..."))


def _equal(actual: object, expected: object, name: str, spec: dict, vocabulary: frozenset[str]) -> str | None:
    if type(actual) is type(expected) and actual == expected:
        return None
    return _format(spec.get("message") or f"{name}: expected {{expected}}, got {{got}}.", actual, expected, vocabulary)


def _number_problem(actual: object, expected: float | int, name: str, spec: dict) -> str | None:
    """What check_scalar cannot say itself: a number too large for a float, a tensor of several numbers."""
    suffix = f" Hint: {spec['hint']}" if spec.get("hint") else ""
    if isinstance(actual, int) and not isinstance(actual, bool) and abs(actual) >= 2 ** 1023:
        return f"{name}: expected {outflow.number(expected)}, got {outflow.number(actual)}.{suffix}"
    if isinstance(actual, torch.Tensor) and actual.numel() != 1:
        return f"{name} should be a single number, got a tensor of shape {outflow.shape(actual.shape)}.{suffix}"
    return None


def compare(actual: object, expected: object, name: str, spec: dict, vocabulary: frozenset[str] = frozenset()) -> str | None:
    """None when `actual` matches `expected` under `spec`; else the message the student reads.

    Tensors and numbers go through helpers.checks (shape, finiteness, tolerance, factor hints); lists,
    tuples and dicts item by item (a list and a tuple are interchangeable); anything else must be equal,
    and `spec["message"]` (with {got} and {expected}) says what is wrong. What the message repeats of
    `actual` obeys the outflow rule (grader/judge/outflow.py): strings only from `vocabulary`.
    """
    if isinstance(expected, bool) or expected is None or isinstance(expected, str):
        return _equal(actual, expected, name, spec, vocabulary)
    if isinstance(actual, Opaque):
        return f"{name} should be {_kind(expected)}, got {actual.type_name}."
    options = {k: spec[k] for k in ("rtol", "atol", "hint", "factor_hints") if k in spec}
    try:
        if isinstance(expected, torch.Tensor):
            if isinstance(actual, torch.Tensor) and actual.is_complex() and not expected.is_complex():
                return f"{name} should be a real tensor, got a complex one."
            if spec.get("any_shape") and isinstance(actual, torch.Tensor) and actual.numel() == expected.numel():
                actual = actual.reshape(expected.shape)
            if isinstance(actual, torch.Tensor) and actual.shape != expected.shape:
                hint = f" Hint: {spec['hint']}" if spec.get("hint") else ""
                return f"{name} returned shape {outflow.shape(actual.shape)}, expected {list(expected.shape)}.{hint}"
            check_tensor(actual, expected, name=name, **_loosened_for(actual, options, expected))
            return None
        if isinstance(expected, (int, float)):
            problem = _number_problem(actual, expected, name, spec)
            if problem:
                return problem
            check_scalar(actual, float(expected), name=name, **_loosened_for(actual, options, expected))
            return None
    except CheckFailure as failure:
        return str(failure)
    if isinstance(expected, (list, tuple)):
        if not isinstance(actual, (list, tuple)):
            return f"{name} should be a list of {len(expected)} items, got {_kind(actual)}."
        if len(actual) != len(expected):
            return f"{name} should have {len(expected)} items, got {outflow.number(len(actual))}."
        for index, (a, e) in enumerate(zip(actual, expected)):
            problem = compare(a, e, f"{name}[{index}]", spec, vocabulary)
            if problem:
                return problem
        return None
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return f"{name} should be a dict, got {_kind(actual)}."
        if set(actual) != set(expected):
            missing = sorted(map(str, set(expected) - set(actual)))[:3]
            extra = set(actual) - set(expected)
            named = sorted({outflow.shown(key, vocabulary) for key in extra})[:2]
            return f"{name}: keys differ (missing {missing}, {len(extra)} unexpected: {', '.join(named) or 'none'})."
        for key in expected:
            problem = compare(actual[key], expected[key], f"{name}[{key!r}]", spec, vocabulary)
            if problem:
                return problem
        return None
    return _equal(actual, expected, name, spec, vocabulary)


def vocabulary(reference: ScenarioRecord, mistakes: Iterable[ScenarioRecord] = ()) -> frozenset[str]:
    """The strings a message may repeat: those the reference run or a known mistake produced (outflow rule)."""
    records = [reference, *mistakes]
    found = set().union(*(outflow.strings(item.value) for record in records for item in record.observed))
    return frozenset(found.union(*(outflow.strings(value) for value in reference.expected.values())))


def out_of_order(student: ScenarioRecord, reference: ScenarioRecord) -> bool:
    """True when the student's run sent the reference's observations other than in the reference's order, one
    sent more often than there or before one the reference sent first: such an observation was forged (the
    student's code calling `observe`, or running the scenario's code again) and must not stand in for the real one.
    An honest run may stop early or skip observations (a scenario that branches on what was returned) and may make
    ones the reference never made: those only ever leave the reference's order a subsequence."""
    order = iter(item.name for item in reference.observed)
    known = {item.name for item in reference.observed}
    return not all(item.name in order for item in student.observed if item.name in known)


def judge(test: str, max_points: float, reference: ScenarioRecord, student: ScenarioRecord | None,
          failure: str = "", words: frozenset[str] = frozenset()) -> Verdict:
    """The verdict for one test cell: full points when every reference observation is matched, else 0.

    `failure` names what stopped the scenario in the student's kernel (timeout, dead kernel, no result);
    the reference's observations, oracle values and specs are the only source of what is right. `words`: the
    strings a message may repeat (`vocabulary`). A value no comparison can take raises: the caller says so.
    """
    got: dict[str, object] = {}
    if student is not None:
        for item in student.observed:
            got.setdefault(item.name, item.value)
    first, also = "", []
    for item in reference.observed:
        want = reference.expected.get(item.name, item.value)
        if item.name not in got:  # the scenario stopped here: nothing after it was checked
            if not first:
                return Verdict(test, 0.0, max_points, _unchecked(test, item.name, student, failure))
            break
        if not first:
            first = compare(got[item.name], want, item.name, item.spec, words) or ""
            continue
        try:  # a later value no comparison can take is a failed check like any other, not a lost test
            wrong = bool(compare(got[item.name], want, item.name, item.spec, words))
        except Exception:
            wrong = True
        if wrong:
            also.append(item.name)
    if not first:
        return Verdict(test, max_points, max_points)
    ended = first if not also or first.endswith((".", "?", "!")) else first + "."  # a hint may end without a stop
    return Verdict(test, 0.0, max_points, ended + _also_failed(also))


def _also_failed(names: list[str]) -> str:
    """The other failed checks of a test, by the reference's names (one bit each of the outflow rule's channel)."""
    if not names:
        return ""
    shown = "; ".join(f"“{name}”" for name in names[:outflow.MAX_ALSO_FAILED])
    more = len(names) - outflow.MAX_ALSO_FAILED
    return f" Also failed: {shown}" + (f" and {more} more." if more > 0 else ".")


def _unchecked(test: str, name: str, student: ScenarioRecord | None, failure: str) -> str:
    """Why observation `name` never came: what stopped the scenario, or the exception the student's code raised."""
    if failure:
        return f"{name}: not checked — {failure}."
    error = student.error if student else None
    if error == "NotImplementedError":
        return f"{test}: not answered yet (NotImplementedError)."
    if error == "NameError":
        return (f"{name}: your code raised NameError before this could be checked. At grading, set-up cells, your "
                "answers and your own cells run, but test, demo and claim cells do not: define everything your "
                "answer uses in your own cells.")
    if error:
        return f"{name}: your code raised {shown_error(error)} before this could be checked."
    return f"{name}: not checked — the test did not run to the end."


def behaves_like(student: ScenarioRecord, mistake: ScenarioRecord, reference: ScenarioRecord) -> bool:
    """True when the student's scenario agrees with a known mistake's on every observation the reference made.

    Precision first: every observation must be present in both or missing in both (then ended by the same
    error), and each present pair must match under the reference's tolerances.
    """
    got = {item.name: item.value for item in student.observed}
    theirs = {item.name: item.value for item in mistake.observed}
    for item in reference.observed:
        if (item.name in got) != (item.name in theirs):
            return False
        if item.name not in got:
            return student.error == mistake.error
        try:
            if not _alike(got[item.name], theirs[item.name], item.spec):
                return False
        except (ArithmeticError, ValueError, TypeError, RuntimeError):  # values no comparison can take are not alike
            return False
    return True


def _alike(a: object, b: object, spec: dict) -> bool:
    """`compare`'s agreement, except that NaN agrees with NaN (a mistake that makes NaN is still that mistake)."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape and a.is_complex() == b.is_complex():
        return bool(torch.allclose(a.detach().double(), b.detach().double(), rtol=spec.get("rtol", 1e-4),
                                   atol=spec.get("atol", 1e-6), equal_nan=True)) if a.numel() else True
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_alike(x, y, spec) for x, y in zip(a, b))
    return compare(a, b, "", spec) is None
