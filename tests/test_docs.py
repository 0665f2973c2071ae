"""The documentation cannot rot: the site builds strictly, and what its pages quote exists (docs/documentation.md)."""

import argparse
import ast
import re
import subprocess
import sys

import nbformat
import pytest
from conftest import REPO

from grader.author.demo import demo_cells
from grader.cli import build_parser
from grader.course import assignment_named

DOCS = REPO / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
QUOTED = re.compile(r"`([^`\n]+)`")
# A quoted path into the repository: it starts with one of its folders and names no placeholder.
TOP = ("grader/", "tests/", "docs/", "helpers/", "labkit/", "scripts/", "benchmarks/", "solutions/", "notebooks/")


def page(relative: str) -> str:
    return (DOCS / relative).read_text(encoding="utf-8")


def quoted(text: str) -> list[str]:
    return [m.group(1) for m in QUOTED.finditer(text)]


@pytest.mark.integration
def test_the_site_builds_in_strict_mode(tmp_path):
    """What `./course docs` runs: a warning (a broken link, a page outside the table of contents) is an error."""
    course = (REPO / "course").read_text()
    assert '-m sphinx -W --keep-going -q -b html "$ROOT/docs"' in course
    run = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(DOCS),
                          str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    built = {p.relative_to(tmp_path).with_suffix("") for p in tmp_path.rglob("*.html")}
    assert {p.relative_to(DOCS).with_suffix("") for p in PAGES} <= built


def test_every_page_a_page_links_to_exists():
    """The fast tier's share of the strict build: a link to a missing page fails here before Sphinx runs."""
    for path in PAGES:
        for link in re.findall(r"\]\(([^)#:]+\.md)(?:#[^)]*)?\)", path.read_text(encoding="utf-8")):
            assert (path.parent / link).resolve() in PAGES, f"{path.relative_to(REPO)} links to a missing page {link}"


def test_every_repository_path_a_page_quotes_exists():
    missing = []
    for path in [*PAGES, REPO / "README.md"]:
        for text in quoted(path.read_text(encoding="utf-8")):
            candidate = text.split()[0].rstrip(".,;:)").split("::")[0]
            placeholder = re.search(r"[<>*…{}$]|NN|/K/|OUT", candidate)
            if candidate.startswith(TOP) and not placeholder and not (REPO / candidate).exists():
                missing.append(f"{path.relative_to(REPO)}: {candidate}")
    assert not missing, "pages quote paths that do not exist:\n" + "\n".join(missing)


def grader_commands() -> dict[str, set[str]]:
    """Each `python -m grader` sub-command (and `nbgrader init`) with the option strings it accepts."""
    parser = build_parser()
    found: dict[str, set[str]] = {}

    def walk(p: argparse.ArgumentParser, prefix: str) -> None:
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    found[f"{prefix}{name}"] = {s for a in sub._actions for s in a.option_strings}
                    walk(sub, f"{prefix}{name} ")
    walk(parser, "")
    return found


def test_every_grader_command_and_option_a_page_quotes_exists():
    commands = grader_commands()
    wrong = []
    for path in [*PAGES, REPO / "README.md"]:
        text = path.read_text(encoding="utf-8")
        for line in [*quoted(text), *re.findall(r"^\S*\./course grader .*$", text, re.M)]:
            for call in re.findall(r"(?:\./course grader|python -m grader) ([a-z][\w-]*(?: init)?)([^`|;&]*)", line):
                name, rest = call
                name = name if name in commands else name.split()[0]
                if name not in commands:
                    wrong.append(f"{path.relative_to(REPO)}: no sub-command {name!r}")
                    continue
                wrong += [f"{path.relative_to(REPO)}: `{name}` has no option {opt}"
                          for opt in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", rest) if opt not in commands[name]]
    assert not wrong, "\n".join(wrong)


def test_the_contract_page_lists_every_exercise_with_its_signature_and_docstring():
    stated = re.findall(r"^\| (\d\d) \| `(.+?)` \| (.*) \|$", page("contract.md"), re.M)
    defined = []
    for source in sorted((REPO / "solutions").glob("*/*.ipynb")):
        for cell in nbformat.read(source, as_version=4).cells:
            if cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("solution"):
                for node in ast.parse(cell.source).body:
                    if isinstance(node, ast.FunctionDef | ast.ClassDef) and ast.get_docstring(node):
                        line = cell.source.splitlines()[node.lineno - 1]
                        signature = re.sub(r"^(def|class) ", "", line).rstrip(":")
                        doc = " ".join(ast.get_docstring(node).split()).replace("|", "\\|")
                        defined.append((source.name[:2], signature, doc))
    assert stated == defined


def test_the_lecturer_page_names_each_notebooks_demo_cells_in_order():
    rows = dict(re.findall(r"^\| (\d\d) \| (`demo_.*?) \|", page("lecturer.md"), re.M))
    assert sorted(rows) == [f"{n:02d}" for n in range(1, 8)]
    for number, names in rows.items():
        assert re.findall(r"`(\w+)`", names) == [gid for _, _, gid, _ in demo_cells(assignment_named(number).source)]


def test_readme_is_short_and_links_every_role_to_an_existing_page():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 150
    for role in ("a student", "an instructor", "a lecturer", "a contributor"):
        assert re.search(rf"^\| {role} \| \[", readme, re.M), role
    for link in re.findall(r"\]\(([^)#:]+)\)", readme):
        assert (REPO / link).exists(), link


def test_nothing_cites_a_design_file_outside_the_repository():
    """The contract is docs/contract.md; shared/COURSE.md is not in this repository."""
    texts = [*PAGES, REPO / "README.md", *REPO.glob("grader/**/*.py")]
    assert not [p for p in texts if "COURSE.md" in p.read_text(encoding="utf-8")]
