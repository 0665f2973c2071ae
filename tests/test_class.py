"""Classes of notebook-01 submissions — correct, wrong, broken, hostile and honest — graded in one run each.

The hostile class tries, with blank or wrong answers, every way a student has found to fool a grader whose
tests run in the student's kernel (issue 11): none may earn a point, because the grade is decided outside
the kernel from the values the student's functions return. The honest class adds what students really do
(scratch cells reusing the lesson's names, magics, prints, warnings, drafts, other editors' files): each must
keep every point with status `ok`. Attacks that try to read what the sandbox hides *earn* points only when the
read succeeds, so a sandbox leak shows up as unexpected points.
"""

import base64
import copy
import csv
import json
import re
import shutil
from importlib import metadata

import nbformat
import pytest
from conftest import REPO, autograde, read_rows, shown_lines
from factories import markdown, own_cell

from grader.author.check import secret_lines
from grader.author.mutants import load_mutants, mutant_submission, reference_submission
from grader.author.selftest import Expected, mismatches, put
from grader.batch.autograde import SandboxUnavailable, code_digest
from grader.batch.autograde import autograde as autograde_in_process
from grader.course import assignment_named
from grader.kernel import kernelspec, limits, sandbox

pytestmark = pytest.mark.slow
ONE = "01_gradient_descent"
TIMEOUT = "10"  # seconds per cell: the slowest reference cell (the imports) takes about 3 s on an idle 2-core machine
A = assignment_named(ONE)
FULL = A.grade_cells()
ZERO = {k: 0.0 for k in FULL}


def _index(nb, grade_id):
    return next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def with_code(cell: str, extra: str, base=None) -> nbformat.NotebookNode:
    """The reference submission (or `base`) with `extra` appended to the answer cell `cell`."""
    nb = base or reference_submission(A)
    nb.cells[_index(nb, cell)].source += "\n" + extra
    return nb


def with_answer(cell: str, source: str, base=None) -> nbformat.NotebookNode:
    nb = base or reference_submission(A)
    nb.cells[_index(nb, cell)].source = source
    return nb


def with_cell(source: str, after: str = "setup", base=None, cell_type: str = "code") -> nbformat.NotebookNode:
    """`base` (default: the reference) with a cell of the student's own inserted after cell `after`."""
    nb = base or reference_submission(A)
    new = own_cell(source) if cell_type == "code" else markdown(source)
    nb.cells.insert(_index(nb, after) + 1, new)
    return nb


def blank():
    return nbformat.read(A.release, as_version=4)


def earns_only_if(condition: str) -> str:
    """An mse_grad that is right only when `condition` (an attack's success) holds."""
    return (
        "def mse_grad(w, X, y):\n"
        f"    if {condition}:\n"
        "        return (2.0 / X.shape[0]) * X.T @ (X @ w - y)\n"
        "    return torch.zeros_like(w)\n"
    )


