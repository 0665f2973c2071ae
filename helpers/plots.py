"""Plots readable from the back of a lecture room: one style, loss curves, loss contours (notebook 01)."""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import matplotlib.pyplot as plt
import torch

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType

LECTURE_STYLE: dict[RcKeyType, object] = {
    "figure.figsize": (10, 5.5),
    "figure.dpi": 90,
    "font.size": 15,
    "axes.titlesize": 17,
    "axes.labelsize": 16,
    "xtick.labelsize": 14,
    "ytick.labelsize": 14,
    "legend.fontsize": 13,
    "lines.linewidth": 2.8,
    "lines.markersize": 7,
    "axes.grid": True,
    "grid.alpha": 0.3,
}


def use_lecture_style() -> None:
    """Large fonts and thick lines for every later figure; call once per notebook (notebook 01)."""
    plt.rcParams.update(LECTURE_STYLE)


def show_figure(fig: plt.Figure) -> None:
    """Show `fig` as one PNG render, skipping the inline backend's second, cropping pass: for slider callbacks (notebook 01)."""
    from IPython.display import Image, display

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    display(Image(data=buffer.getvalue()))


def _finite_prefix(values: Sequence[float]) -> list[float]:
    out: list[float] = []
    for v in values:
        if not math.isfinite(v):
            break
        out.append(v)
    return out


def plot_losses(
    curves: Mapping[str, Sequence[float]],
    *,
    ax: plt.Axes | None = None,
    title: str = "Training loss",
    xlabel: str = "step",
    logy: bool = True,
) -> plt.Axes:
    """One line per named loss curve; a curve that blows up ends with a ✕ where it left the finite range (notebook 01)."""
    if ax is None:
        _, ax = plt.subplots()
    for label, values in curves.items():
        finite = _finite_prefix(list(values))
        (line,) = ax.plot(range(len(finite)), finite, label=label)
        if len(finite) < len(values) and finite:
            ax.plot(len(finite) - 1, finite[-1], "x", color=line.get_color(), markersize=14, mew=3)
    if logy:
        ax.set_yscale("log")
    ax.set(title=title, xlabel=xlabel, ylabel="loss")
    ax.legend()
    return ax


def plot_loss_contours(
    loss_fn: Callable[[torch.Tensor], torch.Tensor],
    trajectories: Mapping[str, torch.Tensor],
    *,
    center: torch.Tensor,
    radius: float,
    ax: plt.Axes | None = None,
    resolution: int = 120,
    title: str = "Loss contours and optimizer paths",
) -> plt.Axes:
    """Contours of a loss around `center` with each trajectory ([k, 2]) on top (notebook 01).

    `loss_fn` maps a batch of parameter vectors [m, 2] to their losses [m], so the grid is one call.
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 7))
    axis = torch.linspace(-radius, radius, resolution, dtype=torch.float64)
    W0, W1 = torch.meshgrid(axis + float(center[0]), axis + float(center[1]), indexing="xy")
    grid = torch.stack([W0.flatten(), W1.flatten()], dim=1)
    Z = loss_fn(grid).detach().double().reshape(W0.shape)
    levels = torch.quantile(Z.flatten(), torch.linspace(0.0, 0.95, 14, dtype=torch.float64)).unique()
    ax.contour(W0.numpy(), W1.numpy(), Z.numpy(), levels=levels.numpy(), cmap="viridis", linewidths=1.5)
    for label, path in trajectories.items():
        path = path.detach().double()
        inside = (path - center.double()).abs().max(dim=1).values <= 1.5 * radius
        shown = path[: int(inside.long().cumprod(0).sum())] if not bool(inside.all()) else path
        ax.plot(shown[:, 0].numpy(), shown[:, 1].numpy(), "o-", label=label, markersize=5)
    ax.plot(float(center[0]), float(center[1]), "*", color="black", markersize=18, label="minimum")
    ax.set(xlim=(float(center[0]) - radius, float(center[0]) + radius),
           ylim=(float(center[1]) - radius, float(center[1]) + radius),
           xlabel="w[0]", ylabel="w[1]", title=title)
    ax.legend(loc="upper right")
    return ax
