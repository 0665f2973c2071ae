"""Seeded synthetic datasets: every notebook builds its data here, nothing is downloaded."""

from __future__ import annotations

import torch


def make_linear_regression(
    n: int = 200,
    d: int = 2,
    noise: float = 0.1,
    seed: int = 0,
    condition: float = 4.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`(X, y, w_true)` with y = X·w_true + noise; feature scales spread by `condition` (notebook 01).

    Unequal feature scales make the loss surface an elongated bowl, so the largest stable step
    size is set by the steepest direction — the point of notebook 01.
    """
    g = torch.Generator().manual_seed(seed)
    scales = torch.logspace(0.0, float(torch.log10(torch.tensor(condition))), d)
    X = torch.randn(n, d, generator=g) * scales
    w_true = torch.randn(d, generator=g)
    y = X @ w_true + noise * torch.randn(n, generator=g)
    return X, y, w_true


def make_classification_batch(
    n: int = 32, d: int = 100, classes: int = 10, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch `(X, y)` of Gaussian inputs and uniform integer labels, as in the seed articles (notebook 01)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g), torch.randint(0, classes, (n,), generator=g)


def make_tanh_regression(
    n: int = 256, d: int = 4, noise: float = 1.0, seed: int = 3
) -> tuple[torch.Tensor, torch.Tensor]:
    """`(X, y)`: make_linear_regression's inputs and a standardised tanh of its targets, `y` shaped [n, 1] (notebook 03).

    A non-linear target for a small network; notebook 03's checks rebuild its course data with it, so a
    student's cell that rebinds `X` or `y` changes nothing they check.
    """
    X, y_linear, _ = make_linear_regression(n=n, d=d, noise=noise, seed=seed, condition=1.0)
    y = torch.tanh(y_linear).unsqueeze(1)
    return X, (y - y.mean()) / y.std()
