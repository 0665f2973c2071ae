"""The nbgrader markers in solutions/, spelled once: solution blocks, hidden-test blocks, and what is secret."""

from __future__ import annotations

import re

# A reference answer: generate_assignment replaces it with `raise NotImplementedError()`.
SOLUTION_BLOCK = re.compile(r"### BEGIN SOLUTION\n(.*?)### END SOLUTION", re.S)
# The marker lines alone (removed to get the answer as a student would write it).
SOLUTION_MARKER = re.compile(r"^[ \t]*### (BEGIN|END) SOLUTION[ \t]*\n", re.M)
# Either block's opening marker, anywhere (what must never reach a student).
ANY_MARKER = re.compile(r"BEGIN (?:SOLUTION|HIDDEN TESTS)")
# A hidden test's scenario (grader/judge/scenarios.py): removed from released notebooks.
HIDDEN_BLOCK = re.compile(r"### BEGIN HIDDEN TESTS\n(.*?)### END HIDDEN TESTS", re.S)


def secret_and_public(text: str, *, solutions: bool = True, hidden_tests: bool = True) -> tuple[list[str], str]:
    """A source cell's secret blocks (solutions and/or hidden tests) and the text a student may see."""
    secret = (SOLUTION_BLOCK.findall(text) if solutions else []) + (HIDDEN_BLOCK.findall(text) if hidden_tests else [])
    return secret, HIDDEN_BLOCK.sub("", SOLUTION_BLOCK.sub("", text))
