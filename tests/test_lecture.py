"""Lecture mode (`./course demo NN`, grader/author/demo.py): what the room sees, and what is left when it stops.

- fast: every solution notebook's lecture copy keeps every reference answer line and loses every hidden-test line,
  every nbgrader marker and metadata and every marking scheme, cell for cell (the demo cells keep their numbers);
- integration: SIGTERM or Ctrl-C (SIGINT) stops the lab and its kernel and removes the scratch folder, which also
  held every temporary file; nbgrader's server extensions are off;
- slow: `./course demo 03` in Chromium at 1920×1080 and 1280×720 (screenshots in test-artifacts/lecture/): no
  hidden-test, marker or grading text on the page, no nbgrader command in the lab, the first figure at least 70 %
  of the notebook's width, code text at least 16 px.
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import nbformat
import pytest
from conftest import REPO, artifacts

from grader.author.check import secret_lines
from grader.author.demo import lecture_copy
from grader.author.markers import ANY_MARKER, SOLUTION_BLOCK, SOLUTION_MARKER
from grader.course import assignment_named, assignments
from labkit import cells as kinds

URL = re.compile(r"^Lecture notebook: (http://127\.0\.0\.1:(\d+)/lab/tree/(\S+\.ipynb)\?token=(\w+))$", re.M)
GRADING_UI = ("Nbgrader", "Validate", "Create Assignment", "Formgrader", "Assignment List")
SCORING = re.compile(r"\b\d+ points? for\b|A full answer \(")


def grading_text(text: str, source: nbformat.NotebookNode) -> list[str]:
    """What of grading `text` shows: hidden-test lines of `source`, nbgrader markers, marking schemes, nbgrader's UI."""
    lines = {line.strip() for line in text.splitlines()}
    # a hidden test's line that a reference answer also has is the answer's, shown on purpose
    hidden = secret_lines(source, solutions=False) - secret_lines(source, hidden_tests=False)
    found = sorted(hidden & lines)
    found += [m.group(0) for m in (ANY_MARKER.search(text), SOLUTION_MARKER.search(text + "\n"),
                                   re.search(r"HIDDEN TESTS", text), SCORING.search(text)) if m]
    return found + [word for word in GRADING_UI if word in text]


@pytest.mark.parametrize("assignment", assignments(), ids=lambda a: a.name)
def test_the_lecture_copy_keeps_the_answers_and_drops_all_grading(assignment):
    source = nbformat.read(assignment.source, as_version=4)
    copy = lecture_copy(source)
    assert [c.cell_type for c in copy.cells] == [c.cell_type for c in source.cells]
    assert [c.metadata.get("tags") for c in copy.cells] == [c.metadata.get("tags") for c in source.cells]
    text = "\n".join(c.source for c in copy.cells)
    assert not grading_text(text, source)
    assert not [c for c in copy.cells if "nbgrader" in c.metadata] and "nbgrader" not in copy.metadata
    shown = {line.strip() for line in text.splitlines()}
    for before, after in zip(source.cells, copy.cells):
        if kinds.kind(before) == kinds.ANSWER:
            reference = {line.strip() for block in SOLUTION_BLOCK.findall(before.source + "\n")
                         for line in block.splitlines() if line.strip()}
            assert reference <= shown, f"{kinds.grade_id(before)}: reference lines missing from the lecture copy"
        if kinds.kind(before) == kinds.WRITTEN:
            assert after.source.strip() and after.source in before.source, "the model answer, as written"
        assert after.metadata.get("jupyter", {}).get("source_hidden", False) == (kinds.kind(before) == kinds.TEST)


# ---------------------------------------------------------------- the lab

def start(tmp_path: Path, *argv: str) -> tuple[subprocess.Popen, re.Match]:
    """Start lecture mode with its temporary folder in tmp_path/tmp; the process and its URL line."""
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp"), "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    printed, deadline = "", time.monotonic() + 240
    while time.monotonic() < deadline and process.poll() is None:
        if select.select([process.stdout], [], [], 1)[0]:
            printed += process.stdout.readline()
            if found := URL.search(printed):
                return process, found
    process.kill()
    pytest.fail(f"no notebook URL printed:\n{printed}{process.stdout.read()}")


def stop_and_check(process: subprocess.Popen, tmp_path: Path, signum: int) -> None:
    """Stop lecture mode with `signum`: it exits 0, nothing it started survives, its temporary folder is empty."""
    from browser_lab import descendants, processes_left

    under = descendants(process.pid)
    assert under, "the lab runs under lecture mode"
    process.send_signal(signum)
    assert process.wait(60) == 0, process.stdout.read()
    assert not processes_left(under, str(tmp_path / "tmp"))
    assert not list((tmp_path / "tmp").iterdir())


