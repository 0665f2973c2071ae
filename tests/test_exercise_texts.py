"""No stub or exercise text gives away its answer (docs/contract.md, "Exercises make the student derive"): the
formulas and recipes in grader/mutants/forbidden.toml appear, in the released notebooks, only inside <details> hints."""

import re

import nbformat
import pytest
import tomllib

from grader.course import assignments
from grader.paths import MUTANTS
from labkit import cells

FORBIDDEN = {name: table["forbidden"]
             for name, table in tomllib.loads((MUTANTS / "forbidden.toml").read_text(encoding="utf-8")).items()}
HINTS = re.compile(r"<details>.*?</details>", re.S)


def normal(text: str) -> str:
    """Whitespace and case do not matter: `tr(Sigma) / B` and `tr(Sigma)/B` are one expression."""
    return "".join(text.split()).lower()


def found(text: str, expressions: list[str]) -> list[str]:
    return [e for e in expressions if normal(e) in normal(text)]


def exercises() -> dict[str, tuple[str, str]]:
    """Exercise name → (its released answer cell, all the markdown a student reads before it, hints left out)."""
    shown = {}
    for assignment in assignments():
        prose: list[str] = []
        for cell in nbformat.read(assignment.release, as_version=4).cells:
            if cells.kind(cell) == cells.PROSE:
                prose.append(HINTS.sub("", cell.source))
            elif cells.kind(cell) == cells.ANSWER:
                shown[cells.grade_id(cell).removesuffix("_answer")] = (cell.source, "\n".join(prose))
    return shown


EXERCISES = exercises()


def test_every_exercise_has_a_list_and_every_list_an_exercise():
    assert sorted(FORBIDDEN) == sorted(EXERCISES)
    assert all(FORBIDDEN.values())


@pytest.mark.parametrize("name", sorted(EXERCISES))
def test_neither_stub_nor_text_states_the_answer(name):
    stub, text = EXERCISES[name]
    leaks = {where: found(shown, FORBIDDEN[name]) for where, shown in (("stub", stub), ("text", text))}
    assert not any(leaks.values()), f"{name} gives its answer away: {leaks}"


def test_spacing_line_breaks_and_case_do_not_hide_an_expression():
    assert found("E = Tr(Sigma)  /\n B * (N-B)", ["tr(Sigma) / B *"]) == ["tr(Sigma) / B *"]
    assert not found("tr(Sigma) / N", ["tr(Sigma) / B *"])


def test_hints_are_left_out_of_the_text():
    assert HINTS.sub("", "ask <details><summary>Hint</summary>\n(N - B) / (N - 1)\n</details> why") == "ask  why"


# The visible part of a test cell is read before answering too (issue 35): its source and messages name mistakes,
# never the answer's formula.
def visible_tests() -> dict[str, str]:
    """Exercise name → the source of its released test cell (hidden tests are not released)."""
    shown = {}
    for assignment in assignments():
        for cell in nbformat.read(assignment.release, as_version=4).cells:
            if cells.kind(cell) == cells.TEST:
                shown[cells.grade_id(cell)] = cell.source.split("### BEGIN HIDDEN TESTS")[0]
    return shown


VISIBLE = visible_tests()


@pytest.mark.parametrize("name", sorted(VISIBLE))
def test_visible_test_does_not_state_the_answer(name):
    leaks = found(VISIBLE[name], FORBIDDEN.get(name, []))
    assert not leaks, f"the visible test of {name} gives its answer away: {leaks}"
