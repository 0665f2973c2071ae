"""JupyterLab in a real browser for tests/test_browser.py and tests/test_browser_released.py: a private server,
Chromium, and the page scripts.

Nothing here is a test. `LabServer` starts `jupyter lab` on 127.0.0.1 with its own port, token and
settings/runtime/workspace/config folders; `LabPage` drives one JupyterLab page in Debian's Chromium
through Playwright (never Playwright's own browser download); `processes_left` lists what survived;
`lab_fixture` is a test module's server and page over one folder of notebooks, `Timings` what it measured.
"""

from __future__ import annotations

import base64
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
VIEWPORT = {"width": 1280, "height": 800}  # a projector's resolution

# Lab settings for every page: no news toast in the screenshots, no autosave (the run must never write
# outputs back into a notebook), and no update check (no network here).
SETTINGS_OVERRIDES = {
    "@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/docmanager-extension:plugin": {"autosave": False},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LabServer:
    """`jupyter lab` on 127.0.0.1 serving `root`, with every Jupyter folder inside `home`."""

    def __init__(self, root: Path, home: Path) -> None:
        self.root, self.home = root, home
        self.port, self.token = free_port(), secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None
        self.log = home / "jupyterlab.log"

    def start(self, timeout: float = 120) -> float:
        """Start the server; returns the seconds until it answered."""
        dirs = {name: self.home / name for name in ("settings", "user-settings", "workspaces", "runtime",
                                                   "config", "data")}
        for d in dirs.values():
            d.mkdir(parents=True, exist_ok=True)
        (dirs["settings"] / "overrides.json").write_text(json.dumps(SETTINGS_OVERRIDES, indent=1))
        env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(dirs["runtime"]), JUPYTER_CONFIG_DIR=str(dirs["config"]),
                   JUPYTER_DATA_DIR=str(dirs["data"]), JUPYTER_PLATFORM_DIRS="1", PYTHONUNBUFFERED="1")
        argv = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={self.port}",
                "--ServerApp.port_retries=0", f"--IdentityProvider.token={self.token}",
                f"--ServerApp.root_dir={self.root}",
                f"--LabApp.app_settings_dir={dirs['settings']}",
                f"--LabApp.user_settings_dir={dirs['user-settings']}",
                f"--LabApp.workspaces_dir={dirs['workspaces']}",
                "--LabApp.expose_app_in_browser=True",   # window.jupyterapp: read the notebook model
                "--LabApp.news_url=", "--ServerApp.open_browser=False"]
        if os.geteuid() == 0:
            argv.insert(3, "--allow-root")
        began = time.perf_counter()
        self.process = subprocess.Popen(argv, cwd=self.root, env=env, stdout=self.log.open("w"),
                                        stderr=subprocess.STDOUT, start_new_session=True)
        while time.perf_counter() - began < timeout:
            if self.process.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {self.process.returncode}:\n{self.log.read_text()[-3000:]}")
            try:
                self.api("GET", "status")
                return time.perf_counter() - began
            except OSError:
                time.sleep(0.2)
        raise TimeoutError(f"jupyter lab did not answer in {timeout} s:\n{self.log.read_text()[-3000:]}")

    def api(self, method: str, path: str, timeout: float = 10):
        request = urllib.request.Request(f"{self.url}/api/{path}", method=method,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
        return json.loads(body) if body else None

    def kernels(self) -> list[dict]:
        return self.api("GET", "kernels")

    def shutdown_kernels(self, timeout: float = 30) -> None:
        """Delete every session and kernel, then wait until the server lists none."""
        for session in self.api("GET", "sessions"):
            self.api("DELETE", f"sessions/{session['id']}", timeout=timeout)
        for kernel in self.kernels():
            self.api("DELETE", f"kernels/{kernel['id']}", timeout=timeout)
        deadline = time.perf_counter() + timeout
        while self.kernels():
            if time.perf_counter() > deadline:
                raise TimeoutError(f"kernels still running: {self.kernels()}")
            time.sleep(0.2)

    def stop(self, timeout: float = 30) -> None:
        """Shut the kernels and the server down; kill its process group if it does not exit."""
        if self.process is None or self.process.poll() is not None:
            return
        try:
            self.shutdown_kernels()
            self.api("POST", "shutdown")
            self.process.wait(timeout)
        except (OSError, TimeoutError, subprocess.TimeoutExpired):
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)


