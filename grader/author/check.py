"""`check`: prove that notebooks/ is right — current, stripped, leak-free, with consistent nbgrader metadata."""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path

import nbformat

from grader.author.markers import ANY_MARKER, HIDDEN_BLOCK, SOLUTION_BLOCK, secret_and_public
from grader.author.release import generate
from grader.course import assignments
from grader.paths import NOTEBOOKS, REPO, SOLUTIONS
from labkit import cells


def _shown(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".ipynb_checkpoints" not in p.parts and "__pycache__" not in p.parts
    }


def stale_problems() -> list[str]:
    """Differences between notebooks/ and a fresh generation from solutions/."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = _files(generate(Path(tmp)) / "release")
    committed = _files(NOTEBOOKS) if NOTEBOOKS.exists() else {}
    problems = [f"notebooks/{name} is missing: run `python -m grader release`" for name in fresh.keys() - committed.keys()]
    problems += [f"notebooks/{name} has no source in solutions/" for name in committed.keys() - fresh.keys()]
    problems += [
        f"notebooks/{name} is stale against solutions/: run `python -m grader release`"
        for name in fresh.keys() & committed.keys()
        if fresh[name] != committed[name]
    ]
    return sorted(problems)


def secret_lines(source_nb: nbformat.NotebookNode, *, solutions: bool = True, hidden_tests: bool = True) -> set[str]:
    """Lines of solutions and/or hidden tests that occur nowhere else in the source notebook."""
    secret: set[str] = set()
    public: set[str] = set()
    for cell in source_nb.cells:
        blocks, shown = secret_and_public(cell.source + "\n", solutions=solutions, hidden_tests=hidden_tests)
        secret.update(line.strip() for line in "".join(blocks).splitlines())
        public.update(line.strip() for line in shown.splitlines())
    return {line for line in secret - public if len(line) >= 8 and not line.startswith("#")}


def leak_problems(release_root: Path = NOTEBOOKS) -> list[str]:
    """Solution or hidden-test lines that reached a released notebook."""
    problems = []
    for assignment in assignments():
        released = release_root / assignment.name / assignment.notebook
        if not released.exists():
            continue
        text = "\n".join(c.source for c in nbformat.read(released, as_version=4).cells)
        lines = {line.strip() for line in text.splitlines()}
        for line in sorted(secret_lines(nbformat.read(assignment.source, as_version=4)) & lines):
            problems.append(f"{_shown(released)} contains solution/hidden-test text: {line!r}")
        if ANY_MARKER.search(text):
            problems.append(f"{_shown(released)} contains a BEGIN SOLUTION/HIDDEN TESTS marker")
    return problems


def output_problems(roots: tuple[Path, ...] = (SOLUTIONS, NOTEBOOKS)) -> list[str]:
    """Committed notebooks (solutions/ or notebooks/) that carry outputs or execution counts."""
    problems = []
    for root in roots:
        for path in sorted(root.rglob("*.ipynb")) if root.exists() else []:
            if ".ipynb_checkpoints" in path.parts:
                continue
            nb = nbformat.read(path, as_version=4)
            if any(c.get("outputs") or c.get("execution_count") for c in nb.cells if c.cell_type == "code"):
                problems.append(f"{_shown(path)} carries outputs: clear them before committing")
    return problems


def metadata_problems(sources: list[Path] | None = None) -> list[str]:
    """nbgrader metadata that would make grading wrong, per the course's cell conventions.

    Test-cell grade ids must be unique across the course: they name the columns of grades.csv.
    """
    problems = []
    test_ids: Counter[str] = Counter()
    for source in sources or [a.source for a in assignments()]:
        name = _shown(source)
        nb = nbformat.read(source, as_version=4)
        test_ids.update(cells.grade_id(c) for c in nb.cells if cells.kind(c) == cells.TEST)
        ids = [cells.grade_id(c) for c in nb.cells]
        for grade_id, count in Counter(i for i in ids if i).items():
            if count > 1:
                problems.append(f"{name}: grade_id {grade_id!r} is used {count} times")
        for index, cell in enumerate(nb.cells):
            info = cells.nbgrader(cell)
            where = f"{name} cell {index}"
            if cells.kind(cell) == cells.WRITTEN:
                points = info.get("points")
                if not isinstance(points, (int, float)) or points <= 0:
                    problems.append(f"{where} ({info.get('grade_id', '?')}): written answer without positive points")
                if not SOLUTION_BLOCK.search(cell.source + "\n"):
                    problems.append(f"{where} ({info.get('grade_id', '?')}): written answer without a model answer "
                                    "between ### BEGIN SOLUTION and ### END SOLUTION")
                continue
            if cell.cell_type != "code":
                continue
            if not info:
                problems.append(f"{where}: code cell without nbgrader metadata (make it read-only, an answer or a test)")
                continue
            gid = info.get("grade_id", "?")
            if info.get("grade"):
                points = info.get("points")
                if not isinstance(points, (int, float)) or points <= 0:
                    problems.append(f"{where} ({gid}): test cell without positive points")
                if not info.get("locked"):
                    problems.append(f"{where} ({gid}): test cell is not locked")
                if info.get("solution"):
                    problems.append(f"{where} ({gid}): a test cell must not also be an answer cell")
            elif info.get("solution"):
                if not SOLUTION_BLOCK.search(cell.source + "\n"):
                    problems.append(f"{where} ({gid}): answer cell without ### BEGIN SOLUTION")
            elif not info.get("locked"):
                problems.append(f"{where} ({gid}): code cell is neither answer, test nor read-only")
            if HIDDEN_BLOCK.search(cell.source + "\n") and not info.get("grade"):
                problems.append(f"{where} ({gid}): hidden tests outside a test cell")
    problems += [f"test grade_id {gid!r} is used by {n} test cells in the course" for gid, n in test_ids.items() if n > 1]
    return problems


def nbgrader_problems(release_root: Path = NOTEBOOKS) -> list[str]:
    """What nbgrader's own metadata validation (nbgrader validate, autograde, the formgrader, the exchange) rejects
    in a released notebook: a cell it would refuse makes every hand-in of that notebook fail to grade there."""
    from nbgrader.nbgraderformat import MetadataValidator, ValidationError

    validator = MetadataValidator()
    problems = []
    for assignment in assignments():
        released = release_root / assignment.name / assignment.notebook
        if not released.exists():
            continue
        try:
            validator.validate_nb(nbformat.read(released, as_version=4))
        except ValidationError as err:
            problems.append(f"{_shown(released)}: nbgrader rejects it: {str(err).splitlines()[0][:200]}")
    return problems


def check() -> list[str]:
    """Every problem `python -m grader check` reports; empty when the course is consistent."""
    from grader.author.mutants import mutant_problems  # mutants name grade ids; checked with the notebooks

    return (metadata_problems() + output_problems() + leak_problems() + nbgrader_problems() + stale_problems()
            + mutant_problems())
