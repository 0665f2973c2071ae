"""The kinds of cell in a course notebook, named once — answer, test, set-up, demo, claim, bootstrap,
the student's own.

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

`validate` (here) and the grader (grader/judge/grading.py) skip the same kinds.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from typing import Any

ANSWER, TEST, SETUP, DEMO, CLAIM, BOOTSTRAP, ADDED, PROSE = (
    "answer", "test", "setup", "demo", "claim", "bootstrap", "added", "prose")
SKIPPED = frozenset({DEMO, CLAIM, BOOTSTRAP})  # read-only kinds that carry no points and run nowhere but in Jupyter


def nbgrader(cell: Mapping[str, Any]) -> dict[str, Any]:
    """The cell's nbgrader metadata, or {} when it has none (or something that is not a dict) (notebook 00)."""
    info = (cell.get("metadata") or {}).get("nbgrader")
    return info if isinstance(info, dict) else {}


def grade_id(cell: Mapping[str, Any]) -> str:
    """The cell's nbgrader grade id, '' when it has none (notebook 00)."""
    return str(nbgrader(cell).get("grade_id") or "")


def kind(cell: Mapping[str, Any]) -> str:
    """One of ANSWER, TEST, SETUP, DEMO, CLAIM, BOOTSTRAP, ADDED (code cells) or PROSE (notebook 00)."""
    if cell.get("cell_type") != "code":
        return PROSE
    info = nbgrader(cell)
    if not info:
        return ADDED
    if info.get("grade"):
        return TEST
    if info.get("solution"):
        return ANSWER
    tags = set((cell.get("metadata") or {}).get("tags") or [])
    return next((tag for tag in (DEMO, CLAIM, BOOTSTRAP) if tag in tags), SETUP)


def points(cells: list[Mapping[str, Any]]) -> dict[str, float]:
    """grade id → points of every test cell, in notebook order (notebook 00)."""
    return {grade_id(c): float(nbgrader(c)["points"]) for c in cells if kind(c) == TEST}


def defined_names(source: str) -> set[str]:
    """The names a cell's code defines at top level (functions, classes, assignments); none when it is not Python
    (notebook 00)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return set()
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names
