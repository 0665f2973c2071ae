"""Drawing autograd graphs: torchviz when graphviz is installed, a simple drawing of our own when not (notebook 00)."""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from html import escape
from typing import cast

import torch

INSTALL_GRAPHVIZ = (
    "install graphviz with `./course setup` (Debian/Ubuntu, runs apt-get install graphviz), "
    "`conda install -c conda-forge graphviz`, or `brew install graphviz`, then restart the kernel."
)


class GraphvizMissingError(RuntimeError):
    """Raised by `require_dot` when the graphviz `dot` program is not installed (notebook 00)."""


def require_dot() -> str:
    """Path of graphviz's `dot`, or an error that says how to install it (notebook 00)."""
    dot = shutil.which("dot")
    if dot is None:
        raise GraphvizMissingError(
            "torchviz needs the graphviz program `dot`, which is not on PATH: " + INSTALL_GRAPHVIZ
        )
    return dot


def draw_graph(
    output: torch.Tensor | Sequence[torch.Tensor],
    params: Mapping[str, torch.Tensor] | None = None,
    *,
    show_saved: bool = False,
    size: str = "9,9",
):
    """Drawing of the backward graph behind `output` (notebook 00).

    With graphviz's `dot` and torchviz: torchviz's drawing (a graphviz.Digraph). Without them: a
    `SimpleGraphDrawing` of the same nodes (SVG in Jupyter, a text tree with `print`) that says how to
    get the full drawing. Either displays with `display(...)` or as a cell's last expression.
    `show_saved=True` adds the tensors each node saved for backward; call it before `backward()`
    (or after `backward(retain_graph=True)`), because backward frees them.
    """
    try:
        require_dot()
        from torchviz import make_dot  # imported here: torchviz is optional until a graph is drawn
    except GraphvizMissingError:
        return SimpleGraphDrawing(output, params, show_saved=show_saved, size=size,
                                  reason="graphviz's `dot` program is not on PATH")
    except ImportError as err:  # e.g. torchviz not installed, or its `distutils` import on Python >= 3.12
        return SimpleGraphDrawing(output, params, show_saved=show_saved, size=size,
                                  reason=f"torchviz cannot be imported ({err})")

    graph = make_dot(output, params=dict(params or {}), show_attrs=show_saved, show_saved=show_saved)
    graph.graph_attr.update(size=size)  # no dpi: graphviz would scale the SVG drawing past its viewBox
    graph.node_attr.update(fontsize="14")
    return graph


# --- the drawing without graphviz -------------------------------------------------------------------

_FILL = {"output": "#caff70", "variable": "#add8e6", "saved": "#ffa500", "function": "#d3d3d3", "dummy": "none"}
_FONT = 14  # px, monospace: a character is about 0.6 font sizes wide
_CHAR = 0.6 * _FONT
_LINE = _FONT + 4
_PAD = 8
_ROW_GAP = 36
_COL_GAP = 20
_SAVED_PREFIX = "_saved_"


@dataclass
class _Node:
    lines: list[str]
    kind: str  # output, variable, saved, function, dummy
    width: float = 0.0
    height: float = 0.0
    x: float = 0.0  # centre
    y: float = 0.0  # top
    layer: int = 0


@dataclass
class _Graph:
    nodes: dict[object, _Node] = field(default_factory=dict)  # key → node, in discovery order
    edges: list[tuple[object, object, bool]] = field(default_factory=list)  # (upper, lower, arrow): input side on top


def _shape(t: torch.Tensor) -> str:
    return "(" + ", ".join(str(s) for s in t.shape) + ")"


def _label(name: str, t: torch.Tensor) -> list[str]:
    return [name, _shape(t)] if name else [_shape(t)]


def _collect(outputs: Sequence[torch.Tensor], params: Mapping[str, torch.Tensor], show_saved: bool) -> _Graph:
    """The nodes and edges torchviz would draw: outputs, grad_fn nodes, leaf variables, saved tensors."""
    names = {id(v): k for k, v in params.items()}
    graph = _Graph()

    def add_function(fn) -> int:
        key = id(fn)
        if key in graph.nodes:
            return key
        graph.nodes[key] = _Node([type(fn).__name__], "function")
        variable = getattr(fn, "variable", None)
        if isinstance(variable, torch.Tensor):  # AccumulateGrad: the leaf it accumulates into
            graph.nodes[id(variable)] = _Node(_label(names.get(id(variable), ""), variable), "variable")
            graph.edges.append((id(variable), key, True))
        if show_saved:
            for attr in sorted(a for a in dir(fn) if a.startswith(_SAVED_PREFIX)):
                try:
                    value = getattr(fn, attr)
                except RuntimeError:  # freed by an earlier backward()
                    continue
                label = attr[len(_SAVED_PREFIX):]
                tensors = [(label, value)] if isinstance(value, torch.Tensor) else (
                    [(f"{label}[{i}]", t) for i, t in enumerate(value) if isinstance(t, torch.Tensor)]
                    if isinstance(value, tuple) else [])
                for name, tensor in tensors:  # keyed by node and name: a saved leaf may also be drawn as a variable
                    graph.nodes[(key, name)] = _Node(_label(name, tensor), "saved")
                    graph.edges.append(((key, name), key, False))
        for child, _ in getattr(fn, "next_functions", ()):
            if child is not None:
                graph.edges.append((add_function(child), key, True))
        return key

    for out in outputs:
        graph.nodes[id(out)] = _Node(_label(names.get(id(out), "output"), out), "output")
        if out.grad_fn is not None:
            graph.edges.append((add_function(out.grad_fn), id(out), True))
    return graph


