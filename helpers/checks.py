"""Checks that exercise tests call: each failure says what is wrong in words a student can act on.

Introduced in notebook 01. A check raises `CheckFailure` (an AssertionError) whose message names
the function, what was expected, what came back, and — where the mismatch has a recognisable
shape (sign flipped, constant factor, wrong shape) — what to look at.

In a notebook a failed check shows only its message, without the frames of this module: IPython
renders an exception that defines `_render_traceback_()` with the lines it returns.

Each visible test runs inside `with exercise_test(N, "name"):`, so a blank answer reads "exercise N (`name`)
is not answered yet", a name lost in a kernel restart says to run its cell, and an error inside the answer is
named with the answer's own line, not a page of torch's frames.

A test that calls an earlier exercise's function checks that function first, inside
`with earlier_exercise(N, "name"):`, so a mistake there is reported as "exercise N (`name`) is wrong —
fix it first", not blamed on the exercise under test.
"""

from __future__ import annotations

import contextlib
import linecache
import math
import types
from collections.abc import Callable, Iterator, Mapping

import torch

_RED, _RESET = "\x1b[1;31m", "\x1b[0m"


def _message_only(error: BaseException) -> list[str]:
    """The lines IPython shows for `error`: its class and message, no frames."""
    head, *rest = str(error).splitlines() or [""]
    return [f"{_RED}{type(error).__name__}{_RESET}: {head}", *rest]


class CheckFailure(AssertionError):
    """A failed exercise check; the message is the feedback the student reads, shown without a traceback (notebook 01)."""

    def _render_traceback_(self) -> list[str]:
        return _message_only(self)


class ExerciseNotImplementedError(NotImplementedError):
    """An earlier exercise that a test uses is still the stub; shown as its message alone (notebook 01)."""

    def _render_traceback_(self) -> list[str]:
        return _message_only(self)


class ExerciseNotAnswered(NotImplementedError):
    """The exercise under test is still the stub; shown as its message alone (notebook 01)."""

    def _render_traceback_(self) -> list[str]:
        return _message_only(self)


def _is_cell(filename: str) -> bool:
    """Whether code compiled from `filename` is a notebook cell (ipykernel's cell files or IPython's inputs)."""
    return "ipykernel_" in filename or filename.startswith("<ipython-input")


def _answer_frames(tb: types.TracebackType | None) -> list[tuple[types.CodeType, int]]:
    """The frames of `tb` in the student's own cells, after the first (the test cell that holds the `with`)."""
    frames = []
    while tb is not None:
        if _is_cell(tb.tb_frame.f_code.co_filename):
            frames.append((tb.tb_frame.f_code, tb.tb_lineno))
        tb = tb.tb_next
    return frames[1:]


def _where(frames: list[tuple[types.CodeType, int]]) -> str:
    """'in `f`, line N: code' for the deepest of the student's frames, where the error arose."""
    if not frames:
        return ""
    code, line = frames[-1]
    text = linecache.getline(code.co_filename, line).strip()
    return f"\n  in `{code.co_name}`, line {line}" + (f": {text}" if text else "")


@contextlib.contextmanager
def exercise_test(number: int, name: str) -> Iterator[None]:
    """Run exercise `number`'s visible checks, naming a blank, missing or crashing answer without a traceback (notebook 01).

    The stub's NotImplementedError becomes ExerciseNotAnswered; `name` undefined (a restarted kernel) says to
    run its cell; any other error raised by the answer becomes a CheckFailure naming it and the answer's line.
    """
    try:
        yield
    except ExerciseNotImplementedError:
        raise
    except NotImplementedError:
        raise ExerciseNotAnswered(
            f"exercise {number} (`{name}`) is not answered yet: replace the `raise NotImplementedError` in its "
            "cell with your answer, run that cell, then this one.") from None
    except NameError as error:
        if _answer_frames(error.__traceback__):  # raised inside the answer: the answer's own mistake
            raise CheckFailure(f"exercise {number} (`{name}`) raised NameError: {error}"
                               f"{_where(_answer_frames(error.__traceback__))}") from None
        if error.name == name:
            raise CheckFailure(f"`{name}` is not defined in this kernel: run exercise {number}'s answer cell "
                               "(after a kernel restart, run the notebook from the top).") from None
        raise CheckFailure(f"`{error.name}` is not defined in this kernel: run the cells above this one first "
                           "(after a kernel restart, Run → Run All Above Selected Cell).") from None
    except CheckFailure:
        raise
    except TypeError as error:
        if "NoneType" in str(error) and not _answer_frames(error.__traceback__):  # the check used what came back
            raise CheckFailure(f"exercise {number} (`{name}`) returned None where this check needs a value — is a "
                               "`return` missing?") from None
        raise CheckFailure(f"exercise {number} (`{name}`) raised TypeError: {error}"
                           f"{_where(_answer_frames(error.__traceback__))}") from None
    except Exception as error:  # the answer crashed: name the error and where, without torch's frames
        raise CheckFailure(f"exercise {number} (`{name}`) raised {type(error).__name__}: {error}"
                           f"{_where(_answer_frames(error.__traceback__))}") from None


