"""The student edition in a Colab-like kernel: Colab's Python and packages, and the course installed from the edition.

The kernel (tests/colab_like.py, COLAB) is Python 3.13 with Colab's own versions of torch (2.11.0, the registry's
build), ipykernel, IPython, jupyter_client, ipywidgets (7.7.1), matplotlib, numpy … (tests/colab_runtime.txt names
the source) plus a fresh, empty layer that pip installs into. The course comes from the student edition, never this
checkout: `grader edition` builds it as a git repository with its release tag, and the set-up cell installs
`git+file://EDITION@TAG` (TML_INSTALL_SPEC) — the install the badge's archive gives, only the host differs.
tests/test_kaggle_like.py runs these same tests on Kaggle's runtime (its module overrides the `runtime` fixture).

- the set-up cell alone installs the edition (its one line says so), changes no package the kernel had (every
  distribution of the base keeps its version; the layer adds only new ones), and run again does nothing within
  0.5 s; what it installed is the edition's `helpers` and `labkit` (with the blank notebooks), not `grader`;
- every released notebook with the reference answers runs top to bottom, alone in an empty folder, without an
  error; 00 prints no ✗;
- the check-and-hand-in footer finds the notebook the way the platform offers it and finds it ready to hand in —
  on Colab's runtime through Colab's front end (01: a stand-in for `google.colab._message` answers `get_ipynb` as
  Colab does, cells without ids, sources as lists of lines; the notebook is not on disk) and from a renamed file
  (06, saved as "Copy of …"); the other notebooks run without their footer (FOOTERS says why).

The base environment (about 5 GB, a CUDA build of torch) is built once under build/colab-like/ and reused; a full
run starts building it in the background as soon as the tests are collected (tests/conftest.py).
Timings go to test-artifacts/<runtime>-like/timings.json.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import colab_like
import nbformat
import pytest
from conftest import REPO
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager

from grader.author import bootstrap
from grader.author.edition import commit_and_tag, write_edition
from grader.author.mutants import reference_submission
from grader.course import assignments
from labkit.runner import NotebookRunner

ASSIGNMENTS = assignments()


def needs_python(runtime: colab_like.Runtime) -> pytest.MarkDecorator:
    return pytest.mark.skipif(runtime.python() is None and os.environ.get("CI") != "true",
                              reason=f"no Python {runtime.python_version} here ({runtime.name}'s version)")


pytestmark = [pytest.mark.slow, needs_python(colab_like.COLAB)]
FAKE_COLAB = '''\
"""A stand-in for Colab's front-end channel: get_ipynb answers with the notebook as Colab sends it."""
import json, os


def blocking_request(request_type, request="", timeout_sec=5, parent=None):
    if request_type != "get_ipynb":
        return None
    with open(os.environ["FAKE_COLAB_NOTEBOOK"]) as f:
        nb = json.load(f)
    for cell in nb["cells"]:  # Colab keeps its own cell ids in metadata; sources are lists of lines, as on disk
        cell["metadata"]["id"] = cell.pop("id")
        assert isinstance(cell["source"], list)
    return {"ipynb": nb}