# ---------------------------------------------------------------- a test module's lab

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts" / "browser"


def notebooks_in(folder: str) -> list[Path]:
    """The notebooks of the course's `folder` (solutions or notebooks), found when the tests are collected."""
    from conftest import REPO

    return sorted(p for p in REPO.glob(f"{folder}/*/*.ipynb")
                  if not any(part.startswith(".") for part in p.relative_to(REPO).parts)
                  and not p.stem.endswith("-checkpoint"))


class Timings:
    """What one browser test module measured, per notebook, rewritten to test-artifacts/browser/`file` after each."""

    def __init__(self, file: str, lab: dict[str, float]) -> None:
        self.path, self.lab, self.notebooks = ARTIFACTS / file, lab, {}  # lab: server start and page load

    def add(self, notebook: str, entry: dict) -> None:
        self.notebooks[notebook] = entry
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps({"notebooks": self.notebooks, **self.lab}, indent=1, sort_keys=True))


def lab_fixture(folder: str, timings_file: str):
    """A module-scoped fixture: a JupyterLab server over a copy of `folder` (solutions or notebooks) and one
    Chromium page on it, as (page, Timings); at teardown, nothing the test started may be left running."""

    @pytest.fixture(scope="module")
    def lab(tmp_path_factory) -> Iterator[tuple[LabPage, Timings]]:
        from conftest import CHROMIUM, REPO, require_chromium

        require_chromium()
        from playwright.sync_api import sync_playwright

        home = tmp_path_factory.mktemp("browser-lab")
        shutil.copytree(REPO / folder, home / "course" / folder,
                        ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
        before = descendants(os.getpid())
        server = LabServer(home / "course", home)
        playwright = browser = None
        watched: set[int] = set()
        try:
            server_s = server.start()
            playwright = sync_playwright().start()
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
            page = LabPage(browser.new_context(viewport=VIEWPORT).new_page(), server)
            load_s = page.load()
            print(f"\nJupyterLab: server up in {server_s:.1f} s, page loaded in {load_s:.1f} s")
            watched = descendants(os.getpid()) - before
            yield page, Timings(timings_file, {"server_start_s": round(server_s, 2), "lab_load_s": round(load_s, 2)})
        finally:
            watched |= descendants(os.getpid()) - before
            server.stop()
            if browser is not None:
                browser.close()
            if playwright is not None:
                playwright.stop()
            left = processes_left(watched, str(home))
            assert not left, "processes left behind by the browser test:\n" + "\n".join(left)

    return lab


def screenshot(page: LabPage, name: str) -> Path:
    """The page as it looks now, saved as test-artifacts/browser/`name`.png."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    target = ARTIFACTS / f"{name}.png"
    page.page.screenshot(path=str(target))
    return target


def errors(cell: dict) -> list[tuple[str, str]]:
    """(ename, evalue) of each error a cell (LabPage.cells) shows."""
    return [(o["ename"], o["evalue"]) for o in cell["outputs"] if o["output_type"] == "error"]


# ---------------------------------------------------------------- processes

def process_table() -> dict[int, tuple[int, str, str]]:
    """pid -> (ppid, state, command line), from ps."""
    out = subprocess.run(["ps", "-eo", "pid=,ppid=,stat=,args="], capture_output=True, text=True, check=True).stdout
    table = {}
    for line in out.splitlines():
        parts = line.split(None, 3)
        if len(parts) >= 3:
            table[int(parts[0])] = (int(parts[1]), parts[2], parts[3] if len(parts) > 3 else "")
    return table


def descendants(pid: int, table: dict[int, tuple[int, str, str]] | None = None) -> set[int]:
    table = table if table is not None else process_table()
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, (ppid, _, _) in table.items() if ppid in frontier} - found
        found |= frontier
    return found


def processes_left(watched: set[int], marker: str, grace: float = 15) -> list[str]:
    """Live (non-zombie) processes among `watched` or whose command line holds `marker`, after a grace period."""
    me = os.getpid()
    deadline = time.perf_counter() + grace
    while True:
        table = process_table()
        alive = [f"{pid} {args[:160]}" for pid, (_, state, args) in table.items()
                 if pid != me and not state.startswith("Z") and (pid in watched or marker in args)
                 and not args.startswith("ps ")]
        if not alive or time.perf_counter() > deadline:
            return alive
        time.sleep(0.3)


# ---------------------------------------------------------------- the student-experience rule

# An exception line "NotImplementedError" or "NotImplementedError: …" inside a quoted traceback, with any
# "[rank 1] [rank1]: " prefix a launcher puts in front of a worker's output.
QUOTED_NIE = re.compile(r"^(?:\[[^\]]*\]:?\s*)*NotImplementedError(?::.*)?\s*$", re.M)


def is_not_implemented(ename: str, evalue: str | None) -> bool:
    """The blank answer's error: NotImplementedError itself or its subclass naming the earlier exercise a test waits
    for (helpers.checks.earlier_exercise), or an error that reports a worker process's traceback ending in
    NotImplementedError (e.g. labkit.launch's LaunchError)."""
    if ename in ("NotImplementedError", "ExerciseNotImplementedError"):
        return True
    return bool(evalue) and "Traceback (most recent call last)" in evalue and bool(QUOTED_NIE.search(evalue))


# What a test cell of a blank notebook may show: helpers.checks' exceptions that render as their message alone.
NAMED_BLANK = ("ExerciseNotAnswered", "ExerciseNotImplementedError")


@dataclass
class CellRun:
    index: int
    kind: str              # "answer", "test" or "other"
    grade_id: str
    source: str
    executed: bool
    errors: list[tuple[str, str]] = field(default_factory=list)   # (ename, evalue)


def student_experience_problems(cells: list[CellRun]) -> list[str]:
    """What breaks the rule for a released notebook run top to bottom (with a resume after each error).

    The rule (a released notebook run by a student who has not started; CONTRIBUTING.md):
      1. Every test cell fails, and only with the message that names the blank exercise, which shows no
         traceback (helpers.checks.exercise_test: "exercise N … is not answered yet"; earlier_exercise: "… is
         not written yet — finish it first"), also where the answer runs in other processes.
      2. Answer cells may fail only with NotImplementedError.
      3. Every other cell runs without an error: a cell that needs an unfinished exercise says
         "finish exercise N first" (helpers.exercises.needs_exercise) instead of raising.
      4. Every code cell was executed (the browser resumed after each error).
    """
    problems: list[str] = []
    for cell in cells:
        where = f"cell {cell.index} ({cell.grade_id or cell.kind})"
        if not cell.executed:
            problems.append(f"{where} never ran")
            continue
        if cell.kind == "test" and not cell.errors:
            problems.append(f"{where}: the test passes on the blank released notebook")
        for ename, evalue in cell.errors:
            if cell.kind == "test" and ename in NAMED_BLANK:
                continue
            if cell.kind == "answer" and is_not_implemented(ename, evalue):
                continue
            problems.append(f"{where} failed with {ename}: {evalue} (allowed: NotImplementedError in an answer or "
                            "test cell; any other cell must say which exercise to finish first)")
    return problems


# ---------------------------------------------------------------- the page

NOTEBOOK_JS = ("(() => { const w = window.jupyterapp.shell.currentWidget; "
               "return w && !w.isDisposed && w.context && w.content && w.content.model ? w : null; })()")

JS_KERNEL_READY = f"""() => {{
  const w = {NOTEBOOK_JS};
  if (!w || !w.context.isReady || !w.sessionContext.isReady) return false;
  const k = w.sessionContext.session && w.sessionContext.session.kernel;
  return !!k && k.status === 'idle' && k.connectionStatus === 'connected'
         && w.content.node.querySelectorAll('.jp-Cell').length === w.content.model.cells.length;
}}"""

JS_EXECUTION_COUNTS = f"""() => {{
  const w = {NOTEBOOK_JS}; const cells = w.content.model.cells; const out = [];
  for (let i = 0; i < cells.length; i++) {{ const c = cells.get(i); out.push(c.type === 'code' ? c.executionCount : null); }}
  return out;
}}"""

# Done: some cell ran since `before`, no prompt shows [*], no cell model is running, the kernel is idle.
JS_RUN_FINISHED = f"""(before) => {{
  const w = {NOTEBOOK_JS}; const cells = w.content.model.cells;
  const k = w.sessionContext.session && w.sessionContext.session.kernel;
  if (!k || k.status !== 'idle') return false;
  let changed = false;
  for (let i = 0; i < cells.length; i++) {{
    const c = cells.get(i);
    if (c.type !== 'code') continue;
    if (c.executionState === 'running') return false;
    if (c.executionCount !== before[i]) changed = true;
  }}
  if (!changed) return false;
  for (const p of w.content.node.querySelectorAll('.jp-InputPrompt'))
    if (p.textContent.includes('*')) return false;
  return true;
}}"""

JS_CELLS = f"""() => {{
  const w = {NOTEBOOK_JS}; const cells = w.content.model.cells; const out = [];
  for (let i = 0; i < cells.length; i++) {{
    const j = cells.get(i).toJSON();
    out.push({{index: i, type: j.cell_type, source: Array.isArray(j.source) ? j.source.join('') : j.source,
      metadata: j.metadata || {{}}, execution_count: j.execution_count === undefined ? null : j.execution_count,
      outputs: (j.outputs || []).map(o => ({{output_type: o.output_type, ename: o.ename || null,
        evalue: o.evalue || null, mimes: o.data ? Object.keys(o.data) : [],
        svg: o.data && o.data['image/svg+xml'] ? [].concat(o.data['image/svg+xml']).join('') : null}}))}});
  }}
  return out;
}}"""

JS_GRAPH_IMAGES = f"""(i) => {{
  const w = {NOTEBOOK_JS};
  return Array.from(w.content.widgets[i].node.querySelectorAll('.jp-RenderedSVG img, .jp-RenderedImage img'))
    .map(im => ({{svg: !!im.closest('.jp-RenderedSVG'), complete: im.complete,
                  width: im.naturalWidth, height: im.naturalHeight}}));
}}"""

JS_SLIDERS = f"""(i) => {{
  const node = ({NOTEBOOK_JS}).content.widgets[i].node;
  return {{sliders: node.querySelectorAll('.widget-slider .noUi-handle').length,
          broken: /Error displaying widget|Error rendering|Loading widget/.test(
            node.querySelector('.jp-Cell-outputWrapper') ? node.querySelector('.jp-Cell-outputWrapper').innerText : '')}};
}}"""

JS_PLOT_SRC = f"""(i) => {{
  const img = ({NOTEBOOK_JS}).content.widgets[i].node.querySelector('.widget-output img, .jp-OutputArea-output img');
  return img ? img.getAttribute('src') : null;
}}"""

JS_PLOT_CHANGED = f"""([i, before]) => {{
  const img = ({NOTEBOOK_JS}).content.widgets[i].node.querySelector('.widget-output img, .jp-OutputArea-output img');
  return !!img && img.complete && img.naturalWidth > 0 && img.getAttribute('src') !== before;
}}"""


def svg_clipping(svg: str) -> str | None:
    """Why a graphviz SVG draws beyond its own viewBox (the browser then crops it), or None when it fits.

    graphviz writes `<g id="graph0" transform="scale(s s) … translate(4 H-4)">` around a drawing
    H units high; the drawing needs s·H units of the viewBox. graphviz 2.42 with a `dpi` other than 72
    scales the drawing by s = dpi/72 but leaves the viewBox at H: the graph shows cropped.
    """
    view = re.search(r'viewBox="([-\d.]+) ([-\d.]+) ([\d.]+) ([\d.]+)"', svg)
    group = re.search(r'<g id="graph0"[^>]*transform="scale\(([\d.]+)(?: ([\d.]+))?\)[^"]*translate\(([-\d.]+) ([-\d.]+)\)', svg)
    if not view or not group:
        return None
    width, height = float(view.group(3)), float(view.group(4))
    sx = float(group.group(1))
    sy = float(group.group(2) or sx)
    drawn = sy * (float(group.group(4)) + 4)
    if drawn > height * 1.02:
        return (f"the drawing is scaled by {sx:g}×{sy:g} but the viewBox is {width:g}×{height:g}: "
                f"it needs {drawn:.0f} units of height, so the browser crops it (graphviz `dpi` in SVG output?)")
    return None


def image_bytes(src: str | None) -> bytes:
    if not src or "base64," not in src:
        return (src or "").encode()
    return base64.b64decode(src.split("base64,", 1)[1])


class LabPage:
    """One JupyterLab page; notebooks are opened inside it the way a student opens them."""

    def __init__(self, page, server: LabServer) -> None:
        self.page, self.server = page, server

    def load(self, timeout_ms: int = 180_000) -> float:
        began = time.perf_counter()
        self.page.goto(f"{self.server.url}/lab?reset&token={self.server.token}", timeout=timeout_ms)
        self.page.wait_for_function("() => !!(window.jupyterapp && window.jupyterapp.shell "
                                    "&& document.querySelector('.lm-MenuBar-itemLabel'))", timeout=timeout_ms)
        self.page.evaluate("() => window.jupyterapp.restored")
        # Room for the notebook, as a lecturer would leave it: hide the file browser.
        self.page.evaluate("async () => { const s = window.jupyterapp.shell; if (!s.leftCollapsed) s.collapseLeft(); }")
        return time.perf_counter() - began

    def menu(self, *labels: str) -> None:
        """Click through the menu bar: menu('Run', 'Run All Cells')."""
        self.page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(f"^{re.escape(labels[0])}$")).first.click()
        for label in labels[1:]:
            item = self.page.locator(".lm-Menu:visible .lm-Menu-item",
                                     has=self.page.locator(".lm-Menu-itemLabel",
                                                           has_text=re.compile(f"^{re.escape(label)}$"))).last
            item.click()

    def open_notebook(self, path: str, timeout_ms: int = 180_000) -> float:
        """Open `path` (relative to the server root) like the file browser does; seconds until the kernel is idle."""
        began = time.perf_counter()
        self.page.evaluate("(path) => { window.jupyterapp.commands.execute('docmanager:open', {path, factory: 'Notebook'}); "
                           "return true; }", path)
        self.page.wait_for_function(f"(path) => {{ const w = {NOTEBOOK_JS}; return !!w && w.context.path === path; }}",
                                    arg=path, timeout=timeout_ms)
        self.page.wait_for_function(JS_KERNEL_READY, timeout=timeout_ms, polling=100)
        return time.perf_counter() - began

    def run(self, *menu_path: str, timeout_ms: int = 300_000) -> float:
        """Run cells from the Run menu; seconds until every cell it ran finished and the kernel is idle."""
        before = self.page.evaluate(JS_EXECUTION_COUNTS)
        began = time.perf_counter()
        self.menu("Run", *menu_path)
        while True:
            self.page.wait_for_function(JS_RUN_FINISHED, arg=before, timeout=timeout_ms, polling=100)
            elapsed = time.perf_counter() - began
            self.page.wait_for_timeout(400)   # still finished a moment later (widget comms can wake the kernel)
            if self.page.evaluate(JS_RUN_FINISHED, before):
                return elapsed

    def cells(self) -> list[dict]:
        return self.page.evaluate(JS_CELLS)

    def select_cell(self, index: int) -> None:
        """Select a cell by clicking its input prompt (command mode), as a student does."""
        self.page.evaluate(f"(i) => ({NOTEBOOK_JS}).content.widgets[i].node.scrollIntoView({{block: 'center'}})", index)
        self.page.locator(".jp-Notebook .jp-Cell").nth(index).locator(".jp-InputPrompt").first.click()
        self.page.wait_for_function(f"(i) => ({NOTEBOOK_JS}).content.activeCellIndex === i", arg=index, timeout=10_000)

    def graph_images(self, index: int, timeout_ms: int = 15_000) -> list[dict]:
        try:
            self.page.wait_for_function(f"(i) => ({JS_GRAPH_IMAGES})(i).some(im => im.svg && im.complete && im.width > 0)",
                                        arg=index, timeout=timeout_ms)
        except Exception:
            pass
        return self.page.evaluate(JS_GRAPH_IMAGES, index)

    def sliders(self, index: int) -> dict:
        return self.page.evaluate(JS_SLIDERS, index)

    def move_slider(self, index: int, timeout_ms: int = 60_000) -> dict:
        """Drag the first slider of cell `index` a quarter of its track and time its plot's redraw; then drag it
        back to where it started and compare the plot with the one the cell drew when it ran."""
        self.scroll_to(index, output=True)
        cell = self.page.locator(".jp-Notebook .jp-Cell").nth(index)
        handle, track = cell.locator(".noUi-handle").first, cell.locator(".noUi-base").first
        handle.scroll_into_view_if_needed()
        src_before = self.page.evaluate(JS_PLOT_SRC, index)
        h, t = handle.bounding_box(), track.bounding_box()
        x, y = h["x"] + h["width"] / 2, h["y"] + h["height"] / 2
        fraction = (x - t["x"]) / t["width"]
        target = x + (-0.25 if fraction > 0.5 else 0.25) * t["width"]

        def drag(src_from: str | None, x0: float, x1: float) -> float:
            self.page.mouse.move(x0, y)
            self.page.mouse.down()
            self.page.mouse.move(x1, y, steps=8)
            began = time.perf_counter()
            self.page.mouse.up()
            self.page.wait_for_function(JS_PLOT_CHANGED, arg=[index, src_from], timeout=timeout_ms, polling="raf")
            return time.perf_counter() - began

        readout = cell.locator(".widget-slider .widget-readout").first
        readout_before = readout.inner_text().strip()
        redraw = drag(src_before, x, target)
        src_moved = self.page.evaluate(JS_PLOT_SRC, index)
        value_moved = handle.get_attribute("aria-valuenow")
        back_redraw = drag(src_moved, target, x)
        restored_by = "drag"
        if readout.inner_text().strip() != readout_before and readout.get_attribute("contenteditable") == "true":
            # Dragging snaps to the step grid (0.5 comes back as 0.501): type the start value instead.
            src_dragged = self.page.evaluate(JS_PLOT_SRC, index)
            readout.click()
            self.page.keyboard.press("Control+A")
            self.page.keyboard.type(readout_before)
            self.page.keyboard.press("Enter")
            self.page.wait_for_function(JS_PLOT_CHANGED, arg=[index, src_dragged], timeout=timeout_ms, polling="raf")
            restored_by = "typed into the readout"
        src_back = self.page.evaluate(JS_PLOT_SRC, index)
        same_value = readout.inner_text().strip() == readout_before
        return {"redraw_s": redraw, "back_redraw_s": back_redraw, "value_before": readout_before,
                "value_moved": value_moved, "value_back": readout.inner_text().strip(), "restored_by": restored_by,
                "plot_changed": src_before is not None and image_bytes(src_before) != image_bytes(src_moved),
                "plot_restored": (image_bytes(src_back) == image_bytes(src_before)) if same_value else None}

    def scroll_to(self, index: int, output: bool = False) -> None:
        """Scroll cell `index` (or, with `output`, its output area when it has one) to the top of the view."""
        self.page.evaluate(f"""([i, output]) => {{
          const node = ({NOTEBOOK_JS}).content.widgets[i].node;
          const target = (output && node.querySelector('.jp-Cell-outputWrapper .jp-OutputArea-child')) || node;
          target.scrollIntoView({{block: 'start'}});
          const scroller = target.closest('.jp-WindowedPanel-outer');
          if (scroller) scroller.scrollTop -= 24;   // keep the first line clear of the toolbar
        }}""", [index, output])
        self.page.wait_for_timeout(300)
        # Cells above render and change height as they come into view (content-visibility): scroll again.
        self.page.evaluate(f"""([i, output]) => {{
          const node = ({NOTEBOOK_JS}).content.widgets[i].node;
          const target = (output && node.querySelector('.jp-Cell-outputWrapper .jp-OutputArea-child')) || node;
          target.scrollIntoView({{block: 'start'}});
          const scroller = target.closest('.jp-WindowedPanel-outer');
          if (scroller) scroller.scrollTop -= 24;
        }}""", [index, output])
        self.page.wait_for_timeout(300)

    def presentation_mode(self) -> dict:
        """Toggle View → Appearance → Presentation Mode; the shell's class and the code font size."""
        self.menu("View", "Appearance", "Presentation Mode")
        self.page.wait_for_timeout(300)
        return self.page.evaluate("""() => ({
          on: document.querySelector('#main').classList.contains('jp-mod-presentationMode'),
          code_font_px: parseFloat(getComputedStyle(document.querySelector('.jp-Notebook .jp-Cell .cm-content')).fontSize)})""")

    def close_notebook(self) -> None:
        """Close the notebook tab without saving and shut its kernel down."""
        self.page.evaluate(f"() => {{ const w = {NOTEBOOK_JS}; if (w) {{ w.context.model.dirty = false; w.dispose(); }} }}")
        self.server.shutdown_kernels()