Polyline = tuple[list[tuple[float, float]], bool]  # an edge's points, and whether it ends in an arrow


def _layout(graph: _Graph) -> tuple[list[Polyline], float, float]:
    """Layered layout: outputs in the bottom row, each node one row above the lowest node it feeds.

    Edges that skip rows pass through invisible dummy nodes, so they bend around the rows they cross;
    a few barycentre sweeps order each row to reduce crossings. Returns the edges as polylines and the
    drawing's width and height.
    """
    depth = _layers(graph)
    chains = _chains(graph, depth)
    top = max(n.layer for n in graph.nodes.values())
    rows: list[list[object]] = [[] for _ in range(top + 1)]
    for key, node in graph.nodes.items():
        rows[node.layer].append(key)
    ups: dict[object, list[object]] = {k: [] for k in graph.nodes}
    downs: dict[object, list[object]] = {k: [] for k in graph.nodes}
    for chain, _ in chains:
        for a, b in zip(chain, chain[1:]):
            downs[a].append(b)
            ups[b].append(a)
    _order_rows(rows, ups, downs)
    width = _place_columns(graph, rows, ups, downs)
    height = _place_rows(graph, rows)
    polylines = []
    for chain, arrow in chains:
        points = [(graph.nodes[chain[0]].x, graph.nodes[chain[0]].y + graph.nodes[chain[0]].height)]
        points += [(graph.nodes[k].x, graph.nodes[k].y + graph.nodes[k].height / 2) for k in chain[1:-1]]
        points.append((graph.nodes[chain[-1]].x, graph.nodes[chain[-1]].y))
        polylines.append((points, arrow))
    return polylines, width, height


def _layers(graph: _Graph) -> dict[object, int]:
    """Each node's row: its longest path down to an output. Sets every node's layer and box size."""
    below: dict[object, list[object]] = {k: [] for k in graph.nodes}
    for upper, lower, _ in graph.edges:
        below[upper].append(lower)
    depth: dict[object, int] = {}

    def depth_of(key: object) -> int:  # the graph has no cycles
        if key not in depth:
            depth[key] = 0  # guard; overwritten below
            depth[key] = 1 + max((depth_of(k) for k in below[key]), default=-1)
        return depth[key]

    for key in graph.nodes:
        depth_of(key)
    for key, node in graph.nodes.items():
        node.layer = depth[key]
        node.width = max(len(line) for line in node.lines) * _CHAR + 2 * _PAD
        node.height = len(node.lines) * _LINE + _PAD
    return depth


def _chains(graph: _Graph, depth: dict[object, int]) -> list[tuple[list[object], bool]]:
    """Every edge as a chain of nodes: long edges pass through dummy nodes (added to `graph`), one per row crossed."""
    chains: list[tuple[list[object], bool]] = []
    for upper, lower, arrow in graph.edges:
        chain = [upper]
        for layer in range(depth[upper] - 1, depth[lower], -1):
            dummy = ("dummy", len(graph.nodes))
            graph.nodes[dummy] = _Node([], "dummy", width=2.0, height=_LINE, layer=layer)
            chain.append(dummy)
        chains.append((chain + [lower], arrow))
    return chains


def _order_rows(rows: list[list[object]], ups: dict[object, list[object]], downs: dict[object, list[object]]) -> None:
    """Order each row by its neighbours' mean position (barycentre sweeps), in place, to reduce crossings."""

    def reorder(row: list[object], neighbours: dict[object, list[object]], position: dict[object, float]) -> list[object]:
        def centre(key: object) -> float:
            near = [position[k] for k in neighbours[key] if k in position]
            return sum(near) / len(near) if near else position.get(key, 0.0)
        return sorted(row, key=centre)

    top = len(rows) - 1
    for _ in range(3):  # alternate sweeps: upwards from the outputs, then downwards from the leaves
        position = {k: float(i) for row in rows for i, k in enumerate(row)}
        for layer in range(1, top + 1):
            rows[layer] = reorder(rows[layer], downs, position)
            position.update({k: float(i) for i, k in enumerate(rows[layer])})
        for layer in range(top - 1, -1, -1):
            rows[layer] = reorder(rows[layer], ups, position)
            position.update({k: float(i) for i, k in enumerate(rows[layer])})


