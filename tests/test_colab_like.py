"""The student edition in a Colab-like kernel: Colab's Python and packages, and the course installed from the edition.

The kernel (tests/colab_like.py) is Python 3.13 with Colab's own versions of torch (2.11.0, the registry's build),
ipykernel, IPython, jupyter_client, ipywidgets (7.7.1), matplotlib, numpy … (tests/colab_runtime.txt names the
source) plus a fresh, empty layer that pip installs into. The course comes from the student edition, never this
checkout: `grader edition` builds it as a git repository with its release tag, and the set-up cell installs
`git+file://EDITION@TAG` (TML_INSTALL_SPEC) — the install the badge's archive gives, only the host differs.

- the set-up cell alone installs the edition (its one line says so), changes no package the kernel had (every
  distribution of the base keeps its version; the layer adds only new ones), and run again does nothing within
  0.5 s; what it installed is the edition's `helpers` and `labkit` (with the blank notebooks), not `grader`;
- every released notebook with the reference answers runs top to bottom, alone in an empty folder as on Colab,
  without an error; its last cell checks it and finds it ready to hand in; 00 prints no ✗;
- notebook 01 checks itself through Colab's front end: a stand-in for `google.colab._message` answers
  `get_ipynb` as Colab does (cells without ids, sources as lists of lines), and the notebook is not on disk;
  notebook 02, not on disk either, as on Kaggle, through the answers its kernel ran.

The base environment (about 5 GB, a CUDA build of torch) is built once under build/colab-like/ and reused.
Timings go to test-artifacts/colab-like/timings.json.
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

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(colab_like.python() is None and os.environ.get("CI") != "true",
                                 reason=f"no Python {colab_like.COLAB_PYTHON} here (Colab's version)")]

ARTIFACTS = REPO / "test-artifacts" / "colab-like"
ASSIGNMENTS = assignments()
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


@dataclass
class ColabLike:
    """The Colab-like kernel environment: its Python, its kernelspec, the edition and what was measured."""

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
        km = KernelManager(kernel_name="colab-like", kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(self.specs)]))
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
def colab(tmp_path_factory):
    """The Colab-like kernel with the student edition installed by the set-up cell (what it did is recorded)."""
    base, base_seconds = colab_like.base_venv()
    work = tmp_path_factory.mktemp("colab-like")
    edition = work / "edition"
    write_edition(edition)
    tag = commit_and_tag(edition)
    venv = colab_like.kernel_venv(base, work / "kernel-env")
    env = ColabLike(venv, colab_like.kernelspec(venv, work / "kernels"), work, f"git+file://{edition}@{tag}", base_seconds)
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
        "layer": str(colab_like.site_packages(venv)),
        "packages": sorted(p.name for p in shipped[0].iterdir()) if shipped else [],
        "blank_01": bool(shipped) and (shipped[0] / "labkit/notebooks/01_gradient_descent/01_gradient_descent.ipynb").is_file(),
        "tag": tag, "size": sum(p.stat().st_size for p in edition.rglob("*") if p.is_file() and ".git" not in p.parts),
    }
    yield env
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "timings.json").write_text(json.dumps({
        "python": colab_like.COLAB_PYTHON, "torch": colab_like.torch_version(),
        "base environment built in s": round(base_seconds, 1), "edition bytes": env.install["size"],
        "set-up cell install s": round(env.install["install_seconds"], 1),
        "set-up cell again s": round(env.install["again_seconds"], 3), "notebooks s": env.timings}, indent=1))


def test_the_set_up_cell_installs_the_edition_and_changes_no_package_the_kernel_had(colab):
    info = colab.install
    assert info["errors"] == []
    assert info["first"].count("\n") == 1 and f"installed the course from {colab.spec} with pip" in info["first"], info["first"]
    assert "changed none of the kernel's" in info["first"] and f"torch {colab_like.torch_version()}" in info["first"]
    assert "ipywidgets 7.7.1" in info["first"] and "numpy 2.1.3" in info["first"], info["first"]
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
    """Alone in a folder, under the name a download gives it. Two are not on disk at all: 01 checks itself through
    Colab's front end, 02 (as on Kaggle with no copy found) through the answers its kernel ran."""
    nb = reference_submission(assignment)
    env: dict[str, str] = {}
    if assignment.name == "01_gradient_descent":
        fake = colab.work / "fake-colab"
        (fake / "google" / "colab").mkdir(parents=True, exist_ok=True)
        (fake / "google" / "colab" / "__init__.py").write_text("")
        (fake / "google" / "colab" / "_message.py").write_text(FAKE_COLAB)
        (fake / "front-end.ipynb").write_text(nbformat.writes(nb))
        env = {"PYTHONPATH": str(fake), "COLAB_RELEASE_TAG": "colab-like", "FAKE_COLAB_NOTEBOOK": str(fake / "front-end.ipynb")}
        source, download = "the notebook as Colab's editor holds it now", "File → Download → Download .ipynb"
    elif assignment.name == "02_autograd_graph":
        env = {"KAGGLE_KERNEL_RUN_TYPE": "Interactive"}
        source, download = "the answers this kernel ran last", "File → Download notebook"
    else:  # the check must not need the release's file name
        source, download = f"Copy of {assignment.notebook}, as last saved", "hand in the file"
    nb = colab.run(nb, f"released-{assignment.name}", "" if env else f"Copy of {assignment.notebook}", **env)
    assert _errors(nb) == []
    assert "nothing to do" in _text(_cell(nb, bootstrap.CELL_ID))
    outputs = "".join(_text(c) for c in nb.cells if c.cell_type == "code")
    if assignment.grade_cells():
        check = _text(_cell(nb, bootstrap.CHECK_ID))
        colab.timings[f"check-{assignment.name}"] = round(_cell_seconds(_cell(nb, bootstrap.CHECK_ID)), 1)
        assert source in check and "all visible tests pass" in check and "✓ ready to hand in" in check, check
        assert download in check, check
    else:  # 00: alone, it checks the course's blank copy of 01 and ends without ✗
        assert "✗" not in outputs, outputs
        assert "checking the course's blank copy of 01" in outputs and "the check ran" in outputs, outputs
    print(f"{assignment.name} with reference answers: {colab.timings[f'released-{assignment.name}']} s")
