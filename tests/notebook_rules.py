"""The prose-number rule every notebook keeps, a plain function over an executed notebook (tests/test_notebook_rules.py).

- Prose numbers: a number in a markdown cell is a definition (it occurs in the notebook's code, e.g. a
  quoted claim or a constant the cells use), is listed in the notebook's `metadata.tml.prose_numbers`
  (definitions such as 65536 or a bit width that no cell prints), or appears in the executed notebook's
  outputs. Anything else is a figure typed into prose.
"""

from __future__ import annotations

import re

import nbformat

# Numbers as prose writes them: 0.0187, 1e-2, 65,536, 2.67, 15 — not parts of words or identifiers.
NUMBER = re.compile(r"(?<![\w.§])(?:\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?(?:e-?\d+)?)(?![\w])")
# Places where a number is a name, not a measurement: headings, exercise and section references, points.
NOT_MEASURED = [
    re.compile(r"^#+ .*$", re.M),  # headings ("## 3. The gradient …")
    re.compile(r"\b(?:[Ee]xercises?|[Nn]otebooks?|[Ss]ection|[Ss]tep|[Cc]laim|article|§|[Ll]ayer|seed)\s*[\d.,§ and]+"),
    re.compile(r"\(\d+ points?\)|\b\d+ points?\b"),
    re.compile(r"\$[^$]*\$"),  # LaTeX: formulas define, they do not measure
    re.compile(r"`[^`]*`"),  # code spans name code
    re.compile(r"\[[^\]]*\]\([^)]*\)"),  # links
    re.compile(r"\b(?:19|20)\d\d\b"),  # years (McCandlish et al. 2018)
    re.compile(r"\d+(?:\.\d+)?\s*(?:GiB|GB|MiB|MB|bits?)\b"),
]
SMALL = 10  # integers below this are counting words ("two", "3 layers"), not measurements


def _numbers(text: str) -> list[str]:
    for pattern in NOT_MEASURED:
        text = pattern.sub(" ", text)
    return [m.group(0) for m in NUMBER.finditer(text)]


def _normal(token: str) -> float:
    return float(token.replace(",", ""))


def _printed(text: str) -> set[float]:
    found = set()
    for token in NUMBER.findall(text):
        try:
            found.add(_normal(token))
        except ValueError:
            pass
    return found


def prose_number_problems(executed: nbformat.NotebookNode) -> list[str]:
    """Numbers in markdown that no cell defines, prints or lists as a definition."""
    code = "\n".join(c.source for c in executed.cells if c.cell_type == "code")
    outputs = "\n".join(
        (o.get("text", "") if o.get("output_type") == "stream" else str(o.get("data", {}).get("text/plain", "")))
        for c in executed.cells if c.cell_type == "code" for o in c.get("outputs", []))
    known = _printed(code) | _printed(outputs)
    allowed = {str(x) for x in executed.metadata.get("tml", {}).get("prose_numbers", [])}
    problems = []
    for index, cell in enumerate(executed.cells):
        if cell.cell_type != "markdown":
            continue
        for token in _numbers(cell.source):
            value = _normal(token)
            if token in allowed or (value == int(value) and abs(value) < SMALL) or value in known:
                continue
            if any(abs(value - k) <= 0.5 * 10 ** -_decimals(token) for k in known):
                continue  # printed with more digits: 2.67 next to a printed 2.6667
            problems.append(f"cell {index}: {token!r} is typed into the prose; print it from a cell, or list it in "
                            "metadata.tml.prose_numbers if it is a definition")
    return problems


def _decimals(token: str) -> int:
    if "e" in token or "." not in token:
        return 0
    return len(token.split(".")[1])