WRONG_MSE = "def mse_grad(w, X, y):\n    return torch.zeros_like(w)\n"
NOOP = "lambda *args, **kwargs: None"
# Every way found to fool tests that run beside the student's code (issue 11). Each comes with blank answers.
ATTACKS = {
    "locals-update": f"locals().update(check={NOOP}, check_tensor={NOOP}, check_scalar={NOOP}, check_unchanged={NOOP})",
    "rebind-inside-if": f"if True:\n    check_tensor = check_scalar = check = {NOOP}",
    "rebind-walrus": f"(check_tensor := {NOOP}, check_scalar := {NOOP})",
    "rebind-global-in-function": f"def quiet():\n    global check, check_tensor, check_scalar\n"
                                 f"    check = check_tensor = check_scalar = {NOOP}\nquiet()",
    "module-alias": f"import helpers.checks as hc\n_m = hc\n_m.fail = {NOOP}\n_m.check_tensor = _m.check_scalar = {NOOP}",
    "module-setattr": "import torch\ntorch.__setattr__('allclose', lambda *a, **k: True)\n"
                      "torch.__setattr__('equal', lambda *a, **k: True)",
    "module-dict": "import torch\ngetattr(torch, '__dict__')['allclose'] = lambda *a, **k: True",
    "subclasses-to-sys-modules": (
        "importer = [c for c in ().__class__.__base__.__subclasses__() if c.__name__ == 'BuiltinImporter'][0]\n"
        f"modules = importer.load_module('sys').modules\nmodules['helpers.checks'].check_tensor = {NOOP}\n"
        "modules['torch'].allclose = lambda *a, **k: True"),
    "exec-base64": "import base64\nexec(base64.b64decode(" + repr(base64.b64encode(
        f"import helpers.checks, torch\nhelpers.checks.check_tensor = {NOOP}\ntorch.allclose = lambda *a, **k: True"
        .encode())) + "))",
    "ast-transformer-try-except": (
        "import ast\nclass Swallow(ast.NodeTransformer):\n    def visit_Module(self, node):\n"
        "        handler = ast.ExceptHandler(type=None, name=None, body=[ast.Pass()])\n"
        "        return ast.fix_missing_locations(ast.Module(body=[ast.Try(body=node.body or [ast.Pass()], "
        "handlers=[handler], orelse=[], finalbody=[])], type_ignores=[]))\n"
        "get_ipython().ast_transformers.append(Swallow())"),
    "displayhook-partial-credit": "import os\nos.sys.displayhook('x')\nos.sys.displayhook(10)",
    "background-thread-patcher": (
        "import threading, time, helpers.checks, torch\ndef patch():\n    while True:\n"
        f"        helpers.checks.check_tensor = helpers.checks.check_scalar = {NOOP}\n"
        "        torch.allclose = lambda *a, **k: True\n        time.sleep(0.001)\n"
        "threading.Thread(target=patch, daemon=True).start()"),
    "fake-results": (
        "import threading, time\nfrom IPython.display import display\ndef spam():\n    while True:\n"
        "        display({'application/vnd.tml.observations+json': {'test': 'mse_grad', 'observed': [], "
        "'expected': [], 'error': None}}, raw=True)\n        time.sleep(0.01)\n"
        "threading.Thread(target=spam, daemon=True).start()"),
    "swallow-exec": "import builtins\nbuiltins.exec = lambda *a, **k: None",
    "audit-hook-steals-tests": (
        "import sys\nstolen = []\nsys.addaudithook(lambda event, args: stolen.append(str(args)[:5000]) "
        "if event == 'exec' else None)"),
}
# The same, aimed at answers: wrong or blank functions dressed up to pass.
LIARS = {
    "tensor-subclass-allclose": (
        "class Liar(torch.Tensor):\n    @classmethod\n    def __torch_function__(cls, func, types, args=(), kwargs=None):\n"
        "        if func in (torch.allclose, torch.equal):\n            return True\n"
        "        return super().__torch_function__(func, types, args, kwargs or {})\n"
        "def mse_grad(w, X, y):\n    return torch.zeros_like(w).as_subclass(Liar)\n"),
    "float-subclass-reads-frames": (
        "import sys\nclass Sneaky(float):\n    def __new__(cls):\n        return super().__new__(cls, 0.0)\n"
        "    def _peek(self):\n        frame = sys._getframe(1)\n        while frame:\n"
        "            if 'expected' in frame.f_locals:\n                return float(frame.f_locals['expected'])\n"
        "            frame = frame.f_back\n        return 0.0\n"
        "    def __float__(self):\n        return self._peek()\n    def __eq__(self, other):\n        return True\n"
        "    __hash__ = float.__hash__\n"
        "def critical_lr(X):\n    return Sneaky()\n"),
    "enable-grad-undoes-no-autograd": (
        "def mse_grad(w, X, y):\n    with torch.enable_grad():\n        w = w.detach().requires_grad_(True)\n"
        "        return torch.autograd.grad(((X @ w - y) ** 2).mean(), w)[0]\n"),
}
LIARS["half-precision-hides-a-wrong-answer"] = (  # ignores eps; bfloat16 rounding would hide it under loose tolerances
    "def numerical_grad(f, w, eps=1e-3):\n    eps = 1e-3\n    grad = torch.zeros_like(w)\n    for i in range(w.numel()):\n"
    "        step = torch.zeros_like(w)\n        step.view(-1)[i] = eps\n"
    "        grad.view(-1)[i] = (float(f(w + step)) - float(f(w - step))) / (2 * eps)\n    return grad.bfloat16()\n")
