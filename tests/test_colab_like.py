"""Every notebook in a Colab-like kernel: another torch, no course packages, the set-up cell installs the course.

For each torch at the ends of the declared range (pyproject `[project.optional-dependencies].torch`): the
declared minimum, and the newest the registry serves here (pip on these machines is capped at 2.14.1), a
kernel is made from a cached base environment (tests/colab_like.py: the stock torch wheel, ipykernel, numpy,
matplotlib — no helpers, nbgrader, torchviz, graphviz, ipywidgets or tqdm) plus a fresh, empty layer that
pip installs into. With TML_INSTALL_SPEC pointing at this checkout:

- the set-up cell alone installs the course (its one line says so), leaves torch exactly as it was (same
  version, same files, nothing of torch in the new layer), and run again does nothing, within 0.5 s;
- every solution notebook (the set-up cell put in front) runs top to bottom without an error;
- every released notebook with the reference answers (grader.author.mutants.reference_submission) runs top to
  bottom without an error.

Each notebook runs alone in an empty folder, as on Colab. The base environments (about 5 GB each, CUDA
builds) are built once under build/colab-like/ and reused; the first build takes minutes. Timings per
notebook go to test-artifacts/colab-like/timings.json.
"""

from __future__ import annotations

import json
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
from grader.author.mutants import reference_submission
from grader.course import assignments
from labkit.runner import NotebookRunner

pytestmark = pytest.mark.slow

NEWEST = "2.14.1"  # the newest torch the registry serves on these machines (pip's machine-wide cap)
MINIMUM = "{}.{}.0".format(*bootstrap.settings().torch_minimum)
TORCHES = [MINIMUM, NEWEST]
ARTIFACTS = REPO / "test-artifacts" / "colab-like"
SOLUTIONS = [a for a in assignments()]


@dataclass
class ColabLike:
    """One Colab-like kernel environment: its Python, its kernelspec and what was measured in it."""

    torch: str
    venv: Path
    specs: Path
    work: Path
    base_seconds: float
    install: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)

    def env(self) -> dict[str, str]:
        return colab_like._clean_env(TML_INSTALL_SPEC=str(REPO))

    def run(self, nb: nbformat.NotebookNode, name: str) -> tuple[float, nbformat.NotebookNode]:
        """Run `nb` top to bottom in a fresh kernel, alone in an empty folder: (seconds, the executed notebook)."""
        folder = self.work / name
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        nbformat.write(nb, folder / f"{name}.ipynb")
        km = KernelManager(kernel_name="colab-like", kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(self.specs)]))
        began = time.perf_counter()
        try:
            NotebookRunner(nb, km=km, timeout=600, allow_errors=True,
                           resources={"metadata": {"path": str(folder)}}).execute(env=self.env())
        finally:
            if km.has_kernel:  # nbclient leaves a kernel manager it was handed running
                km.shutdown_kernel(now=True)
        seconds = time.perf_counter() - began
        self.timings[name] = round(seconds, 1)
        return seconds, nb


def _errors(nb: nbformat.NotebookNode) -> list[str]:
    return [f"cell {i} ({c.metadata.get('nbgrader', {}).get('grade_id', '?')}): {o.ename}: {o.evalue}"
            for i, c in enumerate(nb.cells) if c.cell_type == "code"
            for o in c.get("outputs", []) if o.output_type == "error"]


def _text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.output_type == "stream")


def _cell_seconds(cell) -> float:
    from datetime import datetime

    stamps = cell.metadata.get("execution", {})
    start, end = stamps.get("iopub.execute_input"), stamps.get("shell.execute_reply")
    parse = lambda s: datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()  # noqa: E731
    return parse(end) - parse(start)


def _bootstrap_only() -> nbformat.NotebookNode:
    return bootstrap.with_bootstrap(nbformat.v4.new_notebook())