@contextlib.contextmanager
def earlier_exercise(number: int, name: str) -> Iterator[None]:
    """Blame what fails inside the block on exercise `number` (`name`), which the current test uses (notebook 01).

    A failed check or an error becomes a CheckFailure "exercise N (`name`) is wrong — fix it first: …";
    the stub's NotImplementedError becomes ExerciseNotImplementedError "… is not written yet — finish it first".
    """
    try:
        yield
    except NotImplementedError:
        raise ExerciseNotImplementedError(
            f"exercise {number} (`{name}`) is not written yet — finish it first (this test uses it).") from None
    except CheckFailure as failure:
        raise CheckFailure(f"exercise {number} (`{name}`) is wrong — fix it first (this test uses it). {failure}") from None
    except NameError as error:
        if error.name != name or _answer_frames(error.__traceback__):
            raise CheckFailure(f"exercise {number} (`{name}`) is wrong — fix it first (this test uses it). It raised "
                               f"NameError: {error}") from None
        raise CheckFailure(f"`{name}` (exercise {number}, which this test uses) is not defined in this kernel: run its "
                           "answer cell (after a kernel restart, run the notebook from the top).") from None
    except Exception as error:  # any error of the earlier answer is that answer's to fix
        raise CheckFailure(f"exercise {number} (`{name}`) is wrong — fix it first (this test uses it). It raised "
                           f"{type(error).__name__}: {error}") from None


def returned(value: object) -> str:
    """What a check says an answer returned: its type's name, or for None the likely cause (notebook 01)."""
    return "None — is a `return` missing?" if value is None else type(value).__name__


def note_rebound(names: Mapping[str, object], **course: torch.Tensor) -> None:
    """Say which course tensors a student's cell has rebound; the visible checks use the rebuilt ones (notebook 01).

    Call as `note_rebound(globals(), X=X_course, y=y_course)`: reusing a name for your own experiments is fine.
    """
    for name, fresh in course.items():
        held = names.get(name)
        if not (isinstance(held, torch.Tensor) and held.shape == fresh.shape and held.dtype == fresh.dtype
                and torch.equal(held, fresh)):
            print(f"Note: `{name}` no longer holds the course data (a cell of yours rebound it — that is fine); "
                  "these checks use the course data, rebuilt.")


def fail(message: str) -> None:
    """Raise a CheckFailure with a teaching message (notebook 01)."""
    raise CheckFailure(message)


def check(condition: bool, message: str) -> None:
    """Fail with `message` unless `condition` holds (notebook 01)."""
    if not condition:
        fail(message)


def constant_factor(actual: torch.Tensor, expected: torch.Tensor) -> float | None:
    """The k with actual ≈ k·expected when one exists (k ≠ 1), else None (notebook 01)."""
    a = actual.detach().double().flatten()
    e = expected.detach().double().flatten()
    e_norm = float(e.norm())
    if e_norm == 0.0 or float(a.norm()) == 0.0 or not bool(torch.isfinite(a).all()):
        return None  # all zeros is not "a factor of 0": describe_mismatch names it
    k = float(a @ e) / e_norm**2
    residual = float((a - k * e).norm())
    if residual > 1e-3 * max(float(a.norm()), e_norm) or math.isclose(k, 1.0, rel_tol=1e-3):
        return None
    return k


def _factor_advice(k: float, factor_hints: Mapping[float, str] | None) -> str:
    for factor, hint in (factor_hints or {}).items():
        if math.isclose(k, factor, rel_tol=1e-2):
            return f" — {hint}"
    if math.isclose(k, -1.0, rel_tol=1e-2):
        return " — the sign is flipped"
    return ""


