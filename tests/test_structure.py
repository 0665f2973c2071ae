"""The code's shape (CONTRIBUTING.md): no module over 500 lines, no function over 80, no import cycle.

Checked over grader/, helpers/ and labkit/ from their source (nothing is imported). An import inside a
function counts like one at the top: deferring an import hides a cycle from Python, not from a reader.
Offenders that a piece of work in progress is splitting are listed below with the issue that owns them;
an entry that no longer offends fails the test too, so the lists only shrink.
"""

import ast
from pathlib import Path

from conftest import REPO

PACKAGES = ("grader", "helpers", "labkit")
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80

# Offenders that another piece of work is splitting, each with the issue that owns it (empty: none now).
ALLOWED_LONG_MODULES: set[str] = set()
ALLOWED_LONG_FUNCTIONS: set[str] = set()


def _sources() -> dict[str, Path]:
    """Module name → file, for every module of the three packages."""
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


SOURCES = _sources()
TREES = {name: ast.parse(path.read_text(encoding="utf-8"), filename=str(path)) for name, path in SOURCES.items()}


def _where(name: str) -> str:
    return SOURCES[name].relative_to(REPO).as_posix()


def _functions(node: ast.AST, prefix: str = ""):
    """(qualified name, lines) of every function and method under `node`, nested ones included."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = f"{prefix}{child.name}"
            yield name, child.end_lineno - child.lineno + 1
            yield from _functions(child, f"{name}.")
        elif isinstance(child, ast.ClassDef):
            yield from _functions(child, f"{prefix}{child.name}.")
        else:
            yield from _functions(child, prefix)


def _imported(name: str) -> set[str]:
    """The modules of the three packages that module `name` imports anywhere in its text, with their packages
    (importing a.b.c runs a/__init__.py and a/b/__init__.py first)."""
    is_package = SOURCES[name].name == "__init__.py"
    targets: set[str] = set()
    for node in ast.walk(TREES[name]):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[:len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets.add(module)
            targets.update(f"{module}.{alias.name}" for alias in node.names)  # `from package import module`
    with_packages = {".".join(t.split(".")[:i]) for t in targets for i in range(1, t.count(".") + 2)}
    return {t for t in with_packages if t in SOURCES and t != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_no_module_over_500_lines():
    long = {_where(name): len(path.read_text(encoding="utf-8").splitlines()) for name, path in SOURCES.items()}
    offenders = {where for where, lines in long.items() if lines > MAX_MODULE_LINES}
    assert offenders - ALLOWED_LONG_MODULES == set(), {w: long[w] for w in offenders - ALLOWED_LONG_MODULES}
    assert ALLOWED_LONG_MODULES - offenders == set(), "split already: remove from ALLOWED_LONG_MODULES"


def test_no_function_over_80_lines():
    long = {f"{_where(name)}::{function}": lines for name, tree in TREES.items() for function, lines in _functions(tree)}
    offenders = {where for where, lines in long.items() if lines > MAX_FUNCTION_LINES}
    assert offenders - ALLOWED_LONG_FUNCTIONS == set(), {w: long[w] for w in offenders - ALLOWED_LONG_FUNCTIONS}
    assert ALLOWED_LONG_FUNCTIONS - offenders == set(), "split already: remove from ALLOWED_LONG_FUNCTIONS"


def test_no_import_cycle():
    assert _cycles({name: _imported(name) for name in SOURCES}) == []


def test_the_checks_see_what_they_look_for():
    """The three checks on made-up code: a long function, a cycle through a deferred import, a relative import."""
    tree = ast.parse("class K:\n    def m(self):\n        def inner():\n" + "            pass\n" * 90)
    assert dict(_functions(tree)) == {"K.m": 92, "K.m.inner": 91}
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    harness = "grader.kernel.harness"
    assert "grader.kernel.probe" in _imported(harness) and "grader.kernel" in _imported(harness)
