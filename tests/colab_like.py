"""A Colab-like Python kernel for tests/test_colab_like.py: Colab's Python and packages, nothing of the course.

Nothing here is a test.

- `python()`: an interpreter of Colab's Python minor version (3.13, from Colab's os-info.txt; see
  tests/colab_runtime.txt), or None when this machine has none (pyenv's, or python3.13 on PATH).
- `base_venv()`: a virtual environment of that Python with tests/colab_runtime.txt installed — torch 2.11.0 (the
  registry's CUDA build; on a machine without a GPU `torch.cuda.is_available()` is False) and Colab's kernel
  packages at Colab's versions: ipykernel 6.17.1, IPython 7.34, jupyter_client 7.4.9, ipywidgets 7.7.1,
  matplotlib 3.10.0, numpy 2.1.3 … — and nothing of the course: no helpers, nbgrader or torchviz. Built once under
  build/colab-like/, in a folder named by a hash of what it holds, and reused; a half-built one (no stamp) is
  removed and built again.
- `kernel_venv(base, folder)`: a throw-away environment for one test session that sees the base's packages
  (a `.pth` line) and installs into its own site-packages, so the notebooks' set-up cell really installs
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
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CACHE = REPO / "build" / "colab-like"
RUNTIME = Path(__file__).resolve().parent / "colab_runtime.txt"
COLAB_PYTHON = "3.13"  # Colab's os-info.txt: Python 3.13.15 (tests/colab_runtime.txt names the source)
STAMP = ".complete"


def python() -> str | None:
    """An interpreter of Colab's Python minor version on this machine, or None."""
    found = sorted(glob.glob(f"/root/.pyenv/versions/{COLAB_PYTHON}.*/bin/python{COLAB_PYTHON}"))
    return found[-1] if found else shutil.which(f"python{COLAB_PYTHON}")


def torch_version() -> str:
    """Colab's torch, as tests/colab_runtime.txt pins it."""
    line = next(line for line in RUNTIME.read_text().splitlines() if line.startswith("torch=="))
    return line.split("==", 1)[1]


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


def site_packages(venv: Path) -> Path:
    return venv / "lib" / f"python{COLAB_PYTHON}" / "site-packages"


def base_venv() -> tuple[Path, float]:
    """The cached Colab-like base environment, built when missing: (its folder, seconds spent building)."""
    interpreter = python()
    if interpreter is None:
        raise FileNotFoundError(f"no Python {COLAB_PYTHON} here (pyenv or python{COLAB_PYTHON} on PATH)")
    version = subprocess.run([interpreter, "-c", "import sys; print(sys.version)"], capture_output=True, text=True,
                             check=True).stdout
    key = hashlib.sha256((version + RUNTIME.read_text()).encode()).hexdigest()[:12]
    folder = CACHE / f"colab-{COLAB_PYTHON}-{key}"
    with _locked(CACHE / f".{folder.name}.lock"):
        if (folder / STAMP).exists():
            return folder, 0.0
        shutil.rmtree(folder, ignore_errors=True)
        began = time.perf_counter()
        log = CACHE / f"{folder.name}.log"
        log.unlink(missing_ok=True)
        _run([interpreter, "-m", "venv", str(folder)], log)
        pip = [str(folder / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        # torch alone first (with its CUDA libraries), as `./course setup` does, then Colab's packages
        _run(pip + [f"torch=={torch_version()}", "--constraint", str(RUNTIME)], log)
        _run(pip + ["--requirement", str(RUNTIME)], log)
        (folder / STAMP).write_text(json.dumps({"python": version, "runtime": RUNTIME.read_text()}))
        return folder, time.perf_counter() - began


def kernel_venv(base: Path, folder: Path) -> Path:
    """A fresh environment in `folder` layered on `base`: imports see both, pip installs into `folder` only."""
    subprocess.run([str(python()), "-m", "venv", "--without-pip", str(folder)], check=True, env=clean_env())
    # An `import site` line runs at start-up: the base's own .pth files are processed as well.
    (site_packages(folder) / "colab_like_base.pth").write_text(
        f"import site; site.addsitedir({str(site_packages(base))!r})\n")
    return folder


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


if __name__ == "__main__":  # build (or find) the base environment: python tests/colab_like.py
    path, seconds = base_venv()
    print(f"{path} ({f'built in {seconds:.0f} s' if seconds else 'cached'})")