LIARS["complex-answer"] = "def mse_grad(w, X, y):\n    return (2.0 / X.shape[0]) * X.T @ (X @ w - y) * 1.5 + 0j\n"
LIAR_CELLS = {"tensor-subclass-allclose": "mse_grad_answer", "float-subclass-reads-frames": "critical_lr_answer",
              "enable-grad-undoes-no-autograd": "mse_grad_answer", "half-precision-hides-a-wrong-answer": "numerical_grad_answer",
              "complex-answer": "mse_grad_answer"}
LIAR_EXERCISE = {"tensor-subclass-allclose": "mse_grad", "float-subclass-reads-frames": "critical_lr",
                 "enable-grad-undoes-no-autograd": "mse_grad", "half-precision-hides-a-wrong-answer": "numerical_grad",
                 "complex-answer": "mse_grad"}


@pytest.fixture(scope="module")
def graded_class(tmp_path_factory):
    root = tmp_path_factory.mktemp("class")
    cls = root / "class"
    expected: dict[tuple[str, str], Expected] = {}

    def add(student, nb, scores, status="ok"):
        if nb is not None:
            put(cls, student, A, nb)
        expected[student, ONE] = Expected(scores, status)

    def raw(student, name, content: str | bytes):
        (cls / student / ONE).mkdir(parents=True, exist_ok=True)
        path = cls / student / ONE / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())

    # correct, blank and wrong work: every mutant costs exactly its exercise
    for i in range(3):
        add(f"correct-{i}", reference_submission(A), FULL)
    add("blank", blank(), ZERO)
    for mutant in load_mutants(A):
        add(f"wrong-{mutant.name}", mutant_submission(A, [mutant]), {**FULL, mutant.exercise: 0.0})

    # hostile: blank answers plus an attack earn nothing; liars' answers earn nothing for their exercise
    # (status: anything — interference may be noted for the instructor)
    for name, attack in ATTACKS.items():
        add(f"attack-{name}", with_cell(attack, base=blank()), ZERO, status="")
    for name, liar in LIARS.items():
        add(f"liar-{name}", with_answer(LIAR_CELLS[name], liar), {**FULL, LIAR_EXERCISE[name]: 0.0}, status="")
    # an answer that smuggles a hidden line out through its return value's class name: shows nothing hidden
    add("type-name-channel", with_answer("mse_grad_answer", (
        "import sys\ndef mse_grad(w, X, y):\n    f = sys._getframe()\n"
        "    while f is not None and 'code' not in f.f_locals:\n        f = f.f_back\n"
        "    line = next(l for l in f.f_locals['code'].splitlines() if 'manual_seed' in l).strip()\n"
        "    return type(line[:60], (), {})()\n")), {**FULL, "mse_grad": 0.0}, status="")
    # an answer that prints whatever the tests ran, cell after cell: earns what it is worth, shows nothing hidden
    nb = with_cell("print(_i, _ii, _iii)\nprint(stolen if 'stolen' in dir() else '')",
                   after="critical_lr", base=with_cell(ATTACKS["audit-hook-steals-tests"]))
    for test in ("mse_grad", "numerical_grad", "gradient_descent"):
        nb = with_cell("print(_i, _ii, _iii)", after=test, base=nb)
    add("prints-history-after-tests", nb, FULL)

    # files that are not what they should be
    raw("corrupted-json", A.notebook, '{"cells": [ this is not json')
    add("corrupted-json", None, ZERO, "invalid notebook: JSONDecodeError")
    raw("binary-garbage", A.notebook, bytes(range(256)) * 4)
    add("binary-garbage", None, ZERO, "invalid notebook")
    old = json.loads(nbformat.writes(reference_submission(A)))
    old["nbformat"] = 3
    raw("wrong-nbformat", A.notebook, json.dumps(old))
    add("wrong-nbformat", None, ZERO, "invalid notebook: ValueError: nbformat 3")
    raw("nothing-handed-in", "notes.txt", "forgot the notebook")
    add("nothing-handed-in", None, ZERO, "missing notebook 01_gradient_descent.ipynb (found: no notebook)")
    raw("renamed", "my_work.ipynb", nbformat.writes(reference_submission(A)))
    raw("renamed", "scratch.txt", "x")
    add("renamed", None, FULL, "renamed: graded my_work.ipynb as 01_gradient_descent.ipynb; extra files ignored: scratch.txt")
    raw("uploaded-twice", f"{ONE} (1).ipynb", nbformat.writes(reference_submission(A)))
    add("uploaded-twice", None, FULL, f"renamed: graded {ONE} (1).ipynb as {ONE}.ipynb")
    odd = json.loads(nbformat.writes(reference_submission(A)))
    odd["cells"][0]["metadata"]["nbgrader"] = "not a dict"
    raw("string-metadata", A.notebook, json.dumps(odd))
    add("string-metadata", None, FULL, "ok")

    # tampering with cells: undone from the source, named in the status, no points lost or gained
    nb = reference_submission(A)
    nb.cells = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") != "critical_lr"]
    add("deleted-test-cell", nb, FULL, "tampered: deleted cell critical_lr restored")
    add("edited-test-cell", with_answer("mse_grad", "print('all tests passed')"), FULL,
        "tampered: edited locked cell mse_grad restored")
    add("edited-read-only-cell", with_answer("setup", "X = y = None"), FULL, "tampered: edited locked cell setup restored")
    nb = reference_submission(A)
    nb.cells[_index(nb, "gradient_descent")].metadata.nbgrader.update(grade=False, points=100)
    add("changed-metadata", nb, FULL, "tampered: changed metadata of gradient_descent restored")
    nb = reference_submission(A)
    nb.cells.append(copy.deepcopy(nb.cells[_index(nb, "mse_grad")]))  # a check run again further down: no edit
    add("copied-test-cell", nb, FULL, "ok")
    nb.cells[-1].source += "\nassert True"
    add("duplicated-test-cell", nb, FULL, "tampered: duplicated cell mse_grad ignored")
    # Stripped by a tool that clears cell metadata (ids kept): answers matched by id, nothing tampered with.
    nb = reference_submission(A)
    for cell in nb.cells:
        cell.metadata = {}
    add("metadata-stripped", nb, FULL, "metadata restored: ")
    # An answer copied to the end to try a mistake (the copy keeps the metadata): that copy is graded, and said.
    nb = reference_submission(A)
    draft = copy.deepcopy(nb.cells[_index(nb, "mse_grad_answer")])
    draft.source = WRONG_MSE
    nb.cells.append(draft)
    add("answer-copied-to-the-end", nb, {**FULL, "mse_grad": 0.0}, "answer copied: mse_grad_answer appears more")
    nb = reference_submission(A)
    nb.cells = []
    add("emptied-notebook", nb, ZERO, "tampered: deleted answer cell mse_grad_answer restored")

    # reaching outside: the sandbox hides files and the network (points only if the attack works)
    lose_mse = {**FULL, "mse_grad": 0.0}
    add("reads-solutions", with_answer("mse_grad_answer", "import os\n" + earns_only_if(f"os.path.exists({str(A.source)!r})")),
        lose_mse)
    add("reads-other-students", with_answer("mse_grad_answer", "import os\n" + earns_only_if(
        f"os.path.exists({str(cls / 'correct-0')!r})")), lose_mse)
    add("reads-the-reference-records", with_answer("mse_grad_answer", "import os\n" + earns_only_if(
        f"os.path.exists({str(REPO / 'build')!r})")), lose_mse)
    add("reads-notebooks-in-cwd", with_answer("mse_grad_answer", "import glob\n" + earns_only_if(
        "glob.glob('*.ipynb') or glob.glob('../*/*.ipynb')")), lose_mse)
    add("uses-network", with_answer("mse_grad_answer", "import socket\n" + earns_only_if(
        "any(name != 'lo' for _, name in socket.if_nameindex())")), lose_mse)

    # failing while running: a crash costs only what it breaks
    add("never-finishes", with_code("numerical_grad_answer", "while True:\n    pass"), FULL,
        "timeout in cell numerical_grad_answer")
    add("ignores-interrupt", with_code("gradient_descent_answer",
                                       "import time\nwhile True:\n    try:\n        time.sleep(0.05)\n"
                                       "    except KeyboardInterrupt:\n        pass"),
        {**FULL, "gradient_descent": 0.0}, "timeout in cell gradient_descent_answer (the kernel was stopped)")
    add("kernel-dies", with_answer("critical_lr_answer", "import os\nos._exit(1)"), {**FULL, "critical_lr": 0.0},
        "kernel died in cell critical_lr_answer")
    add("kernel-dies-in-a-test", with_answer("numerical_grad_answer", "import os\ndef numerical_grad(f, w, eps=1e-3):\n"
                                             "    os._exit(1)"), {**FULL, "numerical_grad": 0.0},
        "kernel died in test numerical_grad")
    add("eats-memory", with_code("critical_lr_answer", "hog = bytearray(8 * 2**30)"), FULL,
        "out of memory in cell critical_lr_answer")
    add("floods-output", with_code("numerical_grad_answer", "print('x' * 3_000_000)"), FULL,
        "output too large in cell numerical_grad_answer")
    nb = reference_submission(A)
    for _ in range(20):  # 20 cells of 900,000 characters each, all before the first test
        nb = with_cell("print('y' * 900_000)", after="setup", base=nb)
    add("floods-many-cells", nb, FULL, "output too large in cell")

    out = root / "graded"
    autograde(cls, out, "--timeout", TIMEOUT)
    assert len(expected) >= 50
    return expected, out, cls