def describe_mismatch(
    actual: torch.Tensor, expected: torch.Tensor, factor_hints: Mapping[float, str] | None = None
) -> str:
    """One sentence on how `actual` differs from `expected` (notebook 01)."""
    if not bool(actual.detach().ne(0).any()) and bool(expected.detach().ne(0).any()):
        return f"every value is 0 where nonzero values were expected{_factor_advice(0.0, factor_hints)}"
    k = constant_factor(actual, expected)
    if k is not None:
        return f"off by a factor of {k:.4g}{_factor_advice(k, factor_hints)}"
    diff = (actual.detach().double() - expected.detach().double()).abs()
    worst = int(diff.flatten().argmax())
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), diff.shape)) if diff.dim() else ()
    where = f" at index {list(index)}" if index else ""
    return (
        f"largest difference {float(diff.flatten()[worst]):.4g}{where}: "
        f"expected {float(expected.detach().flatten()[worst]):.6g}, "
        f"got {float(actual.detach().flatten()[worst]):.6g}"
    )


def check_tensor(
    actual: object,
    expected: torch.Tensor,
    *,
    name: str,
    rtol: float = 1e-4,
    atol: float = 1e-6,
    hint: str = "",
    factor_hints: Mapping[float, str] | None = None,
) -> None:
    """Check a returned tensor's type, shape, finiteness and values against an oracle (notebook 01)."""
    suffix = f" Hint: {hint}" if hint else ""
    if not isinstance(actual, torch.Tensor):
        fail(f"{name} should return a torch.Tensor, got {returned(actual)}.{suffix}")
    assert isinstance(actual, torch.Tensor)
    if actual.shape != expected.shape:
        fail(f"{name} returned shape {list(actual.shape)}, expected {list(expected.shape)}.{suffix}")
    if expected.is_floating_point() and not bool(torch.isfinite(actual).all()):
        fail(f"{name} returned inf or NaN values.{suffix}")
    if torch.allclose(actual.detach().double().cpu(), expected.detach().double().cpu(), rtol=rtol, atol=atol):
        return
    detail = describe_mismatch(actual.cpu(), expected.cpu(), factor_hints)
    fail(f"{name} is wrong: {detail}.{suffix}")


def check_scalar(
    actual: object,
    expected: float,
    *,
    name: str,
    rtol: float = 1e-4,
    atol: float = 1e-8,
    hint: str = "",
    factor_hints: Mapping[float, str] | None = None,
) -> None:
    """Check a returned number against an oracle; accepts floats and 0-d tensors (notebook 01)."""
    suffix = f" Hint: {hint}" if hint else ""
    if isinstance(actual, torch.Tensor):
        if actual.numel() != 1:
            fail(f"{name} should be a single number, got a tensor of shape {list(actual.shape)}.{suffix}")
        actual = actual.item()
    if isinstance(actual, bool) or not isinstance(actual, (int, float)):
        fail(f"{name} should be a number, got {returned(actual)}.{suffix}")
    value = float(actual)  # type: ignore[arg-type]
    if math.isclose(value, expected, rel_tol=rtol, abs_tol=atol):
        return
    advice = ""
    if expected != 0.0 and value == 0.0 and (zero := _factor_advice(0.0, factor_hints)):
        advice = f" ({zero.removeprefix(' — ')})"
    elif expected != 0.0 and value != 0.0 and math.isfinite(value):
        k = value / expected
        advice = f" (off by a factor of {k:.4g}{_factor_advice(k, factor_hints)})"
    fail(f"{name}: expected {expected:.6g}, got {value:.6g}{advice}.{suffix}")


def check_unchanged(before: torch.Tensor, after: torch.Tensor, *, name: str, argument: str) -> None:
    """Fail when a function modified an input it should have left alone (notebook 01)."""
    check(
        torch.equal(before, after),
        f"{name} changed its argument {argument} in place; work on a copy ({argument}.clone()) instead.",
    )


def autograd_grad(f: Callable[[torch.Tensor], torch.Tensor], w: torch.Tensor) -> torch.Tensor:
    """Gradient of the scalar `f(w)` by autograd: the oracle hand-written gradients are checked against (notebook 01)."""
    w = w.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        (grad,) = torch.autograd.grad(f(w), w)
    return grad
