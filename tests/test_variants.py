"""Variants (correct answers written differently) become submissions the way mutants do, scratch cells included."""

from grader.author.mutants import Variant, mutant_submission, pack_mutants, reference_answers
from grader.course import assignment_named
from labkit import cells


def test_a_variant_replaces_its_answer_and_adds_its_scratch_cell_right_after_it():
    assignment = assignment_named("01")
    variant = Variant(name="v", exercise="mse_grad", cell="mse_grad_answer", why="w",
                      source="def mse_grad(w, X, y):\n    return 2 * X.T @ (X @ w - y) / len(y)\n",
                      scratch="import torch\ntorch.set_flush_denormal(True)\n")
    nb = mutant_submission(assignment, [variant])
    at = next(i for i, c in enumerate(nb.cells) if cells.grade_id(c) == "mse_grad_answer")
    assert nb.cells[at].source == variant.source
    assert nb.cells[at + 1].source == variant.scratch and not cells.nbgrader(nb.cells[at + 1])
    others = [c for c in nb.cells if cells.kind(c) == cells.ANSWER and cells.grade_id(c) != "mse_grad_answer"]
    assert all(c.source == reference_answers(assignment)[cells.grade_id(c)] for c in others)


def test_variants_of_one_exercise_never_share_a_submission():
    same = [Variant(f"v{i}", "mse_grad", "mse_grad_answer", "w", "") for i in range(3)]
    assert [len(group) for group in pack_mutants(same)] == [1, 1, 1]


def test_an_assignment_is_found_by_its_number_too():
    assert assignment_named("6") == assignment_named("06") == assignment_named("06_mixed_precision")


def test_check_asks_for_two_variants_per_exercise(tmp_path, monkeypatch):
    from grader.author import mutants

    monkeypatch.setattr(mutants, "VARIANTS", tmp_path)
    (tmp_path / "01_gradient_descent.toml").write_text(
        '[[variant]]\nname = "v"\nexercise = "mse_grad"\ncell = "mse_grad_answer"\nwhy = "w"\nsource = "x = 1"\n')
    problems = [p for p in mutants.mutant_problems() if "variants" in p]
    assert "01_gradient_descent: exercise mse_grad has 1 variants, needs 2" in problems
    assert "01_gradient_descent: exercise critical_lr has 0 variants, needs 2" in problems
    assert "02_autograd_graph: exercise Value has 0 variants, needs 2" in problems  # no file at all
    monkeypatch.undo()
    assert not [p for p in mutants.mutant_problems() if "variants" in p]  # the course's own files
