"""What a verdict may repeat of what the student's kernel sent, and how many bits that lets out.

The outflow rule (docs/contract.md): once the first hidden scenario starts in a kernel, nothing the kernel
produces reaches a page, a file or a column except the trusted verdict — points, and messages composed here
from the reference run's words plus numbers (bounded digits) and shapes. Everything a message says about a
student's value goes through `shown`: a number to at most 6 significant digits, a tensor by its shape (at
most 4 dimensions of at most 4 digits), a string only when the reference or a known mistake produced the
same string (`vocabulary`), a container by its kind and length, anything else by a common type name or as
"an object of another type". An exception is named only when it is one of COMMON_ERRORS.

`residual_bits` bounds what one hand-in can carry out that way, test by test (README states it;
tests/test_outflow.py measures it and checks that hostile values never get more into a message).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch

# Type names a message may repeat; any other (a class the student named) is "an object of another type".
SHOWN_TYPES = frozenset({"list", "tuple", "dict", "str", "NoneType", "int", "float", "bool", "complex", "Tensor",
                         "ndarray", "generator", "function", "method", "set", "Parameter", "float64", "float32",
                         "int64", "bytes"})
ANOTHER_TYPE = "an object of another type"
ANOTHER_STRING = "a different string"
# Exceptions a message may name (what honest mistakes raise); any other is "an exception".
COMMON_ERRORS = ("NotImplementedError", "NameError", "TypeError", "ValueError", "RuntimeError", "IndexError",
                 "KeyError", "AttributeError", "ZeroDivisionError", "AssertionError", "MemoryError", "RecursionError",
                 "OverflowError", "UnboundLocalError", "ImportError")
DIGITS = 6  # significant digits of a number a message repeats
MAX_SHOWN_DIMS, MAX_SHOWN_DIM = 4, 9999  # a shape beyond these is "a shape with k dimensions"
MAX_STRING = 80  # a vocabulary string longer than this is not repeated either

# --- the bound -------------------------------------------------------------------------------------------
# A number of at most DIGITS significant digits, with its sign and a float64 exponent: about 2**30 strings.
BITS_PER_NUMBER = math.log2(2 * 9 * 10 ** (DIGITS - 1) * 700 + 4)
# The most student-derived numbers one message holds (check_tensor's "largest difference D at index I: expected E,
# got G" has D, I and G; a shape is counted as its numbers), and the message templates one observation can pick.
MAX_NUMBERS = 4
TEMPLATES = 64
# A failed verdict names the test's other failed checks after its message, by the reference's names, up to this
# many ("… and k more"): which checks failed is a subset of the observations, one bit each.
MAX_ALSO_FAILED = 8
# How a scenario can stop instead of ending (grader.judge.grading.FAILURE_WORDS): timeout, timeout and killed, not
# run, or what it sent cannot be read (grader.judge.judge.Unreadable: no result, cut short, not from the test) — 6,
# counted as 9; or the kernel died, without a reason or with the limit that killed it: CPU time, memory (cgroup),
# memory (watchdog). A kill note names the course's limit only, never what the
# hand-in held or spent (tests/test_outflow.py checks that those never change its words).
STOPS = 9
KILL_NOTES = 1 + 3
FAILURE_STATES = STOPS + KILL_NOTES
# Timings after the first scenario, each to 2 significant digits in 0.001 s … 10**4 s: results.json's five stages
# and Gradescope's execution_time (the whole run's, grader/platforms/gradescope.py).
TIMING_BITS = (5 + 1) * math.log2(7 * 90 + 1)


def number(value: float | int) -> str:
    """A number as a message repeats it: at most DIGITS significant digits, whatever its size."""
    if isinstance(value, int) and not isinstance(value, bool):
        if abs(value) < 10 ** DIGITS:
            return str(value)
        digits = str(abs(value))
        mantissa = f"{digits[0]}.{digits[1:DIGITS]}".rstrip("0").rstrip(".")
        return f"{'-' if value < 0 else ''}{mantissa}e+{len(digits) - 1}"
    return f"{float(value):.{DIGITS}g}"


def shape(dims: Iterable[int]) -> str:
    """A student's tensor shape as a message repeats it."""
    dims = list(dims)
    if len(dims) <= MAX_SHOWN_DIMS and all(0 <= d <= MAX_SHOWN_DIM for d in dims):
        return str(dims)
    return f"a shape with {min(len(dims), 9)} dimensions"


def type_name(text: object) -> str:
    """A type name as the student may see it: a common one as it is, anything else as ANOTHER_TYPE."""
    name = str(text).split(" ", 1)[0]
    return name if name in SHOWN_TYPES else ANOTHER_TYPE


def error_name(name: str | None) -> str:
    """An exception's class name as the student may see it: one of COMMON_ERRORS, or "an exception"."""
    return name if name in COMMON_ERRORS else "an exception"


def strings(value: object) -> set[str]:
    """Every string inside a decoded value (dict keys included)."""
    if isinstance(value, str):
        return {value}
    if isinstance(value, (list, tuple)):
        return set().union(*(strings(v) for v in value))
    if isinstance(value, dict):
        return set().union(*(strings(k) | strings(v) for k, v in value.items()))
    return set()


@dataclass(frozen=True)
class Opaque:
    """A value the kernel could describe only by the name of its type."""

    type_name: str


def shown(value: object, vocabulary: frozenset[str] = frozenset()) -> str:
    """What a message may say about a value the student's kernel sent."""
    if isinstance(value, Opaque):
        return value.type_name
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {shape(value.shape)}"
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, (int, float)):
        return number(value)
    if isinstance(value, str):
        return repr(value) if value in vocabulary and len(value) <= MAX_STRING else ANOTHER_STRING
    if isinstance(value, (list, tuple, dict)):
        return f"a {type(value).__name__} of {number(len(value))} items"
    return ANOTHER_TYPE


def residual_bits(observations: int, mistakes: int, strings: int) -> float:
    """Bits one test's verdict can carry out of the kernel: passed, or failed with one message, the names of the
    other failed checks (a subset of the observations), known mistake and failure state. A message is one
    observation's, one of TEMPLATES, with at most two strings from the vocabulary (`strings` of them: the value,
    a dict key) and MAX_NUMBERS numbers."""
    failed = FAILURE_STATES * (mistakes + 1) * max(observations, 1) * TEMPLATES * (strings + 1) ** 2
    return math.log2(1 + failed) + max(observations - 1, 0) + MAX_NUMBERS * BITS_PER_NUMBER