def test_every_submission_gets_its_points_and_status(graded_class):
    expected, out, _ = graded_class
    assert mismatches(read_rows(out), expected) == []


def test_feedback_never_shows_hidden_tests_or_what_ran_after_them(graded_class):
    _, out, _ = graded_class
    assert (out / "feedback" / "floods-many-cells" / ONE / f"{ONE}.html").stat().st_size < 10 * 2**20
    hidden = secret_lines(nbformat.read(A.source, as_version=4), solutions=False)
    pages = sorted((out / "feedback").rglob("*.html"))
    assert len(pages) >= 40
    for page in pages:
        text = page.read_text()
        assert not hidden & shown_lines(text), f"{page} shows hidden test lines"
        assert "_tml_probe" not in text and "BEGIN HIDDEN TESTS" not in text and "manual_seed(101)" not in text
    wrong = (out / "feedback" / "wrong-gradient_descent_ascends" / ONE / f"{ONE}.html").read_text()
    assert f"0 / {FULL['gradient_descent']:g} points" in wrong and \
        "record the loss before each update" not in wrong.split("losses")[0]


# Hand-ins whose own thread sends forged results all the time: which tests it lands in (and so which tests get
# an interference note) depends on timing. Their points do not.
FORGES_FROM_A_THREAD = {"attack-fake-results"}
FORGED_NOTE = re.compile(r"interference in test \w+: a result did not come from the test")


