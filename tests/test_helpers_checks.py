"""helpers.checks: oracles agree with closed forms, and failures name the mistake."""

import pytest
import torch
from factories import seeds, tensor_shapes, wrong_factors
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.checks import (
    CheckFailure,
    ExerciseNotAnswered,
    ExerciseNotImplementedError,
    autograd_grad,
    check,
    check_scalar,
    check_tensor,
    check_unchanged,
    constant_factor,
    describe_mismatch,
    earlier_exercise,
    exercise_test,
    note_rebound,
)


def tensor(shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) + 0.1


@settings(max_examples=40, deadline=None)
@given(shape=tensor_shapes, seed=seeds)
def test_equal_tensors_pass(shape, seed):
    t = tensor(shape, seed)
    check_tensor(t.clone(), t, name="f")


@settings(max_examples=40, deadline=None)
@given(shape=tensor_shapes, seed=seeds, k=wrong_factors)
def test_scaled_tensor_is_reported_with_its_factor(shape, seed, k):
    t = tensor(shape, seed)
    assert constant_factor(k * t, t) == pytest.approx(k)
    with pytest.raises(CheckFailure, match=f"off by a factor of {k:.4g}"):
        check_tensor(k * t, t, name="f")


def test_factor_hint_and_sign_are_spelled_out():
    t = torch.tensor([1.0, -2.0, 3.0])
    with pytest.raises(CheckFailure, match="derivative of the square"):
        check_tensor(0.5 * t, t, name="mse_grad", factor_hints={0.5: "the derivative of the square brings a factor 2"})
    with pytest.raises(CheckFailure, match="sign is flipped"):
        check_tensor(-t, t, name="mse_grad")


def test_shape_type_and_nonfinite_failures_teach():
    t = torch.ones(3)
    with pytest.raises(CheckFailure, match=r"returned shape \[3, 1\], expected \[3\]"):
        check_tensor(torch.ones(3, 1), t, name="mse_grad")
    with pytest.raises(CheckFailure, match="should return a torch.Tensor, got list"):
        check_tensor([1.0, 1.0, 1.0], t, name="mse_grad")
    with pytest.raises(CheckFailure, match="inf or NaN"):
        check_tensor(torch.tensor([1.0, float("nan"), 1.0]), t, name="mse_grad")


def test_unrelated_values_name_the_worst_entry():
    message = describe_mismatch(torch.tensor([1.0, 5.0, 1.0]), torch.tensor([1.0, 2.0, 3.0]))
    assert "index [1]" in message and "expected 2" in message and "got 5" in message


def test_all_zeros_is_named_not_called_a_factor_of_zero():
    message = describe_mismatch(torch.zeros(3), torch.tensor([1.0, 2.0, 3.0]))
    assert "every value is 0" in message and "factor" not in message
    with pytest.raises(CheckFailure) as failure:
        check_scalar(0.0, 6.0, name="d/dw")
    assert "expected 6, got 0" in str(failure.value) and "factor" not in str(failure.value)
    hints = {0.0: "already rounded to 0"}  # a hint for zero still names the mistake
    with pytest.raises(CheckFailure, match=r"expected 6, got 0 \(already rounded to 0\)"):
        check_scalar(0.0, 6.0, name="d/dw", factor_hints=hints)
    assert describe_mismatch(torch.zeros(2), torch.ones(2), hints).endswith("expected — already rounded to 0")


def test_check_scalar_accepts_numbers_and_explains_factors():
    check_scalar(torch.tensor(6.0), 6.0, name="d/dw")
    check_scalar(6, 6.0, name="d/dw")
    with pytest.raises(CheckFailure, match=r"expected 6, got 3 \(off by a factor of 0.5"):
        check_scalar(3.0, 6.0, name="d/dw")
    with pytest.raises(CheckFailure, match="should be a number, got str"):
        check_scalar("6", 6.0, name="d/dw")
    with pytest.raises(CheckFailure, match="single number"):
        check_scalar(torch.ones(2), 6.0, name="d/dw")