'''



@dataclass(frozen=True)
class Footer:
    """A way the check-and-hand-in footer finds the open notebook on a platform, and what it then says."""

    file_name: str  # the notebook's file in the kernel's working folder ("" for none); {notebook}: the release's
    env: dict[str, str]
    source: str  # where the footer says it read the notebook
    download: str  # how it says to download it for hand-in


ON_KAGGLE = {"KAGGLE_KERNEL_RUN_TYPE": "Interactive"}
FRONT_END = Footer("", {"COLAB_RELEASE_TAG": "colab-like"}, "the notebook as Colab's editor holds it now",
                   "File → Download → Download .ipynb")
RENAMED = Footer("Copy of {notebook}", {}, "Copy of {notebook}, as last saved", "hand in the file")
# Kaggle's kernel works in /kaggle/working, where it keeps the notebook's copy (labkit/validate.py KAGGLE_COPIES)
KAGGLE_COPY = Footer("__notebook_source__.ipynb", ON_KAGGLE, "__notebook_source__.ipynb, as last saved",
                     "File → Download notebook")
LIVE = Footer("", ON_KAGGLE, "the answers this kernel ran last", "File → Download notebook")
# The footer re-runs the notebook's visible tests in a fresh kernel started from the notebook's kernel: per notebook
# it costs about as much as the notebook again (40 % of these tests' time), and what it runs there, this runtime has
# just run in the notebook itself (the test cells; that they pass without the demo and claim cells the footer
# skips, grading shows for every notebook: tests/test_grading.py). What a runtime can break is the footer's own
# machinery, the same for every notebook: finding the notebook where the platform keeps it, a kernel started from a
# kernel with the runtime's jupyter_client and ipykernel, the verdict. So each way of finding the notebook runs once
# per runtime, on a short notebook, and the other notebooks run without their footer.
FOOTERS = {
    "colab": {"01_gradient_descent": FRONT_END, "06_mixed_precision": RENAMED},
    # Not on disk (the answers the kernel ran), and Kaggle's copy beside the kernel: which one a student meets
    # depends on Kaggle's editor (labkit/validate.py), so both
    "kaggle": {"01_gradient_descent": LIVE, "07_distributed": KAGGLE_COPY},
}
WITHOUT_FOOTER = {"colab": Footer("Copy of {notebook}", {}, "", ""), "kaggle": Footer("", ON_KAGGLE, "", "")}

@dataclass
class ColabLike:
    """A Colab- or Kaggle-like kernel environment: its runtime, Python, kernelspec, the edition and what was measured."""

    runtime: colab_like.Runtime
    venv: Path
    specs: Path
    work: Path
    spec: str  # what the set-up cell installs: git+file://EDITION@TAG
    base_seconds: float
    install: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)

    def run(self, nb: nbformat.NotebookNode, name: str, file_name: str, **env: str) -> nbformat.NotebookNode:
        """Run a copy of `nb` top to bottom in a fresh kernel, alone in an empty folder as `file_name` (unless '')."""
        nb = copy.deepcopy(nb)
        folder = self.work / name
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        if file_name:
            nbformat.write(nb, folder / file_name)
        sockets = self.work / "sockets" / name  # beside the folder, which stays empty
        shutil.rmtree(sockets, ignore_errors=True)
        sockets.mkdir(parents=True)
        # ipc, not tcp: parallel test workers can race for a "free" TCP port between its choice and the kernel's bind
        km = KernelManager(kernel_name="colab-like", kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(self.specs)]),
                           transport="ipc", ip=str(sockets / "kernel"))
        began = time.perf_counter()
        try:
            NotebookRunner(nb, km=km, timeout=600, allow_errors=True, resources={"metadata": {"path": str(folder)}}
                           ).execute(env=colab_like.clean_env(TML_INSTALL_SPEC=self.spec, **env))
        finally:
            if km.has_kernel:  # nbclient leaves a kernel manager it was handed running
                km.shutdown_kernel(now=True)
        self.timings[name] = round(time.perf_counter() - began, 1)
        return nb


def _errors(nb: nbformat.NotebookNode) -> list[str]:
    return [f"cell {i} ({c.metadata.get('nbgrader', {}).get('grade_id', '?')}): {o.ename}: {o.evalue}"
            for i, c in enumerate(nb.cells) if c.cell_type == "code"
            for o in c.get("outputs", []) if o.output_type == "error"]


def _text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.output_type == "stream")


def _cell(nb: nbformat.NotebookNode, cell_id: str):
    return next(c for c in nb.cells if c.get("id") == cell_id)


def _cell_seconds(cell) -> float:
    from datetime import datetime

    stamps = cell.metadata.get("execution", {})
    start, end = stamps.get("iopub.execute_input"), stamps.get("shell.execute_reply")
    parse = lambda s: datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()  # noqa: E731
    return parse(end) - parse(start)


@pytest.fixture(scope="module")
def runtime() -> colab_like.Runtime:
    """The runtime this module's tests run on (tests/test_kaggle_like.py overrides it)."""
    return colab_like.COLAB


@pytest.fixture(scope="module")
def colab(runtime, tmp_path_factory):
    """The runtime's kernel with the student edition installed by the set-up cell (what it did is recorded)."""
    began = time.perf_counter()
    base, base_seconds = runtime.base_venv()  # built here, or by the background build (tests/conftest.py)
    waited = time.perf_counter() - began
    work = tmp_path_factory.mktemp(f"{runtime.name}-like")
    edition = work / "edition"
    write_edition(edition)
    tag = commit_and_tag(edition)
    venv = runtime.kernel_venv(base, work / "kernel-env")
    env = ColabLike(runtime, venv, colab_like.kernelspec(venv, work / "kernels"), work, f"git+file://{edition}@{tag}",
                    base_seconds)
    before = colab_like.distributions(venv)
    for name in ("helpers", "training-mechanics-lab", "torchviz", "nbgrader"):
        assert name not in before, f"the Colab-like kernel already has {name}"
    setup_only = nbformat.v4.new_notebook(cells=[bootstrap.header_cells("01_gradient_descent")[1]])
    first = env.run(setup_only, "set-up-first", "")
    again = env.run(setup_only, "set-up-again", "")
    after = colab_like.distributions(venv)
    shipped = [Path(where) for name, (_, where) in after.items() if name == "training-mechanics-lab"]
    env.install = {
        "errors": _errors(first) + _errors(again), "first": _text(first.cells[0]), "again": _text(again.cells[0]),
        "install_seconds": _cell_seconds(first.cells[0]), "again_seconds": _cell_seconds(again.cells[0]),
        "changed": {n: (v, after[n][0]) for n, (v, _) in before.items() if after.get(n, (None,))[0] != v},
        "new": {n: after[n] for n in after.keys() - before.keys()},
        "layer": str(runtime.site_packages(venv)),
        "packages": sorted(p.name for p in shipped[0].iterdir()) if shipped else [],
        "blank_01": bool(shipped) and (shipped[0] / "labkit/notebooks/01_gradient_descent/01_gradient_descent.ipynb").is_file(),
        "tag": tag, "size": sum(p.stat().st_size for p in edition.rglob("*") if p.is_file() and ".git" not in p.parts),
    }
    yield env
    artifacts = REPO / "test-artifacts" / f"{runtime.name}-like"
    artifacts.mkdir(parents=True, exist_ok=True)
    (artifacts / "timings.json").write_text(json.dumps({
        "python": runtime.python_version, "torch": runtime.pinned("torch"),
        "base environment built in s": round(base_seconds, 1), "waited for it s": round(waited, 1),
        "edition bytes": env.install["size"],
        "set-up cell install s": round(env.install["install_seconds"], 1),
        "set-up cell again s": round(env.install["again_seconds"], 3), "notebooks s": env.timings}, indent=1))


def test_the_set_up_cell_installs_the_edition_and_changes_no_package_the_kernel_had(colab):
    info = colab.install
    assert info["errors"] == []
    assert info["first"].count("\n") == 1 and f"installed the course from {colab.spec} with pip" in info["first"], info["first"]
    kept = [f"{name} {colab.runtime.pinned(name)}" for name in ("torch", "numpy", "matplotlib", "ipywidgets")]
    assert "changed none of the kernel's" in info["first"] and all(k in info["first"] for k in kept), info["first"]
    assert info["changed"] == {}, f"the set-up cell changed packages the kernel had: {info['changed']}"
    assert all(where.startswith(info["layer"]) for _, where in info["new"].values()), info["new"]
    assert {"training-mechanics-lab", "torchviz"} <= info["new"].keys() and "torch" not in info["new"]
    assert {"helpers", "labkit"} <= set(info["packages"]) and "grader" not in info["packages"], info["packages"]
    assert info["blank_01"], "the edition's wheel carries the blank notebooks the check needs"
    assert info["again"].count("\n") == 1 and "the course is installed; nothing to do" in info["again"], info["again"]
    print(f"edition {info['tag']}: {info['size'] / 2**20:.1f} MiB; set-up cell install {info['install_seconds']:.1f} s, "
          f"again {info['again_seconds'] * 1e3:.0f} ms; {len(info['new'])} new distributions")
    assert info["again_seconds"] <= 0.5


@pytest.mark.parametrize("assignment", ASSIGNMENTS, ids=[a.name for a in ASSIGNMENTS])
def test_every_notebook_alone_with_reference_answers(colab, assignment):
    """Alone in an empty folder, with the footer where FOOTERS names a way for this runtime to find the notebook."""
    nb = reference_submission(assignment)
    footer = FOOTERS[colab.runtime.name].get(assignment.name)
    if footer is None:
        nb.cells = [c for c in nb.cells if c.get("id") != bootstrap.CHECK_ID]
        footer = WITHOUT_FOOTER[colab.runtime.name]
    env = dict(footer.env)
    if footer is FRONT_END:
        fake = colab.work / "fake-colab"
        (fake / "google" / "colab").mkdir(parents=True, exist_ok=True)
        (fake / "google" / "colab" / "__init__.py").write_text("")
        (fake / "google" / "colab" / "_message.py").write_text(FAKE_COLAB)
        (fake / "front-end.ipynb").write_text(nbformat.writes(nb))
        env |= {"PYTHONPATH": str(fake), "FAKE_COLAB_NOTEBOOK": str(fake / "front-end.ipynb")}
    file_name = footer.file_name.format(notebook=assignment.notebook)
    nb = colab.run(nb, f"released-{assignment.name}", file_name, **env)
    assert _errors(nb) == []
    assert "nothing to do" in _text(_cell(nb, bootstrap.CELL_ID))
    outputs = "".join(_text(c) for c in nb.cells if c.cell_type == "code")
    if assignment.grade_cells() and footer.source:
        check = _text(_cell(nb, bootstrap.CHECK_ID))
        colab.timings[f"check-{assignment.name}"] = round(_cell_seconds(_cell(nb, bootstrap.CHECK_ID)), 1)
        source = footer.source.format(notebook=assignment.notebook)
        assert source in check and "all visible tests pass" in check and "✓ ready to hand in" in check, check
        assert not [o for o in _cell(nb, bootstrap.CHECK_ID).outputs if o.output_type == "execute_result"], \
            "the check cell shows its verdict only (no bare True/False under it)"
        assert footer.download in check, check
    elif not assignment.grade_cells():  # 00: alone, it checks the course's blank copy of 01 and ends without ✗ (01's
        # test that waits for exercise 1 is "–" too), and its no-GPU line says how to get a GPU rather than to
        # reinstall torch
        assert "✗" not in outputs and "01_gradient_descent.ipynb: 0 of " in outputs, outputs
        assert "switch to a GPU runtime" in outputs or "✓ CUDA" in outputs, outputs
        assert "checking the course's blank copy of 01" in outputs and "the check ran" in outputs, outputs
    print(f"{assignment.name} with reference answers: {colab.timings[f'released-{assignment.name}']} s")
