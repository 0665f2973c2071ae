"""The kernelspec's launcher runs in an interpreter without site-packages: it may import the standard library only."""

import ast
import json
import sys
from pathlib import Path

from grader.kernel import kernelspec, launcher, newroot


def test_the_launcher_imports_the_standard_library_only():
    tree = ast.parse(Path(launcher.__file__).read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert imported - {"__future__"} <= sys.stdlib_module_names, imported - sys.stdlib_module_names


def test_the_kernelspec_starts_the_launcher_without_site_packages():
    argv = json.loads(kernelspec._kernel_json())["argv"]
    assert argv == [sys.executable, "-I", "-S", str(Path(launcher.__file__).resolve()), "{connection_file}"]


def test_the_launcher_hands_the_kernel_to_the_uid_the_sandbox_maps_it_to():
    assert launcher.NOBODY == newroot.NOBODY
