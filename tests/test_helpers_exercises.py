"""helpers.exercises: a demo that needs an unfinished exercise says so and does not raise."""

import pytest

from helpers.exercises import needs_exercise


def test_an_unfinished_exercise_is_named(capsys):
    with needs_exercise(2, "numerical_grad"):
        raise NotImplementedError()
    assert "finish exercise 2 first" in capsys.readouterr().out


def test_other_errors_still_raise():
    with pytest.raises(ValueError), needs_exercise(2, "numerical_grad"):
        raise ValueError("a bug in a finished answer")


def test_a_finished_exercise_runs_quietly(capsys):
    with needs_exercise(1, "mse_grad"):
        value = 1 + 1
    assert value == 2 and capsys.readouterr().out == ""
