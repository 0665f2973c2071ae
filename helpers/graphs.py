"""Drawing autograd graphs with torchviz, failing with a fix when graphviz is missing (notebook 00)."""

from __future__ import annotations

import shutil
from collections.abc import Mapping

import torch


class GraphvizMissingError(RuntimeError):
    """Raised when the graphviz `dot` program is not installed (notebook 00)."""


def require_dot() -> str:
    """Path of graphviz's `dot`, or an error that says how to install it (notebook 00)."""
    dot = shutil.which("dot")
    if dot is None:
        raise GraphvizMissingError(
            "torchviz needs the graphviz program `dot`, which is not on PATH. Install it with "
            "`./course setup` (Debian/Ubuntu, runs apt-get install graphviz), "
            "`conda install -c conda-forge graphviz`, or `brew install graphviz`, then restart the kernel."
        )
    return dot


def draw_graph(
    output: torch.Tensor,
    params: Mapping[str, torch.Tensor] | None = None,
    *,
    show_saved: bool = False,
    size: str = "9,9",
):
    """torchviz drawing of the graph behind `output` (returns a graphviz.Digraph) (notebook 00).

    `show_saved=True` lists the tensors each node saved for backward; call it before `backward()`
    (or after `backward(retain_graph=True)`), because backward frees them.
    """
    require_dot()
    from torchviz import make_dot  # imported here: torchviz is optional until a graph is drawn

    graph = make_dot(output, params=dict(params or {}), show_attrs=show_saved, show_saved=show_saved)
    graph.graph_attr.update(size=size)  # no dpi: graphviz would scale the SVG drawing past its viewBox
    graph.node_attr.update(fontsize="14")
    return graph