@pytest.fixture(scope="module", params=TORCHES, ids=[f"torch{v}" for v in TORCHES])
def colab(request, tmp_path_factory):
    """A Colab-like kernel on one torch, with the course installed by the set-up cell (what it did is recorded)."""
    base, base_seconds = colab_like.base_venv(request.param)
    work = tmp_path_factory.mktemp(f"colab-like-{request.param}")
    venv = colab_like.kernel_venv(base, work / "kernel-env")
    env = ColabLike(request.param, venv, colab_like.kernelspec(venv, work / "kernels"), work, base_seconds)
    for name in ("helpers", "training-mechanics-lab", "torchviz", "nbgrader"):
        assert colab_like.installed(venv, name) is None, f"the Colab-like kernel already has {name}"
    torch_files = sorted(p.name for p in (colab_like.site_packages(base) / "torch").iterdir())
    torch_before = colab_like.installed(venv, "torch")
    seconds, first = env.run(_bootstrap_only(), "bootstrap-first")
    _, again = env.run(_bootstrap_only(), "bootstrap-again")
    env.install = {
        "errors": _errors(first) + _errors(again), "first": _text(first.cells[0]), "again": _text(again.cells[0]),
        "again_seconds": _cell_seconds(again.cells[0]), "install_seconds": _cell_seconds(first.cells[0]),
        "torch_before": torch_before, "torch_after": colab_like.installed(venv, "torch"),
        "torch_files_same": torch_files == sorted(p.name for p in (colab_like.site_packages(base) / "torch").iterdir()),
        "torch_in_layer": sorted(p.name for p in colab_like.site_packages(venv).iterdir() if p.name.startswith("torch")
                                 and not p.name.startswith("torchviz")),
        "installed": {n: colab_like.installed(venv, n) for n in ("training-mechanics-lab", "torchviz", "graphviz",
                                                                  "ipywidgets", "tqdm")},
    }
    yield env
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / "timings.json"
    recorded = json.loads(path.read_text()) if path.exists() else {}
    recorded[f"torch {env.torch}"] = {"base environment built in s": round(base_seconds, 1),
                                      "set-up cell install s": round(env.install["install_seconds"], 1),
                                      "set-up cell again s": round(env.install["again_seconds"], 3),
                                      "notebooks s": env.timings}
    path.write_text(json.dumps(recorded, indent=1))


def test_the_set_up_cell_installs_the_course_and_leaves_torch_alone(colab):
    info = colab.install
    assert info["errors"] == []
    assert info["first"].count("\n") == 1 and f"installed the course from {REPO} with pip" in info["first"], info["first"]
    assert f"torch {colab.torch} left as it was" in info["first"]
    assert info["torch_before"] == info["torch_after"] == colab.torch
    assert info["torch_files_same"] and info["torch_in_layer"] == [], info["torch_in_layer"]
    assert all(info["installed"].values()), info["installed"]
    assert info["again"].count("\n") == 1 and "the course is installed; nothing to do" in info["again"], info["again"]
    print(f"torch {colab.torch}: install {info['install_seconds']:.1f} s, again {info['again_seconds'] * 1e3:.0f} ms")
    assert info["again_seconds"] <= 0.5


@pytest.mark.parametrize("assignment", SOLUTIONS, ids=[a.name for a in SOLUTIONS])
def test_solution_notebook_runs_through_the_set_up_cell(colab, assignment):
    nb = bootstrap.with_bootstrap(nbformat.read(assignment.source, as_version=4))
    seconds, nb = colab.run(nb, f"solution-{assignment.name}")
    assert _errors(nb) == []
    assert "nothing to do" in _text(nb.cells[0])
    print(f"torch {colab.torch}, solution {assignment.name}: {seconds:.1f} s")


@pytest.mark.parametrize("assignment", SOLUTIONS, ids=[a.name for a in SOLUTIONS])
def test_released_notebook_with_reference_answers_runs(colab, assignment):
    nb = reference_submission(assignment)
    setup = [c for c in nb.cells if c.get("id") == bootstrap.CELL_ID]
    assert setup, f"{assignment.release} has no set-up cell: run `python -m grader release`"
    seconds, nb = colab.run(nb, f"released-{assignment.name}")
    assert _errors(nb) == []
    assert "nothing to do" in _text(next(c for c in nb.cells if c.get("id") == bootstrap.CELL_ID))
    print(f"torch {colab.torch}, released {assignment.name} with reference answers: {seconds:.1f} s")
