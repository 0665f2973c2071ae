"""helpers.graphs: torchviz's drawing when graphviz is there; without `dot`, a drawing of our own that names every node."""

import re
import sys
import xml.etree.ElementTree as ET
from collections import Counter

import pytest
import torch

from helpers import graphs


def small_graph():
    """A graph with a shared leaf (`a` feeds two branches), a parameter with a name, a leaf without one."""
    torch.manual_seed(0)
    a = torch.randn(3, requires_grad=True)
    b = torch.randn(3, requires_grad=True)
    out = (a * b).sin().sum() + a.exp().sum()
    return out, {"a": a}


def backward_nodes(out):
    """Every backward node reachable from out.grad_fn, each once (what the drawing must name)."""
    found, stack = {}, [out.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or id(fn) in found:
            continue
        found[id(fn)] = fn
        stack.extend(child for child, _ in fn.next_functions)
    return list(found.values())


@pytest.fixture
def no_dot(monkeypatch):
    monkeypatch.setattr(graphs.shutil, "which", lambda name: None)


def svg_texts(svg: str) -> list[str]:
    return [t.text for t in ET.fromstring(svg).iter("{http://www.w3.org/2000/svg}text")]


def test_with_graphviz_it_is_torchviz():
    try:
        graphs.require_dot()
    except graphs.GraphvizMissingError:
        pytest.skip("graphviz's dot is not installed")
    out, params = small_graph()
    graph = graphs.draw_graph(out, params)
    assert type(graph).__name__ == "Digraph"
    assert "SinBackward0" in graph.source and "ExpBackward0" in graph.source
    assert b"<svg" in graph.pipe(format="svg")


def test_require_dot_says_how_to_install(no_dot):
    with pytest.raises(graphs.GraphvizMissingError, match="apt-get install graphviz"):
        graphs.require_dot()


def test_without_dot_the_drawing_names_every_node(no_dot):
    out, params = small_graph()
    drawing = graphs.draw_graph(out, params)
    assert isinstance(drawing, graphs.SimpleGraphDrawing)
    nodes = backward_nodes(out)
    names = Counter(type(fn).__name__ for fn in nodes)
    assert names["AccumulateGrad"] == 2 and names["MulBackward0"] == 1  # the graph is what the test thinks it is
    # SVG: one box per backward node (shared ones once), plus the two leaves and the output.
    texts = Counter(svg_texts(drawing.svg))
    for name, count in names.items():
        assert texts[name] == count, (name, texts)
    assert texts["a"] == 1 and texts["(3)"] == 2 and texts["output"] == 1 and texts["()"] == 1
    # Text tree: every node named; the shared leaf `a` drawn once, then referred to.
    text = str(drawing)
    for name in names:
        assert name in text
    assert text.count("AccumulateGrad → a (3)") == 2 and text.count("(drawn above)") == 1


def test_without_dot_it_says_how_to_get_the_full_drawing(no_dot):
    out, params = small_graph()
    drawing = graphs.draw_graph(out, params)
    assert "apt-get install graphviz" in str(drawing) and "brew install graphviz" in str(drawing)
    assert "apt-get" in " ".join(svg_texts(drawing.svg)) and "not on PATH" in " ".join(svg_texts(drawing.svg))


def test_without_dot_it_displays_as_svg_and_text(no_dot):
    out, params = small_graph()
    drawing = graphs.draw_graph(out, params)
    bundle = drawing._repr_mimebundle_()
    assert bundle["image/svg+xml"].startswith("<svg") and "SinBackward0" in bundle["text/plain"]
    assert drawing.pipe(format="svg") == drawing.svg.encode() and "SinBackward0" in drawing.source
    with pytest.raises(graphs.GraphvizMissingError, match="install graphviz"):
        drawing.pipe(format="png")


def test_dot_missing_from_path(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no `dot` anywhere
    out, params = small_graph()
    drawing = graphs.draw_graph(out, params)
    assert isinstance(drawing, graphs.SimpleGraphDrawing) and "not on PATH" in drawing.note


def test_torchviz_missing(monkeypatch):
    if graphs.shutil.which("dot") is None:
        monkeypatch.setattr(graphs.shutil, "which", lambda name: "/usr/bin/dot")
    monkeypatch.setitem(sys.modules, "torchviz", None)  # `import torchviz` now raises ImportError
    out, params = small_graph()
    drawing = graphs.draw_graph(out, params)
    assert isinstance(drawing, graphs.SimpleGraphDrawing) and "torchviz cannot be imported" in drawing.note


def test_the_drawing_fits_its_viewbox_and_size(no_dot):
    out, params = small_graph()
    svg = graphs.draw_graph(out, params, show_saved=True, size="3,3").svg
    root = ET.fromstring(svg)
    _, _, width, height = map(float, root.get("viewBox").split())
    shift = float(re.search(r'translate\(([\d.]+),0\)', svg).group(1))
    for rect in root.iter("{http://www.w3.org/2000/svg}rect"):
        x = float(rect.get("x")) + (shift if rect.get("fill") != "white" else 0)
        assert x >= 0 and x + float(rect.get("width")) <= width + 0.5
        assert float(rect.get("y")) >= 0 and float(rect.get("y")) + float(rect.get("height")) <= height + 0.5
    assert float(root.get("width").removesuffix("pt")) < width  # scaled down to about 3 inches of graph


def test_saved_tensors_before_and_after_backward(no_dot):
    x = torch.randn(3, requires_grad=True)
    out = (x.exp() * x).sum()
    before = graphs.draw_graph(out, {"x": x}, show_saved=True)
    assert "saved result (3)" in str(before) and "result" in svg_texts(before.svg)
    out.backward()
    after = graphs.draw_graph(out, {"x": x}, show_saved=True)  # saved tensors freed: drawn without them
    assert "ExpBackward0" in str(after) and "saved" not in after.text


def test_a_tensor_without_graph(no_dot):
    drawing = graphs.draw_graph(torch.ones(2, 2))
    assert "no grad_fn" in str(drawing) and "(2, 2)" in svg_texts(drawing.svg)
