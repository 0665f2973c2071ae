"""Every released notebook as a student first meets it: opened fresh in JupyterLab in a real browser and run.

A JupyterLab server and one Chromium page of this module's own (browser_lab.lab_fixture, as in
tests/test_browser.py) serve a copy of notebooks/. Each notebook (notebooks/*/*.ipynb) is run from Run → Run All
Cells with its blank answers; the browser stops at the first error, so the test resumes with Run → Run Selected Cell
and All Below on the next cell, as a student would. Asserted: the student-experience rule in
`browser_lab.student_experience_problems` (no error before the first exercise; test cells fail only with the
message that names the blank exercise, no traceback; answer cells only with NotImplementedError). Artifacts in
test-artifacts/browser/: a screenshot per notebook at its first blank exercise, and timings-released.json.
"""

from __future__ import annotations

import pytest
from browser_lab import NAMED_BLANK, CellRun, errors, lab_fixture, notebooks_in, screenshot, student_experience_problems
from conftest import REPO

pytestmark = pytest.mark.slow

RELEASED = notebooks_in("notebooks")
lab = lab_fixture("notebooks", "timings-released.json")


@pytest.mark.parametrize("path", RELEASED, ids=[p.stem for p in RELEASED])
def test_released_notebook_student_experience(lab, path):
    page, timings = lab
    rel = path.relative_to(REPO).as_posix()
    open_s = page.open_notebook(rel)
    try:
        run_s = page.run("Run All Cells")
        resumes = 0
        while True:
            cells = page.cells()
            code = [c for c in cells if c["type"] == "code"]
            failed = [c["index"] for c in code if errors(c)]
            waiting = [c["index"] for c in code if c["execution_count"] is None and failed and c["index"] > failed[0]]
            if not waiting or resumes > len(code):
                break
            page.select_cell(waiting[0])   # the student carries on below the failed cell
            run_s += page.run("Run Selected Cell and All Below")
            resumes += 1
        runs = []
        for c in code:
            info = c["metadata"].get("nbgrader", {})
            kind = "answer" if info.get("solution") else "test" if info.get("grade") else "other"
            runs.append(CellRun(c["index"], kind, info.get("grade_id", ""), c["source"],
                                c["execution_count"] is not None, errors(c)))
        problems = student_experience_problems(runs)
        first_blank = next((c["index"] for c in code if any(e in NAMED_BLANK for e, _ in errors(c))), 0)
        page.scroll_to(first_blank, output=True)
        shot = screenshot(page, f"{path.stem}-released")
    finally:
        page.close_notebook()

    timings.add(f"{path.stem}-released", {
        "open_s": round(open_s, 2), "run_all_s": round(run_s, 2), "resumes_after_errors": resumes,
        "errors": {f"{r.index} {r.grade_id or r.kind}": [e for e, _ in r.errors] for r in runs if r.errors},
        "screenshot": shot.relative_to(REPO).as_posix(),
    })
    print(f"\n{path.stem} (released): open {open_s:.1f} s, run {run_s:.1f} s with {resumes} resume(s) after errors; "
          f"screenshot {shot.name}")
    assert not problems, "\n".join(problems)
