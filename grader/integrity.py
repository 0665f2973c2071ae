"""Static scan of the code a student controls for ways to fool the tests that run after it.

Tests run in the same kernel as the answers, so an answer cell could rebind `check_tensor`, patch
`torch.allclose`, hook IPython to rewrite the next cell, or reach the interpreter's internals. The
scan reads every answer cell and every cell the student added (never executing them) and reports
the first place that does any of that; autograde then withholds the points of every test cell
after it — the ones it could have fooled — and names the reason in the status column.

What counts, for code the student controls:
- rebinding at top level a name that a read-only or test cell defines (other than to the same import);
- assigning to or deleting an attribute or item of an imported module (`torch.allclose = …`);
- calling setattr/delattr/exec/eval/compile/__import__/globals/vars, or using get_ipython,
  `__builtins__`, IPython's `In`/`Out`/`_ih` history, or internals (`__code__`, `__globals__`, frames);
- importing builtins, importlib, ctypes, gc, inspect, linecache or sys.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

import nbformat
from IPython.core.inputtransformer2 import TransformerManager

FORBIDDEN_CALLS = {"setattr", "delattr", "exec", "eval", "compile", "__import__", "globals", "vars", "get_ipython"}
FORBIDDEN_NAMES = {"__builtins__", "In", "Out", "_ih", "_oh", "_ii", "_iii", "get_ipython"}
# Interpreter internals: function code and globals, and frames (which expose the running test's source).
FORBIDDEN_ATTRIBUTES = {"__code__", "__globals__", "__dict__", "__builtins__", "__closure__", "__traceback__",
                        "tb_frame", "f_back", "f_code", "f_globals", "f_locals", "gi_frame", "cr_frame"}
FORBIDDEN_MODULES = {"builtins", "importlib", "ctypes", "gc", "inspect", "linecache", "sys"}


@dataclass(frozen=True)
class Finding:
    """The first suspicious construct in one student cell."""

    cell_index: int
    cell_id: str
    reason: str


def _parse(source: str) -> ast.Module | None:
    try:
        return ast.parse(TransformerManager().transform_cell(source))  # %magics become get_ipython() calls
    except SyntaxError:
        return None  # it fails when it runs, costing only its own exercise


def _imports(tree: ast.AST) -> dict[str, str]:
    """Top-level name → module for every import in `tree`."""
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                bound[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return bound


def _top_level_bindings(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.For, ast.With)):
            for target in ast.walk(node):
                if isinstance(target, ast.Name) and isinstance(target.ctx, ast.Store):
                    names.add(target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update(_imports(node))
    return names


def _root_name(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _first_problem(tree: ast.Module, protected: set[str], allowed: set[str], modules: dict[str, str]) -> str | None:
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        rebound = _top_level_bindings(ast.Module(body=[node], type_ignores=[])) & (protected - allowed)
        if rebound:
            return f"redefines {sorted(rebound)[0]!r}, which the tests use"
    mine = _imports(tree)
    for name, module in mine.items():
        if name in protected and modules.get(name) != module:
            return f"rebinds {name!r} to {module}"
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            roots = [a.name.split(".")[0] for a in node.names] if isinstance(node, ast.Import) else [(node.module or "").split(".")[0]]
            if set(roots) & FORBIDDEN_MODULES:
                return f"imports {sorted(set(roots) & FORBIDDEN_MODULES)[0]}"
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FORBIDDEN_CALLS:
            return f"calls {node.func.id}()"
        elif isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            return f"uses {node.id}"
        elif isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_ATTRIBUTES:
            return f"touches .{node.attr}"
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for target in targets:
                root = _root_name(target)
                if isinstance(target, (ast.Attribute, ast.Subscript)) and root in {**modules, **mine}:
                    return f"patches {ast.unparse(target)} of an imported module"
    return None


def _defined(source: str) -> set[str]:
    tree = _parse(source)
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))} if tree else set()


def scan(nb: nbformat.NotebookNode, released: nbformat.NotebookNode) -> Finding | None:
    """The first student-controlled cell of a rebuilt submission that could fool later tests, if any.

    Student-controlled: answer cells and code cells without nbgrader metadata (added by the student).
    An answer cell may define the functions and classes its released stub defines, nothing protected else.
    """
    stubs = {c.metadata["nbgrader"]["grade_id"]: _defined(c.source)
             for c in released.cells if c.metadata.get("nbgrader", {}).get("solution")}
    protected: set[str] = set()
    modules: dict[str, str] = {}
    student: list[tuple[int, nbformat.NotebookNode]] = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        info = cell.metadata.get("nbgrader")
        tree = _parse(cell.source)
        if info and not info.get("solution"):
            if tree is not None:
                protected |= _top_level_bindings(tree)
                modules |= _imports(tree)
        else:
            student.append((index, cell))
    for index, cell in student:
        tree = _parse(cell.source)
        if tree is None:
            continue
        info = cell.metadata.get("nbgrader", {})
        allowed = stubs.get(info.get("grade_id"), set())
        problem = _first_problem(tree, protected, allowed, modules)
        if problem:
            return Finding(index, info.get("grade_id") or f"added cell #{index}", problem)
    return None
