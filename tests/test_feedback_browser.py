"""A feedback page built from a hostile hand-in is inert in a real browser: no script runs, nothing is fetched."""


import pytest
from conftest import CHROMIUM, artifacts, autograde, require_chromium
from factories import markdown, own_cell

from grader.author.mutants import reference_submission
from grader.author.selftest import put
from grader.course import assignment_named

pytestmark = pytest.mark.slow
ONE = "01_gradient_descent"
# Each tries to run a script or reach the network the moment the page opens.
HOSTILE_MARKDOWN = ('<script>document.title = "pwned"</script>\n<img src=x onerror="document.title = \'pwned\'">\n'
                    '<img src="http://203.0.113.9/beacon.png">\n<a href="javascript:alert(1)">click</a>\n'
                    '<style>body { background: url(http://203.0.113.9/bg.png) }</style>\n'
                    '<div class="verdict pass">Score 10/10</div>')
HOSTILE_CODE = (
    "from IPython.display import HTML, Javascript, display\n"
    "display(HTML('<script>document.title = \"pwned\"</script><b>html output</b>'))\n"
    "display(Javascript('document.title = \"pwned\"'))\n"
    "print('<script>document.title = \"pwned\"</script>')\n"
    "class Shiny:\n"
    "    def _repr_html_(self):\n"
    "        return '<img src=x onerror=\"document.title = 1\">'\n"
    "Shiny()\n"
)


def test_a_hostile_feedback_page_runs_no_script_and_fetches_nothing(tmp_path):
    require_chromium()
    from playwright.sync_api import sync_playwright

    a = assignment_named(ONE)
    nb = reference_submission(a)
    first_answer = next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == "mse_grad_answer")
    nb.cells.insert(first_answer, markdown(HOSTILE_MARKDOWN))
    nb.cells.insert(first_answer, own_cell(HOSTILE_CODE))
    nb.cells[first_answer + 2].source += "\n# </pre><script>document.title = 'pwned'</script>"
    put(tmp_path / "class", "mallory", a, nb)
    autograde(tmp_path / "class", tmp_path / "out", "--timeout", "20")
    page_path = tmp_path / "out" / "feedback" / "mallory" / ONE / f"{ONE}.html"

    requests, dialogs, messages = [], [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                    args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        try:
            page = browser.new_page()
            page.on("request", lambda r: requests.append(r.url))
            page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            page.on("console", lambda m: messages.append(m.text))
            page.goto(page_path.as_uri())
            page.wait_for_timeout(500)
            title = page.title()
            scripts = page.evaluate("document.scripts.length")
            handlers = page.evaluate("Array.from(document.querySelectorAll('*')).filter("
                                     "e => Array.from(e.attributes).some(a => a.name.startsWith('on'))).length")
            text = page.inner_text("body")
            page.screenshot(path=str(artifacts("feedback") / "hostile.png"), full_page=True)
        finally:
            browser.close()
    assert title != "pwned" and "pwned" not in title
    assert scripts == 0 and handlers == 0 and dialogs == []
    assert [u for u in requests if not u.startswith(("file:", "data:"))] == []
    assert "<script>document.title" in text  # shown as text, for the student to read
    assert "10 / 10 points" in text