def _place_columns(graph: _Graph, rows: list[list[object]], ups: dict[object, list[object]],
                   downs: dict[object, list[object]]) -> float:
    """Each node's x: rows packed and centred, then each node pulled towards its neighbours' mean without
    overlaps. Returns the drawing's width."""
    widths = [sum(graph.nodes[k].width for k in row) + _COL_GAP * (len(row) - 1) for row in rows]
    for layer, row in enumerate(rows):
        x = (max(widths) - widths[layer]) / 2
        for key in row:
            graph.nodes[key].x = x + graph.nodes[key].width / 2
            x += graph.nodes[key].width + _COL_GAP

    def pull(row: list[object], neighbours: dict[object, list[object]]) -> None:
        nodes = [graph.nodes[k] for k in row]
        wanted = [sum(graph.nodes[k].x for k in neighbours[key]) / len(neighbours[key]) if neighbours[key] else n.x
                  for key, n in zip(row, nodes)]
        placed: list[float] = []
        for i, n in enumerate(nodes):  # left to right, each at least a gap right of the previous one
            lowest = placed[-1] + (nodes[i - 1].width + n.width) / 2 + _COL_GAP if placed else -float("inf")
            placed.append(max(wanted[i], lowest))
        shift = sum(w - p for w, p in zip(wanted, placed)) / len(placed)  # pushed right: move the row back
        for n, p in zip(nodes, placed):
            n.x = p + shift

    top = len(rows) - 1
    for _ in range(4):
        for layer in range(1, top + 1):
            pull(rows[layer], downs)
        for layer in range(top - 1, -1, -1):
            pull(rows[layer], ups)
    left = min(n.x - n.width / 2 for n in graph.nodes.values())
    for n in graph.nodes.values():
        n.x += _PAD - left
    return max(n.x + n.width / 2 for n in graph.nodes.values()) + _PAD


def _place_rows(graph: _Graph, rows: list[list[object]]) -> float:
    """Each node's y, the top row holding the leaves, each box centred in its row; the drawing's height."""
    y: float = _PAD
    for layer in range(len(rows) - 1, -1, -1):
        row = rows[layer]
        height = max(graph.nodes[k].height for k in row)
        for key in row:
            graph.nodes[key].y = y + (height - graph.nodes[key].height) / 2
        y += height + _ROW_GAP
    return y - _ROW_GAP + _PAD


class SimpleGraphDrawing:
    """The backward graph drawn without graphviz: SVG in Jupyter, a text tree with `print` (notebook 00).

    Same nodes as torchviz's drawing — the output (green), one box per backward node (grey), the
    leaf each AccumulateGrad feeds (blue), saved tensors with `show_saved` (orange) — in a simple
    layered layout. `draw_graph` returns it when graphviz's `dot` or torchviz is missing.
    """

    def __init__(self, output: torch.Tensor | Sequence[torch.Tensor], params: Mapping[str, torch.Tensor] | None = None,
                 *, show_saved: bool = False, size: str = "9,9", reason: str = "graphviz is not installed"):
        # anything but a tuple or list is the one output tensor, as the signature means
        outputs: list[torch.Tensor] = list(output) if isinstance(output, (tuple, list)) else [cast(torch.Tensor, output)]
        params = dict(params or {})
        self.reason = reason
        self.note = f"Simple drawing: {reason}. For torchviz's full drawing, " + INSTALL_GRAPHVIZ
        self.text = _tree(outputs, params, show_saved)
        self.svg = _svg(_collect(outputs, params, show_saved), size, self.note)

    @property
    def source(self) -> str:
        """The text tree (graphviz.Digraph.source is its dot text: both name every node)."""
        return self.text

    def pipe(self, format: str = "svg") -> bytes:
        """The drawing as bytes, like graphviz.Digraph.pipe; only SVG exists without graphviz."""
        if format != "svg":
            raise GraphvizMissingError(f"only SVG is available without graphviz ({self.reason}): " + INSTALL_GRAPHVIZ)
        return self.svg.encode()

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, str]:
        return {"image/svg+xml": self.svg, "text/plain": str(self)}

    def __str__(self) -> str:
        return f"{self.text}\n({self.note})"

    def __repr__(self) -> str:
        return f"<SimpleGraphDrawing: {self.reason}>"


