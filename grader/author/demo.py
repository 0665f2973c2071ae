"""`python -m grader demo NN`: open solution notebook NN in JupyterLab for a lecture, and say where its demos are.

The notebook opens from a scratch copy of solutions/ (so running it in class never writes outputs into
the source; `--in-place` opens the real file). JupyterLab 4 has a built-in Presentation Mode — larger
fonts for the projector — under View → Appearance → Presentation Mode (command
`application:toggle-presentation-mode`, no default shortcut); no URL or workspace switches it on, so
the command prints how to toggle it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

from grader.course import assignment_named
from grader.paths import REPO, SOLUTIONS

PRESENTATION_COMMAND = "application:toggle-presentation-mode"


def find_solution(name: str) -> Path:
    """solutions/NN_*/NN_*.ipynb for '1', '01', '01_gradient_descent' or a path to the notebook."""
    if name.endswith(".ipynb") and Path(name).exists():
        return Path(name).resolve()
    try:
        return assignment_named(name).source
    except ValueError as err:
        raise SystemExit(f"no solution notebook matches: {err}") from None


def demo_cells(path: Path) -> list[tuple[int, int, str, str]]:
    """(cell number as JupyterLab's status bar counts it, 1-based; of how many; grade_id; first code line)."""
    import nbformat

    from labkit import cells as kinds

    nb = nbformat.read(path, as_version=4)
    cells = []
    for i, cell in enumerate(nb.cells):
        if kinds.kind(cell) == kinds.DEMO:
            first = next((line for line in cell.source.splitlines() if line.strip() and not line.lstrip().startswith("#")), "")
            cells.append((i + 1, len(nb.cells), kinds.grade_id(cell), first.strip()))
    return cells


def lab_argv(root: Path, notebook: Path, port: int | None, no_browser: bool) -> list[str]:
    argv = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={root}"]
    if os.geteuid() == 0:
        argv.append("--allow-root")
    if port:
        argv.append(f"--port={port}")
    if no_browser:
        argv.append("--no-browser")
    argv.append(notebook.relative_to(root).as_posix())   # JupyterLab opens it at /lab/tree/<path>
    return argv


def describe(path: Path) -> str:
    cells = demo_cells(path)
    lines = [f"Demo notebook: {path.relative_to(REPO) if path.is_relative_to(REPO) else path}"]
    if cells:
        lines.append(f"Cells tagged demo ({len(cells)}; JupyterLab's status bar shows 'Cell N/{cells[0][1]}'):")
        lines += [f"  cell {n:>2}/{total}  {gid or '(no id)':<24} {first[:70]}" for n, total, gid, first in cells]
        lines.append("Run → Run All Cells first (the demos use what the cells above them define; about "
                     "half a minute on a laptop CPU), then re-run or drive each demo cell.")
    else:
        lines.append("No cells are tagged demo in this notebook; run it top to bottom.")
    lines += ["Presentation Mode (large fonts for the projector): View → Appearance → Presentation Mode",
              f"  (command palette: 'Presentation Mode', command id {PRESENTATION_COMMAND}); "
              "View → Appearance → Simple Interface shows one notebook at a time."]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    path = find_solution(args.notebook)
    print(describe(path))
    if args.list:
        return 0
    if args.in_place or not path.is_relative_to(SOLUTIONS):
        root, notebook = REPO if path.is_relative_to(REPO) else path.parent, path
    else:
        root = Path(tempfile.gettempdir()) / "course-demo-DIR" if args.dry_run else Path(tempfile.mkdtemp(prefix="course-demo-"))
        if not args.dry_run:
            shutil.copytree(SOLUTIONS, root / "solutions",
                            ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
        notebook = root / path.relative_to(REPO)
        print(f"Opening a scratch copy in {root} (solutions/ stays untouched; --in-place opens the source).")
    argv = lab_argv(root, notebook, args.port, args.no_browser)
    if args.dry_run:
        print(" ".join(argv))
        return 0
    print(f"Starting JupyterLab on {notebook.relative_to(root).as_posix()} (URL path /lab/tree/…); Ctrl-C twice stops it.",
          flush=True)
    os.chdir(root)
    os.execv(argv[0], argv)
    return 0  # not reached


def add_demo_command(commands) -> None:
    """Register `demo` on the `python -m grader` sub-command parser."""
    demo = commands.add_parser("demo", help="open solution notebook NN in JupyterLab for a lecture; lists its demo cells")
    demo.add_argument("notebook", help="NN (e.g. 01), a folder name in solutions/, or a notebook path")
    demo.add_argument("--list", action="store_true", help="only list the demo cells and how to present")
    demo.add_argument("--in-place", action="store_true", help="open solutions/ itself instead of a scratch copy")
    demo.add_argument("--port", type=int, help="JupyterLab's port (default: 8888 or the next free one)")
    demo.add_argument("--no-browser", action="store_true", help="do not open a browser (print the URL)")
    demo.add_argument("--dry-run", action="store_true", help="print the JupyterLab command instead of running it")
    demo.set_defaults(run=run)
