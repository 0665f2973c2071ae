"""Device choice and the one-call environment report (notebook 00)."""

from __future__ import annotations

import os
import platform
import shutil
from importlib import metadata

import torch


def pick_device(prefer: str | None = None) -> torch.device:
    """CUDA when present (or `prefer`, e.g. "cpu" to force the CPU path), else CPU (notebook 00)."""
    if prefer is not None:
        return torch.device(prefer)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def environment_report() -> dict[str, str]:
    """What this kernel has: versions, device, CPU cores, graphviz — as display-ready strings (notebook 00)."""
    device = pick_device()
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        device_text = f"cuda — {props.name}, {props.total_memory / 2**30:.1f} GiB"
    else:
        device_text = "cpu — no CUDA device visible to torch (GPU-only cells will say they were skipped)"
    dot = shutil.which("dot")
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": device_text,
        "cpu cores": str(os.cpu_count()),
        "torch threads": str(torch.get_num_threads()),
        "graphviz dot": dot or "missing — run ./course setup, or install graphviz",
        "torchviz": _version("torchviz"),
        "matplotlib": _version("matplotlib"),
        "ipywidgets": _version("ipywidgets"),
    }


def print_environment_report() -> None:
    """Print `environment_report()` as an aligned table (notebook 00)."""
    report = environment_report()
    width = max(map(len, report))
    for key, value in report.items():
        print(f"{key:<{width}}  {value}")
