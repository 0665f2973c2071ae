"""Gradient descent measured rather than derived: where a rate breaks, how fast a run contracts (notebook 01).

The visible checks of notebook 01 use these to say what a wrong answer does — "descent breaks near 2.0 × your
rate", "a nearby (lr, β) is faster" — from runs, without stating the formula the exercise asks for. Every run is
batched: one row of a matrix per rate (or per (lr, β) pair), one gradient call per step for all of them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from helpers.precision import single_thread


def mse_grads(W: torch.Tensor, X: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Row i: the gradient of mean((X @ w - y) ** 2) at w = row i of W, by autograd (notebook 01)."""
    W = W.detach().requires_grad_(True)
    with torch.enable_grad():
        (grads,) = torch.autograd.grad(((W @ X.T - y) ** 2).mean(1).sum(), W)
    return grads


def diverges(X: torch.Tensor, y: torch.Tensor, rates: Sequence[float], steps: int = 1000) -> list[bool]:
    """For each rate: whether `steps` of gradient descent on mean((X @ w - y) ** 2) from w = 0 end with a larger (or
    non-finite) gradient norm than they started with (notebook 01)."""
    def grad(W: torch.Tensor) -> torch.Tensor:
        return mse_grads(W, X, y)

    lrs = torch.tensor(list(rates), dtype=X.dtype)[:, None]
    W = torch.zeros(len(rates), X.shape[1], dtype=X.dtype)
    with single_thread():
        start = grad(W).norm(dim=1)
        broke = torch.zeros(len(rates), dtype=torch.bool)
        for step in range(1, steps + 1):
            W = W - lrs * grad(W)
            if step % 25 == 0 or step == steps:   # a run that left for good stops here: no inf arithmetic (slow on CPUs)
                far = ~torch.isfinite(W).all(1) | (W.norm(dim=1) > 1e6 * (1 + start))
                broke |= far
                W[far] = 0.0
        return (broke | (grad(W).norm(dim=1) > start)).tolist()


def breaking_multiple(X: torch.Tensor, y: torch.Tensor, lr: float, steps: int = 1000) -> float:
    """The smallest multiple of `lr` (from 1/4096 to 4096, found to 1%) at which gradient descent on the MSE of (X, y)
    from 0 diverges (see `diverges`); inf if none does (notebook 01)."""
    coarse = [2.0 ** (k / 2) for k in range(-24, 25)]
    broke = diverges(X, y, [m * lr for m in coarse], steps // 4)
    top = next((m for m, b in zip(coarse, broke) if b), None)
    if top is None:
        return float("inf")
    fine = [top * 2.0 ** (-k / 64) for k in range(48, -1, -1)]   # from top / 1.68 up to top, 1% apart
    broke = diverges(X, y, [m * lr for m in fine], steps)
    return next((m for m, b in zip(fine, broke) if b), top)


def heavy_ball_contraction(X: torch.Tensor, y: torch.Tensor, w0: torch.Tensor, pairs: Sequence[tuple[float, float]],
                           steps: int = 60, window: int = 30) -> list[float]:
    """For each (lr, beta): the error's shrink factor per step of heavy-ball descent on the MSE of (X, y) from w0
    (w_{-1} = w0), measured as (|e_steps| / |e_(steps - window)|) ** (1 / window), e = w - the least-squares w;
    above 1 it grows (notebook 01)."""
    w_star = torch.linalg.lstsq(X, y.unsqueeze(1)).solution.squeeze(1)
    lrs = torch.tensor([p[0] for p in pairs], dtype=X.dtype)[:, None]
    betas = torch.tensor([p[1] for p in pairs], dtype=X.dtype)[:, None]
    W = w0.detach().to(X.dtype).expand(len(pairs), -1).clone()
    previous, errors = W, []
    with single_thread():
        for _ in range(steps):
            W, previous = W - lrs * mse_grads(W, X, y) + betas * (W - previous), W
            errors.append((W - w_star).norm(dim=1))
    ratio = errors[-1] / errors[-1 - window]
    return torch.nan_to_num(ratio, nan=torch.inf).pow(1 / window).tolist()