def test_check_and_check_unchanged():
    check(True, "never shown")
    with pytest.raises(CheckFailure, match="the message"):
        check(False, "the message")
    w = torch.zeros(2)
    with pytest.raises(CheckFailure, match=r"changed its argument w0 in place; work on a copy \(w0.clone\(\)\)"):
        check_unchanged(w, w + 1, name="gradient_descent", argument="w0")


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 20), d=st.integers(1, 5), seed=seeds)
def test_autograd_grad_matches_closed_form_mse_gradient(n, d, seed):
    g = torch.Generator().manual_seed(seed)
    X, y, w = (torch.randn(*s, generator=g, dtype=torch.float64) for s in ((n, d), (n,), (d,)))
    closed_form = 2.0 / n * X.T @ (X @ w - y)
    torch.testing.assert_close(autograd_grad(lambda v: ((X @ v - y) ** 2).mean(), w), closed_form)
    assert not w.requires_grad  # the oracle leaves its input alone


def test_failures_render_as_their_message_alone():
    lines = CheckFailure("mse_grad is wrong: off by a factor of 2.\nsecond line")._render_traceback_()
    assert "CheckFailure" in lines[0] and lines[0].endswith("mse_grad is wrong: off by a factor of 2.")
    assert lines[1:] == ["second line"] and not any("File " in line for line in lines)


def test_an_earlier_exercise_is_blamed_for_its_own_mistakes():
    wrong = r"exercise 1 \(`mse_grad`\) is wrong — fix it first"
    with pytest.raises(CheckFailure, match=wrong + ".*factor of 2"), earlier_exercise(1, "mse_grad"):
        check_tensor(2 * torch.ones(3), torch.ones(3), name="mse_grad")
    with pytest.raises(CheckFailure, match=wrong + ".*TypeError: bad"), earlier_exercise(1, "mse_grad"):
        raise TypeError("bad")
    unwritten = r"exercise 1 \(`mse_grad`\) is not written yet"
    with pytest.raises(ExerciseNotImplementedError, match=unwritten) as caught, earlier_exercise(1, "mse_grad"):
        raise NotImplementedError()
    assert isinstance(caught.value, NotImplementedError)  # a blank notebook still fails only with NotImplementedError
    with earlier_exercise(1, "mse_grad"):
        pass  # a correct earlier answer is silent
    with pytest.raises(CheckFailure, match=r"`mse_grad` \(exercise 1, which this test uses\) is not defined in this kernel"):
        in_cell("with earlier_exercise(1, 'mse_grad'):\n    mse_grad(1, 2, 3)\n", 20, {"earlier_exercise": earlier_exercise})


def in_cell(source: str, number: int, env: dict) -> None:
    """Run `source` as if from notebook cell `number` (ipykernel's file names; linecache holds the text)."""
    import linecache

    filename = f"/tmp/ipykernel_1/{number}.py"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    exec(compile(source, filename, "exec"), env)


def test_a_blank_missing_or_crashing_answer_is_named_without_frames():
    answers: dict = {}
    in_cell("def mse_grad(w, X, y):\n    raise NotImplementedError()\n", 10, answers)
    test = "with exercise_test(1, 'mse_grad'):\n    mse_grad(1, 2, 3)\n"
    with pytest.raises(ExerciseNotAnswered, match=r"exercise 1 \(`mse_grad`\) is not answered yet") as caught:
        in_cell(test, 11, {**answers, "exercise_test": exercise_test})
    assert isinstance(caught.value, NotImplementedError) and "File " not in "".join(caught.value._render_traceback_())
    with pytest.raises(CheckFailure, match=r"`mse_grad` is not defined in this kernel: run exercise 1's answer cell"):
        in_cell(test, 12, {"exercise_test": exercise_test})  # a restarted kernel: the answer cell never ran
    with pytest.raises(CheckFailure, match=r"`X_course` is not defined in this kernel: run the cells above"):
        in_cell("with exercise_test(1, 'mse_grad'):\n    X_course\n", 13, {"exercise_test": exercise_test})
    in_cell("def mse_grad(w, X, y):\n    n = X.shape[0]\n    return 2 * X @ (X @ w - y) / n\n", 14, answers)
    with pytest.raises(CheckFailure) as caught:
        in_cell("with exercise_test(1, 'mse_grad'):\n    mse_grad(torch.ones(3), torch.ones(4, 3), torch.ones(4))\n",
                15, {**answers, "exercise_test": exercise_test, "torch": torch})
    message = str(caught.value)
    assert message.startswith("exercise 1 (`mse_grad`) raised RuntimeError"), message
    assert "in `mse_grad`, line 3: return 2 * X @ (X @ w - y) / n" in message, message
    in_cell("def mse_grad(w, X, y):\n    return wrong_name\n", 16, answers)
    with pytest.raises(CheckFailure, match=r"raised NameError: name 'wrong_name' is not defined\n  in `mse_grad`, line 2"):
        in_cell(test, 17, {**answers, "exercise_test": exercise_test})
    in_cell("def gradient_descent(w0, X, y, lr, steps):\n    w = w0.clone()\n", 18, answers)  # no return
    with pytest.raises(CheckFailure, match=r"returned None where this check needs a value — is a `return` missing\?"):
        in_cell("with exercise_test(3, 'gradient_descent'):\n    w, losses = gradient_descent(torch.ones(2), 0, 0, 0, 1)\n",
                19, {**answers, "exercise_test": exercise_test, "torch": torch})
    in_cell("def mse_grad(w, X, y):\n    return None + w\n", 20, answers)  # a TypeError of the answer's own
    with pytest.raises(CheckFailure, match=r"raised TypeError: .*NoneType.*\n  in `mse_grad`, line 2"):
        in_cell(test, 21, {**answers, "exercise_test": exercise_test})
    with exercise_test(1, "mse_grad"):
        pass  # a correct answer is silent
    with pytest.raises(CheckFailure, match="factor of 2"), exercise_test(1, "mse_grad"):
        check_tensor(2 * torch.ones(3), torch.ones(3), name="mse_grad")  # a failed check passes through unchanged