def _comparable(row: list[str]) -> list[str]:
    """A grades.csv row as regrading must reproduce it: whole, but a thread forger's notes only by their kind."""
    if row[0] not in FORGES_FROM_A_THREAD:
        return row
    assert row[-1] == "ok" or all(FORGED_NOTE.fullmatch(note) for note in row[-1].split("; ")), row
    return [*row[:-1], "ok, or interference notes on the tests its forgeries landed in"]


def test_regrading_from_scratch_one_at_a_time_gives_the_same_rows(graded_class):
    """A third of the class (every kind of hand-in is in it), regraded by one worker from nothing: the same rows."""
    _, out, cls = graded_class
    chosen = sorted(set(sorted(p.name for p in cls.iterdir())[::3]) | FORGES_FROM_A_THREAD)
    again = out.parent / "regraded"
    for student in chosen:
        shutil.copytree(cls / student, again / "class" / student)
    autograde(again / "class", again / "out", "--timeout", TIMEOUT, "--jobs", "1", "--force")
    rows = list(csv.reader((out / "grades.csv").read_text().splitlines()))
    regraded = list(csv.reader((again / "out" / "grades.csv").read_text().splitlines()))
    assert list(map(_comparable, regraded)) == list(map(_comparable, [rows[0], *(r for r in rows[1:] if r[0] in chosen)]))


