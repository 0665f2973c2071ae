"""The nbgrader markers in solutions/, spelled once: solution blocks and hidden-test blocks."""

from __future__ import annotations

import re

# A reference answer: generate_assignment replaces it with `raise NotImplementedError()`.
SOLUTION_BLOCK = re.compile(r"### BEGIN SOLUTION\n(.*?)### END SOLUTION", re.S)
# The marker lines alone (removed to get the answer as a student would write it).
SOLUTION_MARKER = re.compile(r"^[ \t]*### (BEGIN|END) SOLUTION[ \t]*\n", re.M)
# A hidden test's scenario (grader/scenarios.py): removed from released notebooks.
HIDDEN_BLOCK = re.compile(r"### BEGIN HIDDEN TESTS\n(.*?)### END HIDDEN TESTS", re.S)