@pytest.mark.slow
def test_a_kernel_shows_a_failed_check_without_frames_of_the_helpers():
    """In a real kernel the error output of a failed check is its message: no helpers/checks.py frame."""
    import nbformat
    from conftest import REPO

    from labkit.runner import NotebookRunner

    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("import torch\nfrom helpers.checks import check_tensor, earlier_exercise, exercise_test"),
        nbformat.v4.new_code_cell("check_tensor(torch.ones(2) * 2, torch.ones(2), name='mse_grad(w, X, y)')"),
        nbformat.v4.new_code_cell("with earlier_exercise(1, 'mse_grad'):\n"
                                  "    check_tensor(-torch.ones(2), torch.ones(2), name='mse_grad')"),
        nbformat.v4.new_code_cell("def stub():\n    raise NotImplementedError()\n"
                                  "with earlier_exercise(1, 'mse_grad'):\n    stub()"),
        nbformat.v4.new_code_cell("with exercise_test(2, 'stub'):\n    stub()"),
        nbformat.v4.new_code_cell("def crash(X):\n    return X @ X\n"),
        nbformat.v4.new_code_cell("with exercise_test(3, 'crash'):\n    crash(torch.ones(2, 3))"),
    ])
    NotebookRunner(nb, timeout=60, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(REPO)}}).execute()
    errors = [next(o for o in cell.outputs if o.output_type == "error") for cell in nb.cells[1:] if cell.outputs]
    expected = [("CheckFailure", "off by a factor of 2"),
                ("CheckFailure", "exercise 1 (`mse_grad`) is wrong — fix it first"),
                ("ExerciseNotImplementedError", "is not written yet"),
                ("ExerciseNotAnswered", "exercise 2 (`stub`) is not answered yet"),
                ("CheckFailure", "exercise 3 (`crash`) raised RuntimeError")]
    assert len(errors) == len(expected)
    assert "in `crash`, line 2: return X @ X" in errors[-1].evalue  # the answer's own line, found in a real kernel
    for error, (ename, words) in zip(errors, expected):
        shown = "\n".join(error.traceback)
        assert error.ename == ename and words in error.evalue and words in shown
        assert "checks.py" not in shown and "File " not in shown and "Traceback" not in shown, shown


def test_a_rebound_course_tensor_is_named_and_an_untouched_one_is_not(capsys):
    X_course = torch.arange(6.0).reshape(3, 2)
    note_rebound({"X": X_course.clone(), "y": torch.ones(3)}, X=X_course, y=torch.ones(3))
    assert capsys.readouterr().out == ""
    note_rebound({"X": X_course[:2], "y": torch.ones(3, dtype=torch.float64)}, X=X_course, y=torch.ones(3))
    out = capsys.readouterr().out
    assert "`X` no longer holds the course data" in out and "`y` no longer holds the course data" in out
    note_rebound({}, X=X_course)
    assert "`X` no longer holds" in capsys.readouterr().out  # deleted counts as rebound


def test_an_answer_that_returns_nothing_is_asked_about_its_return():
    for run in (lambda: check_tensor(None, torch.ones(2), name="mse_grad"), lambda: check_scalar(None, 1.0, name="critical_lr")):
        with pytest.raises(CheckFailure, match=r"got None — is a `return` missing\?"):
            run()
