"""The student's feedback page: their cells, the tests as released, and the grader's verdict on each.

Written on the trusted side from the rebuilt notebook and the grading run. It shows what a student
may see and nothing else: the released (visible) test code, never hidden source; the outputs of the
student's cells, which all ran before the first hidden test (grader/judge/grading.py plans it so: the
outflow rule lets nothing the kernel produced after that point through); and for each test the points
and the verdict message. Everything that came from the student is escaped;
the page runs no script and loads nothing (its Content-Security-Policy forbids both).

Two modes of the same page (`autograde --feedback`, or `feedback =` in the grading config):
"after-release" (the default) shows each hidden test's message and the known mistake it looks like;
"at-once", for pages students see before the deadline, shows the points per test and nothing of what
the hidden tests found.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import functools
import html
import re
from pathlib import Path

import mistune
import nbformat

from grader.author import bootstrap
from grader.judge.grading import Graded
from grader.judge.rebuild import ADDED
from grader.kernel.harness import StepRun
from grader.report.page import html_page
from grader.results import Note, points
from labkit import cells

MAX_TEXT_CHARS = 20_000  # per output shown
MAX_IMAGE_BYTES = 2 * 2**20
MAX_PAGE_CHARS = 8 * 2**20
MODES = ("after-release", "at-once")
HELD_BACK = "what the hidden tests found is shown after the release"
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
REMOTE_IMAGE = re.compile(r"<img\b(?![^>]*\bsrc=\"data:)[^>]*>", re.I)
STYLE = """
body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#111}
table{border-collapse:collapse}td,th{border:1px solid #bbb;padding:.3rem .6rem;text-align:left;vertical-align:top}
pre{background:#f6f6f6;padding:.6rem;overflow-x:auto;white-space:pre-wrap}
.cell{margin:1rem 0}.label{font-size:.8rem;color:#555}.pass{color:#176b2c}.fail{color:#a4161a}
.verdict{border-left:4px solid #999;padding:.3rem .8rem;margin:.4rem 0}.out{border-left:3px solid #ccc;padding-left:.5rem}
"""


def _text(value: object) -> str:
    text = ANSI.sub("", value if isinstance(value, str) else "".join(map(str, value)) if isinstance(value, list) else str(value))
    if len(text) > MAX_TEXT_CHARS:
        text = text[:MAX_TEXT_CHARS] + f"\n… ({len(text) - MAX_TEXT_CHARS} more characters not shown)"
    return html.escape(text)


def _png(data: object) -> str:
    if not isinstance(data, str) or len(data) > MAX_IMAGE_BYTES * 4 // 3 + 4:
        return ""
    try:
        raw = base64.b64decode(data.replace("\n", ""), validate=True)
    except (binascii.Error, ValueError):
        return ""
    if not raw.startswith(b"\x89PNG\r\n\x1a\n"):
        return ""
    return f'<img alt="figure" src="data:image/png;base64,{base64.b64encode(raw).decode()}">'


def _outputs(run: StepRun) -> str:
    parts = []
    for out in run.outputs:
        kind = out.get("output_type")
        if kind == "stream":
            parts.append(f"<pre>{_text(out.get('text', ''))}</pre>")
        elif kind == "error":
            parts.append(f"<pre>{_text(out.get('ename', ''))}: {_text(out.get('evalue', ''))}</pre>")
        elif kind in ("display_data", "execute_result"):
            data = out.get("data", {})
            image = _png(data.get("image/png"))
            parts.append(image or f"<pre>{_text(data.get('text/plain', ''))}</pre>")
    return f'<div class="out">{"".join(parts)}</div>' if parts else ""


def _cells(notebook: nbformat.NotebookNode, graded: Graded, released: bool = True) -> list[str]:
    runs: dict[str, tuple[int, StepRun]] = {}
    for index, (step, run) in enumerate(zip(graded.steps, graded.runs)):
        runs.setdefault(step.label, (index, run))
    shown = []
    for index, cell in enumerate(notebook.cells):
        cell_kind, grade_id = cells.kind(cell), cells.grade_id(cell)
        if cell_kind == cells.WRITTEN:  # the student's own text: shown as text, never rendered
            shown.append(f'<div class="cell"><div class="label">your written answer {html.escape(grade_id)} (graded by '
                         f'hand)</div><pre>{_text(cell.source)}</pre></div>')
            continue
        if cell.cell_type == "markdown":
            # The release's prose is the course's own; a student's added prose is shown as text.
            if cell.get("id") in (bootstrap.MARKDOWN_ID, bootstrap.HAND_IN_ID):
                continue  # the "Open in Colab" header and the hand-in footer: nothing to do with the grade
            body = f"<pre>{_text(cell.source)}</pre>" if cell.metadata.get(ADDED) else _prose(cell.source)
            shown.append(f'<div class="cell">{body}</div>')
            continue
        if cell.cell_type != "code" or cell_kind == cells.BOOTSTRAP:
            continue
        if cell_kind == cells.TEST:
            v = graded.verdicts.get(grade_id)
            verdict = ("" if v is None else
                       f'<div class="verdict {"pass" if v.passed else "fail"}">{points(v.points)} / {points(v.max_points)} '
                       f'points{" — " + _text(v.message) if v.message and released else ""}</div>')
            shown.append(f'<div class="cell"><div class="label">test {html.escape(grade_id)} (as released; hidden '
                         f'tests ran at grading)</div><pre>{_text(cell.source)}</pre>{verdict}</div>')
            continue
        theirs = cell_kind in (cells.ANSWER, cells.ADDED)
        label = (f"your answer {grade_id}" if cell_kind == cells.ANSWER else
                 f"your cell {index + 1}" if cell_kind == cells.ADDED else f"read-only cell {grade_id}")
        index_run = runs.get(grade_id or f"cell {index + 1}")
        outputs = ""
        if index_run is not None and index_run[0] < graded.first_test and theirs:
            outputs = _outputs(index_run[1])  # every cell of theirs ran before the first hidden test
        shown.append(f'<div class="cell"><div class="label">{html.escape(label)}</div>'
                     f"<pre>{_text(cell.source)}</pre>{outputs}</div>")
    return shown


@functools.lru_cache(maxsize=1024)
def _prose(markdown: str) -> str:
    """The release's own markdown as HTML, without images from elsewhere (the page fetches nothing); rendered once
    per worker (every hand-in shows the same prose)."""
    return REMOTE_IMAGE.sub("", str(mistune.html(markdown)))


def _verdict(v, mistakes: dict[str, str], released: bool) -> str:
    if v.passed:
        return "passed"
    if not released:
        return f"not passed — {HELD_BACK}"
    return ((_text(v.message) or "not passed")
            + (f"<br><i>This looks like a known mistake: {_text(mistakes[v.test])}.</i>" if v.test in mistakes else ""))


def _regraded(graded: Graded, overrides: dict[str, dict]) -> tuple[Graded, str]:
    """The verdicts with the instructor's overrides in place (Result.overrides, from grader/collect/deadlines.py's
    `settle`), and the page's line that says so ("" when there are none)."""
    if not overrides:
        return graded, ""
    verdicts = {test: dataclasses.replace(v, points=overrides[test]["points"]) if test in overrides else v
                for test, v in graded.verdicts.items()}
    said = "; ".join(f"{html.escape(test)}: {points(o['points'])} points for the written answer — {_text(o['reason'])}"
                     if test not in graded.verdicts else  # a written answer: only ever graded by hand
                     f"{html.escape(test)}: {points(o['graded'])} → {points(o['points'])} points — {_text(o['reason'])}"
                     for test, o in overrides.items())
    return dataclasses.replace(graded, verdicts=verdicts), f"<p><b>Regraded by hand:</b> {said}.</p>"


def write_feedback(path: Path, *, student: str, assignment: str, notebook: nbformat.NotebookNode, graded: Graded,
                   status: list[Note], mistakes: dict[str, str] | None = None, mode: str = "after-release",
                   late: str = "", penalty: float = 0.0, overrides: dict[str, dict] | None = None) -> None:
    """Write the feedback page for one graded submission; `mistakes`: test → the known mistake it looks like.

    `mode` is "after-release" (messages and known mistakes shown) or "at-once" (points per test only);
    `late` says how late the hand-in was ("" when on time) and `penalty` the points that cost;
    `overrides` the exercises the instructor regraded by hand (`_regraded`).
    """
    if mode not in MODES:
        raise ValueError(f"feedback mode {mode!r}: must be one of {', '.join(MODES)}")
    graded, regraded = _regraded(graded, overrides or {})
    released = mode == "after-release"
    total = sum(v.points for v in graded.verdicts.values())
    maximum = sum(v.max_points for v in graded.verdicts.values())
    mistakes = mistakes or {}
    rows = "".join(
        f'<tr><td>{html.escape(v.test)}</td><td class="{"pass" if v.passed else "fail"}">{points(v.points)} / '
        f"{points(v.max_points)}</td><td>{_verdict(v, mistakes, released)}</td></tr>"
        for v in graded.verdicts.values())
    notes = "".join(f"<li>{_text(note.text)}</li>" for note in status) or "<li>ok</li>"
    body = "".join(_cells(notebook, graded, released))
    held = "" if released else f"<p><i>Points per test only: {HELD_BACK}.</i></p>"
    late_line = (f"<p><b>Late:</b> {_text(late)}"
                 + (f" — {points(penalty)} points taken: <b>{points(round(total - penalty, 2))} / {points(maximum)}</b> "
                    "after the penalty" if penalty else "") + ".</p>") if late else ""
    page = html_page(
        f"{assignment} — feedback for {student}", STYLE,
        f"<h1>{html.escape(assignment)}</h1><p>Feedback for <b>{html.escape(student)}</b>: "
        f"<b>{points(total)} / {points(maximum)}</b> points{' before the late penalty' if penalty else ''}.</p>"
        f"{regraded}{late_line}{held}"
        f"<table><tr><th>test</th><th>points</th><th>verdict</th></tr>{rows}</table>"
        f"<h2>Notes</h2><ul>{notes}</ul><h2>Your notebook, as graded</h2>{body}")
    if len(page) > MAX_PAGE_CHARS:
        page = page[:MAX_PAGE_CHARS - 200] + "<p>… the rest of this page was cut: it was too large.</p></body></html>"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")