def test_an_interrupted_batch_resumes_without_regrading(graded_class):
    _, out, cls = graded_class
    resumed = out.parent / "resumed"
    shutil.copytree(out, resumed)
    results = resumed / ".work" / "results"
    # as if the batch had stopped before these two finished
    for student in ("correct-1", "blank"):
        (results / student / f"{ONE}.fingerprint").unlink()
    kept = (results / "correct-0" / f"{ONE}.json").stat().st_mtime_ns
    autograde(cls, resumed, "--timeout", TIMEOUT)
    assert (resumed / "grades.csv").read_text() == (out / "grades.csv").read_text()
    assert (results / "correct-0" / f"{ONE}.json").stat().st_mtime_ns == kept
    assert (results / "blank" / f"{ONE}.fingerprint").exists()


HABITS = {
    "scratch-reuses-lesson-names": ("lr = 0.1\nX = torch.randn(4, 3)\ny = torch.randn(4)\n"
                                    "model = torch.nn.Linear(3, 1)\nloss_fn = None\nw = None", "mse_grad_answer"),
    "loops-and-prints": ("for _ in range(3):\n    pass\nfor i in range(2000):\n    print(i)", "mse_grad_answer"),
    "magics": ("%matplotlib inline\nimport sys\nimport matplotlib.pyplot as plt\nplt.rcParams['figure.figsize'] = (4, 3)",
               "setup"),
    "cell-magic-time": ("%%time\nsum(range(10_000))", "numerical_grad_answer"),
    "temporary-results": ("grad = mse_grad(torch.zeros(3), torch.randn(5, 3), torch.randn(5))\n"
                          "w, losses = gradient_descent(torch.zeros(2), torch.randn(9, 2), torch.randn(9), 0.1, 3)",
                          "gradient_descent_answer"),
    "own-helper-named-mse": ("def mse(v, X, y):\n    return ((X @ v - y) ** 2).mean()\nmse(torch.zeros(2), X, y)",
                             "mse_grad_answer"),
    "progress-bar-on-stderr": ("from tqdm.auto import tqdm\nfor _ in tqdm(range(50)):\n    pass", "mse_grad"),
    "warnings": ("import warnings\nwarnings.warn('my own warning')\n"
                 "torch.tensor([1.0], requires_grad=True).grad  # a torch UserWarning", "critical_lr"),
    "plots": ("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()", "gradient_descent"),
    "an-error-in-a-scratch-cell": ("1 / 0", "numerical_grad"),
    "reset-below-the-tests": ("%reset -f", "best_momentum"),  # every name gone: each test still sees its place's
    "float64-by-default": ("torch.set_default_dtype(torch.float64)\ntorch.set_grad_enabled(False)", "setup"),
    # every global switch a scratch cell can flip (issue 20): each hidden test runs with torch's defaults
    "every-global-switch-flipped": (
        "torch.set_flush_denormal(True)\ntorch.set_float32_matmul_precision('medium')\n"
        "torch.use_deterministic_algorithms(True, warn_only=True)\ntorch.set_anomaly_enabled(True)\n"
        "torch.set_num_threads(1)\ntorch.set_autocast_enabled('cpu', True)\ntorch.manual_seed(1234)\n"
        "torch.backends.cudnn.allow_tf32 = False", "mse_grad_answer"),
}


