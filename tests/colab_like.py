"""A Colab-like Python kernel for tests/test_colab_like.py: another torch, no course packages (issue 14 item 2).

Nothing here is a test.

- `base_venv(torch_version)`: a virtual environment with the stock torch wheel of that version from the
  registry (the CUDA build: on a machine without a GPU `torch.cuda.is_available()` is False) and what every
  hosted notebook kernel has — ipykernel, numpy, matplotlib — and nothing of the course: no helpers,
  nbgrader, torchviz, graphviz, ipywidgets or tqdm. Built once under build/colab-like/, in a folder named
  by a hash of what it holds, and reused; a half-built one (no stamp) is removed and built again.
- `kernel_venv(base, folder)`: a throw-away environment for one test session that sees the base's packages
  (a `.pth` line) and installs into its own site-packages, so the notebooks' bootstrap cell really installs
  the course into a kernel that lacks it, and the cached base stays untouched.
- `kernelspec(venv, folder)`: a Jupyter kernelspec for that environment's Python.
"""

from __future__ import annotations

import fcntl
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
# What a hosted notebook kernel (Colab, Kaggle) has before the course: versions from requirements.txt.
STOCK = ("ipykernel", "numpy", "matplotlib")
STAMP = ".complete"


def pins() -> dict[str, str]:
    """requirements.txt as name → pin line."""
    found = {}
    for line in (REPO / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            found[line.split("==", 1)[0].strip().lower()] = line
    return found


def base_requirements(torch_version: str) -> list[str]:
    """What the base environment holds: torch first (it brings its CUDA libraries), then the stock packages."""
    return [f"torch=={torch_version}"] + [pins()[name] for name in STOCK]


def _key(requirements: list[str]) -> str:
    return hashlib.sha256("\n".join([sys.version, *requirements]).encode()).hexdigest()[:12]


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
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=_clean_env())
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {done.returncode}); see {log}")


def _clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without what would leak the course's own environment into another Python."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin)
    env.update(extra)
    return env


def site_packages(venv: Path) -> Path:
    return venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def base_venv(torch_version: str) -> tuple[Path, float]:
    """The cached base environment for `torch_version`, built when missing: (its folder, seconds spent building)."""
    requirements = base_requirements(torch_version)
    folder = CACHE / f"torch-{torch_version}-{_key(requirements)}"
    with _locked(CACHE / f".{folder.name}.lock"):
        if (folder / STAMP).exists():
            return folder, 0.0
        shutil.rmtree(folder, ignore_errors=True)
        began = time.perf_counter()
        log = CACHE / f"{folder.name}.log"
        log.unlink(missing_ok=True)
        # The interpreter this suite runs on, not the course's .venv: a hosted kernel has its own Python.
        base_python = getattr(sys, "_base_executable", sys.executable)
        _run([base_python, "-m", "venv", str(folder)], log)
        pip = [str(folder / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        _run(pip + [requirements[0]], log)  # torch alone first, as `./course setup` does
        _run(pip + requirements, log)
        (folder / STAMP).write_text(json.dumps({"requirements": requirements}))
        return folder, time.perf_counter() - began


def kernel_venv(base: Path, folder: Path) -> Path:
    """A fresh environment in `folder` layered on `base`: imports see both, pip installs into `folder` only."""
    base_python = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base_python, "-m", "venv", "--without-pip", str(folder)], check=True, env=_clean_env())
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


def installed(venv: Path, name: str) -> str | None:
    """The version of distribution `name` that `venv`'s Python sees, or None."""
    probe = ("import importlib.metadata as m, sys\n"
             "try: print(m.version(sys.argv[1]))\nexcept m.PackageNotFoundError: print('')")
    out = subprocess.run([str(venv / "bin" / "python"), "-c", probe, name], capture_output=True, text=True,
                         env=_clean_env(), cwd=venv, check=True).stdout.strip()  # not a checkout's egg-info
    return out or None


if __name__ == "__main__":  # build (or find) the base environments: python tests/colab_like.py 2.14.1 2.11.0
    for version in sys.argv[1:]:
        path, seconds = base_venv(version)
        print(f"{path} ({f'built in {seconds:.0f} s' if seconds else 'cached'})")