def api(url: re.Match, method: str, path: str) -> int:
    request = urllib.request.Request(f"http://127.0.0.1:{url.group(2)}/{path}", method=method,
                                     headers={"Authorization": f"token {url.group(4)}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as err:
        return err.code


@pytest.mark.integration
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_stopping_lecture_mode_leaves_no_folder_and_no_process(tmp_path, signum):
    process, url = start(tmp_path, sys.executable, "-m", "grader", "demo", "03", "--no-browser")
    assert url.group(3) == assignment_named("03").notebook
    assert api(url, "GET", f"api/contents/{url.group(3)}") == 200
    assert api(url, "GET", "formgrader") == 404, "nbgrader's server extensions are off"
    assert api(url, "POST", "api/kernels") == 201   # a kernel, as Run All starts one
    stop_and_check(process, tmp_path, signum)


# ---------------------------------------------------------------- in the browser

JS_FIGURE = """() => {
  const nb = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook');
  const img = nb.querySelector('.jp-RenderedImage img');
  img.scrollIntoView({block: 'start'});
  return {figure: img.getBoundingClientRect().width, notebook: nb.getBoundingClientRect().width,
          code_px: parseFloat(getComputedStyle(nb.querySelector('.cm-content')).fontSize)};
}"""

# Each cell's text as shown, read while it is in view (JupyterLab renders cells lazily), then the rest of the page.
JS_PAGE_TEXT = """async () => {
  const nb = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook');
  const texts = [];
  for (const cell of nb.querySelectorAll('.jp-Cell')) {
    cell.scrollIntoView({block: 'start'});
    await new Promise(r => requestAnimationFrame(() => setTimeout(r, 30)));
    texts.push(cell.innerText);
  }
  return texts.join('\\n') + '\\n' + document.body.innerText;
}"""


@pytest.mark.slow
def test_course_demo_03_in_the_browser(tmp_path):
    from browser_lab import CHROMIUM_ARGS, JS_KERNEL_READY, NOTEBOOK_JS, LabPage
    from conftest import CHROMIUM, require_chromium

    require_chromium()
    from playwright.sync_api import sync_playwright

    source = nbformat.read(assignment_named("03").source, as_version=4)
    process, url = start(tmp_path, str(REPO / "course"), "demo", "03", "--no-browser",
                         "--lab-option=--LabApp.expose_app_in_browser=True")   # window.jupyterapp: Run All's progress
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
            page = browser.new_context(viewport={"width": 1920, "height": 1080}).new_page()
            page.goto(url.group(1), timeout=180_000)
            page.wait_for_function(f"() => !!(window.jupyterapp && {NOTEBOOK_JS})", timeout=180_000)
            page.wait_for_function(JS_KERNEL_READY, timeout=180_000)
            lab = LabPage(page, server=None)
            assert lab.page.evaluate(f"() => ({NOTEBOOK_JS}).context.path") == url.group(3)
            assert not page.evaluate("() => window.jupyterapp.commands.listCommands().filter(c => /nbgrader/i.test(c))")
            lab.run("Run All Cells")
            assert not [(c["index"], o["ename"]) for c in lab.cells() for o in c["outputs"] if o["ename"]]
            measured = {}
            for width, height in ((1920, 1080), (1280, 720)):
                page.set_viewport_size({"width": width, "height": height})
                page.wait_for_timeout(500)
                shown = page.evaluate(JS_PAGE_TEXT)
                assert not grading_text(shown, source), f"grading text on the page at {width}×{height}"
                measured[width] = page.evaluate(JS_FIGURE)
                page.wait_for_timeout(300)
                page.screenshot(path=str(artifacts("lecture") / f"03-{width}x{height}.png"))
            lab.scroll_to(next(i for i, c in enumerate(source.cells) if kinds.kind(c) == kinds.ANSWER))
            page.screenshot(path=str(artifacts("lecture") / "03-first-answer-1280x720.png"))
            browser.close()
        print(f"\nlecture mode, 03: {measured}")
        for width, m in measured.items():
            assert m["figure"] >= 0.7 * m["notebook"], f"at {width} px the figure is {m['figure']:.0f} of {m['notebook']:.0f} px"
            assert m["code_px"] >= 16, f"code at {m['code_px']} px at {width} px"
    finally:
        if process.poll() is None:
            stop_and_check(process, tmp_path, signal.SIGTERM)