@pytest.fixture(scope="module")
def honest_class(tmp_path_factory):
    """Reference answers plus one ordinary habit each: every one must earn full marks with status ok."""
    root = tmp_path_factory.mktemp("honest")
    cls = root / "class"
    for name, (code, after) in HABITS.items():
        put(cls, name, A, with_cell(code, after=after))
    # A wrong first try kept in a cell above the final answer, and a renamed copy below it.
    draft = reference_submission(A)
    final = draft.cells[_index(draft, "mse_grad_answer")].source
    draft.cells.insert(_index(draft, "mse_grad_answer"), own_cell(
        "def mse_grad(w, X, y):\n    return X.T @ (X @ w - y)  # draft: factor 2 and 1/n missing"))
    put(cls, "drafts-beside-the-answer", A, with_cell(final.replace("def mse_grad", "def mse_grad_v1"),
                                                      after="mse_grad_answer", base=draft))
    helper = with_answer("mse_grad_answer", "def _residual(w, X, y):\n    return X @ w - y\n\n"
                                            "def mse_grad(w, X, y):\n    return 2.0 / X.shape[0] * X.T @ _residual(w, X, y)")
    put(cls, "private-helper", A, copy.deepcopy(helper))
    # The helper redefined in a scratch cell below mse_grad's test: that test still sees the helper of its place.
    other_sign = "def _residual(w, X, y):\n    return y - X @ w  # tried the other sign"
    put(cls, "helper-redefined-below-its-test", A, with_cell(other_sign, after="critical_lr", base=helper))
    put(cls, "extra-markdown", A, with_cell("## My notes\n<b>bold</b> and $x^2$", after="mse_grad", cell_type="markdown"))
    # The answer cell split in two (JupyterLab's split keeps the metadata on both halves).
    split = reference_submission(A)
    at = _index(split, "mse_grad_answer")
    first, second = copy.deepcopy(split.cells[at]), split.cells[at]
    first.source = "def _residual(w, X, y):\n    return X @ w - y"
    second.source = "def mse_grad(w, X, y):\n    return 2.0 / X.shape[0] * X.T @ _residual(w, X, y)"
    split.cells.insert(at, first)
    put(cls, "split-answer-cell", A, split)
    # Files as other editors save them.
    old = json.loads(nbformat.writes(reference_submission(A)))
    old["nbformat_minor"] = 4
    for cell in old["cells"]:
        cell.pop("id", None)
    with_ids = json.loads(nbformat.writes(reference_submission(A)))  # 4.4 with ids, outputs with extra fields
    with_ids["nbformat_minor"] = 4
    for cell in with_ids["cells"]:
        if cell["cell_type"] == "code":
            cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "x", "metadata": {"a": 1}}]
    (cls / "nbformat-4.4-with-ids" / ONE).mkdir(parents=True)
    (cls / "nbformat-4.4-with-ids" / ONE / A.notebook).write_text(json.dumps(with_ids))
    (cls / "saved-as-nbformat-4.4" / ONE).mkdir(parents=True)
    (cls / "saved-as-nbformat-4.4" / ONE / A.notebook).write_text(json.dumps(old))
    vscode = json.loads(nbformat.writes(reference_submission(A)))
    vscode["metadata"]["vscode"] = {"interpreter": {"hash": "abc"}}
    vscode["metadata"]["kernelspec"] = {"name": ".venv", "display_name": ".venv", "language": "python"}
    for cell in vscode["cells"]:
        cell["metadata"]["vscode"] = {"languageId": "python"}
        # VS Code on Windows: CRLF inside every cell's source lines too, and in the file
        cell["source"] = [line.replace("\n", "\r\n") for line in cell["source"]]
    (cls / "saved-by-vscode-crlf" / ONE).mkdir(parents=True)
    (cls / "saved-by-vscode-crlf" / ONE / A.notebook).write_bytes(json.dumps(vscode, indent=1).replace("\n", "\r\n").encode())
    # Sources as one string each, with a trailing newline and trailing spaces on every line.
    edited = json.loads(nbformat.writes(reference_submission(A)))
    for cell in edited["cells"]:
        cell["source"] = "".join(cell["source"]).replace("\n", "  \n") + "\n"
    (cls / "sources-as-strings-with-trailing-space" / ONE).mkdir(parents=True)
    (cls / "sources-as-strings-with-trailing-space" / ONE / A.notebook).write_text(json.dumps(edited))
    colab = json.loads(nbformat.writes(reference_submission(A)))
    colab["metadata"].update(colab={"provenance": []}, accelerator="GPU")
    for cell in colab["cells"]:
        cell["metadata"]["colab"] = {"base_uri": "https://localhost:8080/"}
        if cell["cell_type"] == "code":
            cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "ran on colab\n"}]
            cell["execution_count"] = 1
    (cls / "saved-by-colab-with-outputs" / ONE).mkdir(parents=True)
    (cls / "saved-by-colab-with-outputs" / ONE / A.notebook).write_text(json.dumps(colab))
    out = root / "graded"
    # The instructor's default per-cell budget: a habit may be slow without being wrong (the first
    # torch.use_deterministic_algorithms imports torch._dynamo, 2.3 s idle, over 10 s on a loaded CI machine).
    autograde(cls, out)
    return read_rows(out), out