def _tree(outputs: Sequence[torch.Tensor], params: Mapping[str, torch.Tensor], show_saved: bool) -> str:
    """The graph as an indented tree from each output; a node reached again is named, not repeated."""
    names = {id(v): k for k, v in params.items()}
    lines: list[str] = []
    seen: set[int] = set()

    def label(fn) -> str:
        text = type(fn).__name__
        variable = getattr(fn, "variable", None)
        if isinstance(variable, torch.Tensor):
            text += f" → {names.get(id(variable), 'leaf')} {_shape(variable)}"
        return text

    def visit(fn, prefix: str, last: bool) -> None:
        lines.append(prefix + ("└─ " if last else "├─ ") + label(fn) + (" (drawn above)" if id(fn) in seen else ""))
        if id(fn) in seen:
            return
        seen.add(id(fn))
        inner = prefix + ("   " if last else "│  ")
        saved = []
        if show_saved:
            for attr in sorted(a for a in dir(fn) if a.startswith(_SAVED_PREFIX)):
                try:
                    value = getattr(fn, attr)
                except RuntimeError:
                    continue
                if isinstance(value, torch.Tensor):
                    saved.append(f"saved {attr[len(_SAVED_PREFIX):]} {_shape(value)}")
        children = [c for c, _ in getattr(fn, "next_functions", ()) if c is not None]
        for i, text in enumerate(saved):
            lines.append(inner + ("└─ " if i == len(saved) - 1 and not children else "├─ ") + text)
        for i, child in enumerate(children):
            visit(child, inner, i == len(children) - 1)

    for out in outputs:
        lines.append(f"output {names.get(id(out), '')} {_shape(out)}".replace("  ", " "))
        if out.grad_fn is None:
            lines.append("└─ (no grad_fn: a leaf, or computed without autograd)")
        else:
            visit(out.grad_fn, "", True)
    return "\n".join(lines)


def _svg(graph: _Graph, size: str, note: str) -> str:
    """SVG of the laid-out graph with the note underneath, scaled down to `size` inches (graphviz's meaning)."""
    edges, graph_width, height = _layout(graph)
    note_font = 12
    note_lines = textwrap.wrap(note, int(max(graph_width, 420) / (0.6 * note_font)) - 2)  # as wide as the graph
    width = max(graph_width, max(len(line) for line in note_lines) * 0.6 * note_font + 2 * _PAD)
    note_top = height + 6
    total_height = note_top + len(note_lines) * (note_font + 4) + _PAD
    parts = ['<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="8" markerHeight="8" '
             'orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="black"/></marker></defs>',
             f'<rect x="0" y="0" width="{width:.1f}" height="{total_height:.1f}" fill="white"/>']
    # Centre the graph horizontally when the note is wider.
    shift = (width - max((n.x + n.width / 2 for n in graph.nodes.values()), default=0) - _PAD) / 2
    parts.append(f'<g transform="translate({max(shift, 0):.1f},0)">')
    for points, arrow in edges:
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
        parts.append(f'<polyline points="{path}" fill="none" stroke="black" stroke-width="1.2"'
                     + (' marker-end="url(#arrow)"/>' if arrow else ' stroke-dasharray="4,3"/>'))
    for node in graph.nodes.values():
        if node.kind == "dummy":
            continue
        left = node.x - node.width / 2
        parts.append(f'<rect x="{left:.1f}" y="{node.y:.1f}" width="{node.width:.1f}" height="{node.height:.1f}" '
                     f'fill="{_FILL[node.kind]}" stroke="black"/>')
        for i, line in enumerate(node.lines):
            baseline = node.y + _PAD / 2 + (i + 1) * _LINE - 4
            parts.append(f'<text x="{node.x:.1f}" y="{baseline:.1f}" text-anchor="middle">{escape(line)}</text>')
    parts.append("</g>")
    for i, line in enumerate(note_lines):
        parts.append(f'<text x="{_PAD}" y="{note_top + (i + 1) * (note_font + 4):.1f}" '
                     f'font-size="{note_font}" fill="#444">{escape(line)}</text>')
    try:
        max_w, max_h = (float(v) * 72 for v in size.split(","))  # graphviz: inches at 72 points each
        scale = min(1.0, max_w / graph_width, max_h / height)  # the graph fits `size`; the note may stick out
    except ValueError:
        scale = 1.0
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width * scale:.0f}pt" height="{total_height * scale:.0f}pt" '
            f'viewBox="0 0 {width:.1f} {total_height:.1f}" font-family="monospace" font-size="{_FONT}">'
            + "".join(parts) + "</svg>")
