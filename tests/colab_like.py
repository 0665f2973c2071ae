"""Colab- and Kaggle-like Python kernels (tests/test_colab_like.py, tests/test_kaggle_like.py): a runtime's Python and
packages, nothing of the course.

Nothing here is a test.

- `COLAB`, `KAGGLE`: the runtimes modelled. Colab's current one (Python 3.13; tests/colab_runtime.txt: torch
  2.11.0, numpy 2.1.3, ipywidgets 7.7.1 …) and Kaggle's (Python 3.12; tests/kaggle_runtime.txt: the Colab image of
  May 2026 that Kaggle's is built on — torch 2.10.0, numpy 2.0.2 — with Kaggle's own pins on top, ipywidgets
  8.1.5 …). Each file names its sources.
- `Runtime.python()`: an interpreter of the runtime's Python minor version, or None when this machine has none
  (pyenv's, or pythonX.Y on PATH).
- `Runtime.base_venv()`: a virtual environment of that Python with the runtime's file installed — the registry's
  torch at the runtime's version (a CUDA build; on a machine without a GPU `torch.cuda.is_available()` is False)
  and the kernel packages at the runtime's versions: ipykernel 6.17.1, IPython 7.34, jupyter_client 7.4.9,
  matplotlib 3.10.0 … — and nothing of the course: no helpers, nbgrader or torchviz. Built once under
  build/<name>-like/, in a folder named by a hash of what it holds, and reused; a half-built one (no stamp) is
  removed and built again.
- `Runtime.kernel_venv(base, folder)`: a throw-away environment for one test session that sees the base's
  packages (a `.pth` line) and installs into its own site-packages, so the notebooks' set-up cell really installs
  the course into a kernel that lacks it, and the cached base stays untouched.
- `kernelspec(venv, folder)`: a Jupyter kernelspec for that environment's Python.
- `distributions(venv)`: every distribution that environment's Python sees, with its version and folder.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
STAMP = ".complete"


@contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # two test sessions never build the same environment at once
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _run(cmd: list[str], log: Path) -> None:
    with open(log, "a") as out:
        out.write("$ " + " ".join(cmd) + "\n")
        out.flush()
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=clean_env())
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {done.returncode}); see {log}")


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without what would leak the course's own environment into another Python."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin)
    env.update(extra)
    return env


@dataclass(frozen=True)
class Runtime:
    """A hosted notebook runtime as the course meets it: a Python minor version and a file of exact pins."""

    name: str  # "colab": its base environment lives in build/colab-like/
    python_version: str  # "3.13"
    packages: Path  # pip requirements, torch first, each line at the runtime's version; the header names the source

    def python(self) -> str | None:
        """An interpreter of this runtime's Python minor version on this machine, or None."""
        found = sorted(glob.glob(f"/root/.pyenv/versions/{self.python_version}.*/bin/python{self.python_version}"))
        return found[-1] if found else shutil.which(f"python{self.python_version}")

    def pinned(self, name: str) -> str:
        """The version the packages file pins distribution `name` at."""
        return next(line.split("==", 1)[1] for line in self.packages.read_text().splitlines()
                    if line.split("==", 1)[0].lower() == name.lower())

    def site_packages(self, venv: Path) -> Path:
        return venv / "lib" / f"python{self.python_version}" / "site-packages"

    def base_venv(self) -> tuple[Path, float]:
        """The cached base environment, built when missing: (its folder, seconds spent building)."""
        interpreter = self.python()
        if interpreter is None:
            raise FileNotFoundError(f"no Python {self.python_version} here (pyenv or python{self.python_version} on PATH)")
        version = subprocess.run([interpreter, "-c", "import sys; print(sys.version)"], capture_output=True, text=True,
                                 check=True).stdout
        key = hashlib.sha256((version + self.packages.read_text()).encode()).hexdigest()[:12]
        cache = REPO / "build" / f"{self.name}-like"
        folder = cache / f"{self.name}-{self.python_version}-{key}"
        with _locked(cache / f".{folder.name}.lock"):
            if (folder / STAMP).exists():
                return folder, 0.0
            shutil.rmtree(folder, ignore_errors=True)
            began = time.perf_counter()
            log = cache / f"{folder.name}.log"
            log.unlink(missing_ok=True)
            _run([interpreter, "-m", "venv", str(folder)], log)
            pip = [str(folder / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
            # torch alone first (with its CUDA libraries), as `./course setup` does, then the runtime's packages
            _run(pip + [f"torch=={self.pinned('torch')}", "--constraint", str(self.packages)], log)
            _run(pip + ["--requirement", str(self.packages)], log)
            (folder / STAMP).write_text(json.dumps({"python": version, "runtime": self.packages.read_text()}))
            return folder, time.perf_counter() - began

    def kernel_venv(self, base: Path, folder: Path) -> Path:
        """A fresh environment in `folder` layered on `base`: imports see both, pip installs into `folder` only."""
        subprocess.run([str(self.python()), "-m", "venv", "--without-pip", str(folder)], check=True, env=clean_env())
        # An `import site` line runs at start-up: the base's own .pth files are processed as well.
        (self.site_packages(folder) / "colab_like_base.pth").write_text(
            f"import site; site.addsitedir({str(self.site_packages(base))!r})\n")
        return folder


COLAB = Runtime("colab", "3.13", TESTS / "colab_runtime.txt")  # Colab's os-info.txt: Python 3.13.15
KAGGLE = Runtime("kaggle", "3.12", TESTS / "kaggle_runtime.txt")  # the May-2026 Colab image's: Python 3.12.13
RUNTIMES = (COLAB, KAGGLE)


def kernelspec(venv: Path, folder: Path, name: str = "colab-like") -> Path:
    """A kernelspec folder (`folder/name/kernel.json`) that starts ipykernel with `venv`'s Python."""
    spec = folder / name
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [str(venv / "bin" / "python"), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"Colab-like ({venv.name})", "language": "python"}))
    return folder


def distributions(venv: Path) -> dict[str, tuple[str, str]]:
    """name → (version, site-packages folder) of every distribution `venv`'s Python sees (the first of each name)."""
    probe = ("import importlib.metadata as m, json, re\nfound = {}\n"
             "for d in m.distributions():\n"
             "    name = re.sub(r'[-_.]+', '-', d.metadata['Name'] or '').lower()\n"
             "    found.setdefault(name, (d.version, str(d.locate_file(''))))\n"
             "print(json.dumps(found))")
    out = subprocess.run([str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True, env=clean_env(),
                         cwd=venv, check=True).stdout  # cwd: not a checkout's egg-info
    return {name: (version, where) for name, (version, where) in json.loads(out).items()}


if __name__ == "__main__":  # build (or find) base environments, in order: python tests/colab_like.py [colab] [kaggle]
    for runtime in RUNTIMES:
        if runtime.python() is None:
            print(f"{runtime.name}: no Python {runtime.python_version} here")
        elif not sys.argv[1:] or runtime.name in sys.argv[1:]:
            path, seconds = runtime.base_venv()
            print(f"{path} ({f'built in {seconds:.0f} s' if seconds else 'cached'})")