def test_honest_habits_cost_nothing(honest_class):
    rows, _ = honest_class
    assert len(rows) == len(HABITS) + 10
    problems = [f"{student}: {scores} {status} {messages}" for (student, _), (scores, status, messages, _) in rows.items()
                if scores != FULL or status != "ok"]
    assert problems == []


def test_feedback_shows_the_students_own_output_from_before_the_tests(honest_class):
    _, out = honest_class
    page = (out / "feedback" / "scratch-reuses-lesson-names" / ONE / f"{ONE}.html").read_text()
    assert "your cell" in page and "10 / 10" in page
    prints = (out / "feedback" / "loops-and-prints" / ONE / f"{ONE}.html").read_text()
    assert "1999" in prints  # its cell runs before the first test
    markdown = (out / "feedback" / "extra-markdown" / ONE / f"{ONE}.html").read_text()
    assert "&lt;b&gt;bold&lt;/b&gt;" in markdown and "<b>bold</b>" not in markdown


def test_a_broken_environment_stops_grading_instead_of_writing_zeros(tmp_path, monkeypatch):
    put(tmp_path / "class", "someone", A, reference_submission(A))
    monkeypatch.setenv(limits.MEMORY_ENV, str(256 * 2**20))  # too little for torch: every kernel fails
    run = autograde(tmp_path / "class", tmp_path / "out", "--timeout", TIMEOUT, check=False)
    assert run.returncode == 4, run.stdout + run.stderr
    assert "no grades written" in run.stderr and "reference solution" in run.stderr
    assert not (tmp_path / "out" / "grades.csv").exists()


def test_anything_that_decides_a_grade_changes_the_cache_key(tmp_path, monkeypatch):
    copy = tmp_path / "repo"
    for folder in ("grader", "helpers", "labkit"):
        shutil.copytree(REPO / folder, copy / folder, ignore=shutil.ignore_patterns("__pycache__"))
    before = code_digest(copy)
    for edited in ("grader/judge/judge.py", "grader/kernel/forkserver.py", "grader/author/nbgrader_config.py",
                   "grader/mutants/01_gradient_descent.toml", "helpers/checks.py", "labkit/scenario.py"):
        original = (copy / edited).read_bytes()
        (copy / edited).write_bytes(original + b"\n# edited\n")
        assert code_digest(copy) != before, edited
        (copy / edited).write_bytes(original)
    assert code_digest(copy) == before
    monkeypatch.setenv(limits.MEMORY_ENV, "123456789")
    assert code_digest(copy) != before
    monkeypatch.delenv(limits.MEMORY_ENV)
    installed = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: "0.0.0" if name == "torch" else installed(name))
    assert code_digest(copy) != before


def test_grading_refuses_without_the_sandbox(tmp_path, monkeypatch):
    monkeypatch.setattr(sandbox, "why_unavailable", lambda: "no user namespaces")
    with pytest.raises(SandboxUnavailable, match="--unsandboxed"):
        autograde_in_process(tmp_path, tmp_path / "out")


def test_sandbox_is_installed_by_the_setup():
    assert sandbox.why_unavailable() == "", "the kernel sandbox must work on the machines the course is graded on"
    assert (kernelspec.kernelspec_dir() / "kernel.json").exists()
