"""`python -m grader demo NN`: lecture mode — a lecture copy of notebook NN in a JupyterLab made for the projector.

The lecture copy is solution notebook NN with the reference answers in place and nothing of grading left: no hidden
test, no nbgrader marker or metadata, test cells collapsed, written answers without their marking scheme. It opens in
a JupyterLab of its own, whose every folder (Jupyter's config, data, runtime, settings and workspaces, IPython's, the
temporary folder of the server and its kernels) lives in one scratch folder beside the copy: nbgrader's server and
lab extensions are off there, the lab starts in the Simple Interface with the side panels closed, text and code are
sized to the window, and figures render at twice the resolution and fill the notebook's width. JupyterLab's own
Presentation Mode (View → Appearance) enlarges the text one step more; no URL or setting can switch it on (command
`application:toggle-presentation-mode`). Ctrl-C, SIGTERM or SIGHUP stops the server and every process under it and
removes the scratch folder.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import webbrowser
from pathlib import Path
from typing import Any

import nbformat

from grader.author.markers import HIDDEN_BLOCK, SOLUTION_MARKER
from grader.course import assignment_named
from grader.paths import REPO
from labkit import cells as kinds

# A written answer's marking scheme around its model answer: "A full answer (2 points) does both:" opens it, a
# paragraph "1 point for each." closes it.
RUBRIC_OPENING = re.compile(r"\AA full answer \(\d+ points?\)[^\n]*\n")
RUBRIC_SCORING = re.compile(r"\n\n\d+ points? for [^\n]*\Z")

# What the lecture lab changes, for this launch only. Both nbgrader halves are off: its lab extension (the
# Nbgrader menu, the Validate button, the Create Assignment panel) and its server extensions.
NBGRADER_LAB_EXTENSION = "@jupyter/nbgrader"
SETTINGS = {
    "@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/application-extension:shell": {"startMode": "single"},
}
# The shell as a workspace stores it: no side panel open, so the notebook has the whole window.
WORKSPACE = {"data": {"layout-restorer:data": {"left": {"collapsed": True, "visible": True, "widgets": []},
                                               "right": {"collapsed": True, "visible": True, "widgets": []}}},
             "metadata": {"id": "default"}}
# Sizes grow with the window (vw) between a floor readable at 1280×720 and a ceiling for large screens; Presentation
# Mode's variables one step larger (`html:root` outranks the theme's `:root`, which loads after this file). A PNG
# output (matplotlib's) fills the output area; SVG drawings (graphviz) keep their size.
LECTURE_CSS = """\
html:root {
  --jp-content-font-size1: clamp(17px, 1.15vw, 26px);
  --jp-code-font-size: clamp(16px, 1.05vw, 24px);
  --jp-ui-font-size1: clamp(14px, 0.85vw, 18px);
  --jp-content-presentation-font-size1: clamp(20px, 1.4vw, 32px);
  --jp-code-presentation-font-size: clamp(19px, 1.3vw, 30px);
}
.jp-OutputArea-output.jp-RenderedImage > img { width: 100%; height: auto; }
"""
IPYTHON_KERNEL_CONFIG = "c.InlineBackend.figure_formats = {'retina'}  # twice the pixels: sharp at full width\n"


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
    nb = nbformat.read(path, as_version=4)
    cells = []
    for i, cell in enumerate(nb.cells):
        if kinds.kind(cell) == kinds.DEMO:
            first = next((line for line in cell.source.splitlines() if line.strip() and not line.lstrip().startswith("#")), "")
            cells.append((i + 1, len(nb.cells), kinds.grade_id(cell), first.strip()))
    return cells


def lecture_copy(source: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The solution notebook as the room sees it, cell for cell (demo numbers stay): answers without their markers,
    test cells collapsed and without their hidden scenario, written answers without their marking scheme, no nbgrader
    metadata."""
    nb = nbformat.from_dict(json.loads(json.dumps(source)))
    for cell in nb.cells:
        kind = kinds.kind(cell)
        if kind == kinds.ANSWER:
            cell.source = SOLUTION_MARKER.sub("", cell.source + "\n").rstrip()
        elif kind == kinds.TEST:
            # the visible checks still run (Run All stays green) but show as one collapsed line
            cell.source = HIDDEN_BLOCK.sub("", cell.source).rstrip()
            cell.metadata.setdefault("jupyter", {})["source_hidden"] = True
        elif kind == kinds.WRITTEN:
            answer = SOLUTION_MARKER.sub("", cell.source + "\n").rstrip()
            cell.source = RUBRIC_SCORING.sub("", RUBRIC_OPENING.sub("", answer))
        cell.metadata.pop("nbgrader", None)
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nb.metadata.pop("nbgrader", None)
    return nb


