"""The kinds of cell in a course notebook, named once — answer, test, set-up, demo, claim, bootstrap,
the student's own, prose, and the written answer graded by hand.

A code cell's kind comes from its nbgrader metadata and its tags:

| kind      | nbgrader metadata                 | tag         | runs at grading |
| --------- | --------------------------------- | ----------- | --------------- |
| answer    | `solution: true`                  |             | the student's code |
| test      | `grade: true`, `points`           |             | its hidden scenario only |
| setup     | `locked: true` (read-only)        |             | yes |
| demo      | read-only                         | `demo`      | no |
| claim     | read-only                         | `claim`     | no |
| bootstrap | read-only                         | `bootstrap` | no |
| added     | none (a cell the student added)   |             | yes |

A markdown cell is prose, or a **written** answer: nbgrader's manually graded answer (`grade: true`, `solution:
true`, `points`), which no grader runs and a person grades; its points are apart from the autograded tests'.
`validate` (here) and the grader (grader/judge/grading.py) skip the same kinds.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from typing import Any

ANSWER, TEST, SETUP, DEMO, CLAIM, BOOTSTRAP, ADDED, PROSE, WRITTEN = (
    "answer", "test", "setup", "demo", "claim", "bootstrap", "added", "prose", "written")
SKIPPED = frozenset({DEMO, CLAIM, BOOTSTRAP})  # read-only kinds that carry no points and run nowhere but in Jupyter


def nbgrader(cell: Mapping[str, Any]) -> dict[str, Any]:
    """The cell's nbgrader metadata, or {} when it has none (or something that is not a dict) (notebook 00)."""
    info = (cell.get("metadata") or {}).get("nbgrader")
    return info if isinstance(info, dict) else {}


def grade_id(cell: Mapping[str, Any]) -> str:
    """The cell's nbgrader grade id, '' when it has none (notebook 00)."""
    return str(nbgrader(cell).get("grade_id") or "")


def kind(cell: Mapping[str, Any]) -> str:
    """One of ANSWER, TEST, SETUP, DEMO, CLAIM, BOOTSTRAP, ADDED (code cells), PROSE or WRITTEN (notebook 00)."""
    info = nbgrader(cell)
    if cell.get("cell_type") != "code":
        return WRITTEN if info.get("grade") and info.get("solution") else PROSE
    if not info:
        return ADDED
    if info.get("grade"):
        return TEST
    if info.get("solution"):
        return ANSWER
    tags = set((cell.get("metadata") or {}).get("tags") or [])
    return next((tag for tag in (DEMO, CLAIM, BOOTSTRAP) if tag in tags), SETUP)


def points(cells: list[Mapping[str, Any]], of: str = TEST) -> dict[str, float]:
    """grade id → points of every test cell (or, with `of=WRITTEN`, written answer), in notebook order (notebook 00)."""
    return {grade_id(c): float(nbgrader(c)["points"]) for c in cells if kind(c) == of}


def is_answered(cell: Mapping[str, Any], released: Mapping[str, Any]) -> bool:
    """Whether an answer or written-answer cell says something other than its released stub (notebook 00)."""
    def text(c: Mapping[str, Any]) -> str:
        source = c.get("source") or ""
        return ("".join(source) if isinstance(source, list) else str(source)).strip()

    return bool(text(cell)) and text(cell) != text(released)


# The largest cell whose names are read (a syntax tree takes hundreds of bytes per character: the grader parses
# students' cells in its own process, and a 2 MB cell would cost it a gigabyte). A longer cell defines nothing as far
# as the course can tell: it is never "only definitions", and names no copy of an answer.
MAX_PARSED_CHARS = 64 * 1024
LINE_BREAK = re.compile(r"\r\n|\r|\n")


def defined_names(source: str, imports: bool = True) -> list[str]:
    """The names a cell binds in the notebook's namespace (functions, classes, imports unless `imports` is False,
    assignments, loop and `with … as` targets, also inside `if`/`for`/`with`/`try` blocks and under IPython magics
    such as `%%time`), in order; none when it is not Python or longer than MAX_PARSED_CHARS (notebook 00)."""
    if len(source) > MAX_PARSED_CHARS:
        return []
    try:
        body = ast.parse(_without_magics(source)).body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    return list(dict.fromkeys(_bound(body, imports)))


def _without_magics(source: str) -> str:
    """The cell as Python: a leading cell magic's line and every line magic or shell line blanked."""
    lines = LINE_BREAK.split(source)  # Python's own line breaks: str.splitlines also splits at \x0c, \u2028 …
    if lines and lines[0].lstrip().startswith("%%"):
        lines[0] = ""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in lines)


def _bound(statements: list[ast.stmt], imports: bool) -> list[str]:
    names: list[str] = []
    for statement in statements:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(statement.name)
        elif isinstance(statement, (ast.Import, ast.ImportFrom)):
            names += [alias.asname or alias.name.split(".")[0] for alias in statement.names] if imports else []
        elif isinstance(statement, (ast.Assign, ast.AnnAssign)):
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            names += [name for target in targets for name in _stored(target)]
        else:  # a block: what its branches bind is bound too (a definition inside `for`, `with`, `if`, `try`)
            if isinstance(statement, (ast.For, ast.AsyncFor)):
                names += _stored(statement.target)
            elif isinstance(statement, (ast.With, ast.AsyncWith)):
                names += [name for item in statement.items if item.optional_vars for name in _stored(item.optional_vars)]
            for branch in ("body", "orelse", "finalbody"):
                names += _bound(getattr(statement, branch, []), imports)
            for handler in getattr(statement, "handlers", []):
                names += _bound(handler.body, imports)
    return names


def _stored(target: ast.expr) -> list[str]:
    """The names an assignment target binds: `x`, `x, (y, *z)`; not `model` in `model.w` nor `d`, `k` in `d[k]`."""
    return [n.id for n in ast.walk(target) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]
