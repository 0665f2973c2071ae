"""The pip pins and the conda environment agree, and torch is pinned and installed first."""

import re

from conftest import REPO


def pip_pins() -> list[str]:
    lines = (REPO / "requirements.txt").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def conda_pip_pins() -> list[str]:
    text = (REPO / "environment.yml").read_text()
    section = text.split("- pip:", 1)[1]
    return [m.group(1).strip() for m in re.finditer(r"^\s+- (\S.*?)\s*(#.*)?$", section, re.M)]


def test_every_requirement_is_pinned_exactly():
    for pin in pip_pins():
        assert re.fullmatch(r"[A-Za-z0-9_.\-\[\]]+==[0-9][\w.+]*", pin), f"{pin!r} is not an exact pin"


def test_torch_is_pinned_first():
    assert pip_pins()[0] == "torch==2.13.0"
    assert conda_pip_pins()[0] == "torch==2.13.0"


def test_conda_environment_matches_requirements():
    conda = conda_pip_pins()
    assert "-e ." in conda, "environment.yml must install the project itself (editable)"
    assert [p for p in conda if p != "-e ."] == pip_pins(), (
        "environment.yml's pip section and requirements.txt disagree; keep them identical")


def test_course_script_installs_torch_before_the_rest():
    script = (REPO / "course").read_text()
    assert script.index("grep -E '^torch=='") < script.index("-r \"$ROOT/requirements.txt\"")