def describe(path: Path) -> str:
    cells = demo_cells(path)
    lines = [f"Lecture copy of {path.relative_to(REPO) if path.is_relative_to(REPO) else path}: reference answers in "
             "place, no hidden test, no grading tools"]
    if cells:
        lines.append(f"Cells tagged demo ({len(cells)}; JupyterLab's status bar shows 'Cell N/{cells[0][1]}'):")
        lines += [f"  cell {n:>2}/{total}  {gid or '(no id)':<24} {first[:70]}" for n, total, gid, first in cells]
        lines.append("Run → Run All Cells first (the demos use what the cells above them define; about "
                     "half a minute on a laptop CPU), then re-run or drive each demo cell.")
    else:
        lines.append("No cells are tagged demo in this notebook; run it top to bottom.")
    lines.append("Larger still: View → Appearance → Presentation Mode; F11 for the whole screen.")
    return "\n".join(lines)


def free_port(preferred: int = 8888) -> int:
    """`preferred` or the next port that nothing listens on."""
    for port in range(preferred, preferred + 50):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise SystemExit(f"no free port in {preferred}–{preferred + 49}: name one with --port")


def prepare(scratch: Path, source: Path) -> tuple[Path, dict[str, str]]:
    """Write the lecture copy and the lab's folders into `scratch`; the notebook and the environment to start with."""
    notebook = scratch / source.name
    nbformat.write(lecture_copy(nbformat.read(source, as_version=4)), notebook)
    folders = {name: scratch / ".lab" / name
               for name in ("config", "data", "runtime", "settings", "workspaces", "ipython", "tmp")}
    for folder in folders.values():
        folder.mkdir(parents=True)
    (folders["config"] / "labconfig").mkdir()
    (folders["config"] / "labconfig" / "page_config.json").write_text(
        json.dumps({"disabledExtensions": {NBGRADER_LAB_EXTENSION: True}}))
    (folders["config"] / "jupyter_server_config.json").write_text(json.dumps(
        {"ServerApp": {"jpserver_extensions": {name: False for name in nbgrader_server_extensions()}}}))
    (folders["config"] / "custom").mkdir()
    (folders["config"] / "custom" / "custom.css").write_text(LECTURE_CSS)
    (folders["settings"] / "overrides.json").write_text(json.dumps(SETTINGS))
    from jupyterlab_server.workspaces_handler import WorkspacesManager

    WorkspacesManager(str(folders["workspaces"])).save("default", json.dumps(WORKSPACE))
    (folders["ipython"] / "profile_default").mkdir()
    (folders["ipython"] / "profile_default" / "ipython_kernel_config.py").write_text(IPYTHON_KERNEL_CONFIG)
    env = {"JUPYTER_CONFIG_DIR": str(folders["config"]), "JUPYTER_DATA_DIR": str(folders["data"]),
           "JUPYTER_RUNTIME_DIR": str(folders["runtime"]), "IPYTHONDIR": str(folders["ipython"]),
           "JUPYTER_PLATFORM_DIRS": "1", "TMPDIR": str(folders["tmp"])}   # torch's caches and the kernels' temp files too
    return notebook, env


def nbgrader_server_extensions() -> list[str]:
    """The nbgrader server extensions this environment enables (jupyter_server_config.d/nbgrader.json)."""
    from jupyter_core.paths import jupyter_config_path

    found: list[str] = []
    for folder in jupyter_config_path():
        config = Path(folder) / "jupyter_server_config.d" / "nbgrader.json"
        if config.exists():
            found += json.loads(config.read_text()).get("ServerApp", {}).get("jpserver_extensions", {})
    return sorted(set(found))


