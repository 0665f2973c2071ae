"""A pre-flight checklist to run on any model before a long training run (notebook 05).

The checklist is assembled from functions the student wrote in notebook 05 (`layer_grad_norms`,
`saved_activation_bytes`, `first_nonfinite_module`), passed in as arguments, plus two checks of its
own: the loss is finite, and a gradient reaches every trainable parameter.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn as nn


@dataclass(frozen=True)
class CheckResult:
    """One line of the checklist: what was checked, whether it passed, and the numbers behind it (notebook 05)."""

    name: str
    ok: bool
    detail: str


def params_without_gradient(model: nn.Module) -> list[str]:
    """Names of trainable parameters whose .grad is None or exactly zero after a backward (notebook 05)."""
    return [
        name
        for name, p in model.named_parameters()
        if p.requires_grad and (p.grad is None or not bool(p.grad.detach().ne(0).any()))
    ]


def preflight(
    model: nn.Module,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    make_batch: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
    *,
    layer_grad_norms: Callable[[nn.Module], dict[str, float]],
    saved_activation_bytes: Callable[..., int],
    first_nonfinite_module: Callable[[nn.Module, torch.Tensor], str | None],
    batch_sizes: Sequence[int] = (8, 16, 32),
    max_norm_ratio: float = 1e3,
) -> list[CheckResult]:
    """Run the four checks on `model` with batches from `make_batch(batch_size)`; leaves `.grad` as None (notebook 05)."""
    results: list[CheckResult] = []
    X, y = make_batch(batch_sizes[0])
    for p in model.parameters():
        p.grad = None
    loss = loss_fn(model(X), y)
    finite = bool(torch.isfinite(loss).all())
    detail = f"loss = {loss.item():.4g}"
    if not finite:
        culprit = first_nonfinite_module(model, X)
        detail += f"; first module with a non-finite output: {culprit!r}"
    results.append(CheckResult("loss is finite", finite, detail))

    loss.backward()
    missing = params_without_gradient(model)
    results.append(CheckResult(
        "a gradient reaches every trainable parameter", not missing,
        "all parameters have a non-zero gradient" if not missing else f"no gradient: {', '.join(missing)}"))

    norms = layer_grad_norms(model)
    positive = {k: v for k, v in norms.items() if v > 0 and math.isfinite(v)}
    if positive:
        low = min(positive, key=positive.__getitem__)
        high = max(positive, key=positive.__getitem__)
        ratio = positive[high] / positive[low]
        ok = len(positive) == len(norms) and ratio < max_norm_ratio
        detail = (f"smallest {low} = {positive[low]:.3g}, largest {high} = {positive[high]:.3g} "
                  f"(ratio {ratio:.3g}, limit {max_norm_ratio:g})")
    else:
        ok, detail = False, "no finite, non-zero gradient norm at all"
    results.append(CheckResult("gradient norms per layer within range", ok, detail))

    sizes = [saved_activation_bytes(model, make_batch(b)[0]) for b in batch_sizes]
    per_example = [s / b for s, b in zip(sizes, batch_sizes)]
    linear = max(per_example) <= 1.1 * min(per_example)
    detail = ", ".join(f"B={b}: {s / 2**20:.3f} MiB" for b, s in zip(batch_sizes, sizes))
    results.append(CheckResult("activation memory grows linearly with batch size", linear, detail))
    for p in model.parameters():
        p.grad = None
    return results


def format_report(results: Sequence[CheckResult]) -> str:
    """The checklist as printable lines, ✓ or ✗ in front of each (notebook 05)."""
    return "\n".join(f"{'✓' if r.ok else '✗'} {r.name}: {r.detail}" for r in results)
