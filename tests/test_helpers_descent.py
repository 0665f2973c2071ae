"""helpers.descent: where descent breaks and how fast heavy ball contracts, measured on problems with known answers."""

import math

import torch

from helpers.descent import breaking_multiple, diverges, heavy_ball_contraction, mse_grads

# A diagonal problem: X = diag(sqrt(n·λ/2)) rows, so the MSE's Hessian has eigenvalues 1 and 9 exactly.
N = 2
X = torch.diag(torch.tensor([math.sqrt(N * 1.0 / 2), math.sqrt(N * 9.0 / 2)], dtype=torch.float64))
Y = torch.tensor([1.0, -1.0], dtype=torch.float64)
CRITICAL = 2 / 9


def test_mse_grads_are_autograd_gradients_row_by_row():
    W = torch.tensor([[0.5, -1.0], [2.0, 0.0]], dtype=torch.float64)
    for row, grad in zip(W, mse_grads(W, X, Y)):
        w = row.clone().requires_grad_(True)
        (want,) = torch.autograd.grad(((X @ w - Y) ** 2).mean(), w)
        assert torch.allclose(grad, want)


def test_descent_breaks_at_the_critical_rate():
    assert diverges(X, Y, [0.95 * CRITICAL, 1.05 * CRITICAL], steps=300) == [False, True]
    assert math.isclose(breaking_multiple(X, Y, CRITICAL / 2, steps=300), 2.0, rel_tol=0.03)
    assert breaking_multiple(X, Y, CRITICAL * 1e5, steps=300) <= 2.0 ** -12   # the grid's smallest multiples


def test_heavy_ball_contraction_matches_the_rates_it_should():
    plain = heavy_ball_contraction(X, Y, torch.zeros(2, dtype=torch.float64), [(2 / 10, 0.0), (0.05, 0.0)])
    assert math.isclose(plain[0], 0.8, rel_tol=1e-6)          # (κ-1)/(κ+1) with κ = 9
    assert math.isclose(plain[1], 1 - 0.05, rel_tol=1e-6)     # the flat direction alone
    assert heavy_ball_contraction(X, Y, torch.zeros(2, dtype=torch.float64), [(1.0, 0.0)])[0] > 1