def lab_argv(scratch: Path, port: int, token: str, extra: list[str]) -> list[str]:
    argv = [sys.executable, "-m", "jupyterlab", "--ip=127.0.0.1", f"--port={port}", "--ServerApp.port_retries=0",
            f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={scratch}", "--ServerApp.open_browser=False",
            f"--LabApp.app_settings_dir={scratch / '.lab' / 'settings'}",
            f"--LabApp.user_settings_dir={scratch / '.lab' / 'settings' / 'user'}",
            f"--LabApp.workspaces_dir={scratch / '.lab' / 'workspaces'}",
            "--LabApp.custom_css=True", "--LabApp.news_url="]
    if os.geteuid() == 0:
        argv.append("--allow-root")
    return argv + extra


def wait_until_up(process: subprocess.Popen, url: str, log: Path, timeout: float = 180) -> None:
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        if process.poll() is not None:
            raise SystemExit(f"JupyterLab exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            time.sleep(0.3)
    raise SystemExit(f"JupyterLab did not answer in {timeout:.0f} s:\n{log.read_text()[-3000:]}")


def stop(process: subprocess.Popen) -> None:
    """Stop the server and every process under it — kernels and what they started run in sessions of their own, so
    they are found by parentage before the server goes, and killed if they outlive it."""
    import psutil

    try:
        under = psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        under = []
    if process.poll() is None:
        process.terminate()   # jupyter_server shuts its kernels down on SIGTERM
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    for child in under:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(under, timeout=5)


def _stop_on_signal(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt   # the same clean-up as Ctrl-C


def run(args: argparse.Namespace) -> int:
    path = find_solution(args.notebook)
    print(describe(path))
    if args.list:
        return 0
    port, token = args.port or free_port(), secrets.token_hex(16)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _stop_on_signal)
    scratch, process = None, None
    try:
        scratch = Path(tempfile.mkdtemp(prefix="course-lecture-"))
        notebook, env = prepare(scratch, path)
        log = scratch / ".lab" / "jupyterlab.log"
        # A session of its own: Ctrl-C reaches this process alone, which then stops the server and its kernels.
        process = subprocess.Popen(lab_argv(scratch, port, token, args.lab_option), cwd=scratch,
                                   env={**os.environ, **env}, stdout=log.open("w"), stderr=subprocess.STDOUT,
                                   start_new_session=True)
        wait_until_up(process, f"http://127.0.0.1:{port}/api/status?token={token}", log)
        url = f"http://127.0.0.1:{port}/lab/tree/{notebook.name}?token={token}"
        print(f"Lecture notebook: {url}\nCtrl-C stops the lab and removes its scratch folder {scratch}.", flush=True)
        if not args.no_browser:
            webbrowser.open(url)
        while process.poll() is None:
            time.sleep(0.5)
        print(f"JupyterLab exited with {process.returncode}:\n{log.read_text()[-3000:]}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nstopping the lecture lab", flush=True)
        return 0
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)   # a second Ctrl-C must not cut the clean-up short
        if process is not None:
            stop(process)
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def add_demo_command(commands) -> None:
    """Register `demo` on the `python -m grader` sub-command parser."""
    demo = commands.add_parser("demo", help="lecture mode: open a lecture copy of notebook NN (answers in place, no "
                                            "hidden tests or grading tools) in a JupyterLab for the projector")
    demo.add_argument("notebook", help="NN (e.g. 01), a folder name in solutions/, or a notebook path")
    demo.add_argument("--list", action="store_true", help="only list the demo cells")
    demo.add_argument("--port", type=int, help="JupyterLab's port (default: 8888 or the next free one)")
    demo.add_argument("--no-browser", action="store_true", help="do not open a browser (print the URL)")
    demo.add_argument("--lab-option", action="append", default=[], metavar="OPTION",
                      help="one more option for jupyter lab, e.g. --lab-option=--LabApp.expose_app_in_browser=True")
    demo.set_defaults(run=run)
