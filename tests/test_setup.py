"""What set-up promises a newcomer (docs/setup.md): the stated Python installs the pins, a course setting does not
run set-up again, TML_TORCH_INDEX picks torch's index, and the lab's root keeps no build artefact."""

import re
import shutil
import subprocess
from importlib.metadata import PackageNotFoundError, metadata, version

import pytest
import tomllib
from conftest import REPO
from packaging.specifiers import SpecifierSet

from grader.author.edition import course_project, course_script


def pins() -> dict[str, str]:
    lines = (REPO / "requirements.txt").read_text().splitlines()
    return dict(line.split("==") for line in lines if line.strip() and not line.startswith("#"))


def stated_minimum() -> str:
    return course_project()["requires-python"].removeprefix(">=")


def test_every_pin_supports_the_stated_minimum_python_and_an_older_one_is_not_stated():
    """Each pin's own Requires-Python (from its installed metadata, no network) admits the stated minimum; and the
    minimum is no lower than the pins allow: one minor version less is refused by at least one pin."""
    minimum = stated_minimum()
    major, minor = map(int, minimum.split("."))
    refusing = []
    for name, pinned in pins().items():
        try:
            assert version(name).split("+")[0] == pinned, f"{name} {version(name)} installed, {pinned} pinned"
        except PackageNotFoundError:
            pytest.fail(f"{name} is pinned but not installed: run ./course setup")
        requires = SpecifierSet(metadata(name).get("Requires-Python") or "")
        assert requires.contains(f"{minimum}.0"), f"{name}=={pinned} needs Python {requires}, the course states {minimum}"
        if not requires.contains(f"{major}.{minor - 1}.99"):
            refusing.append(name)
    assert {"numpy", "matplotlib"} <= set(refusing)


def test_every_page_states_the_same_minimum_python():
    minimum = stated_minimum()
    texts = {"README.md": (REPO / "README.md").read_text(), "docs/setup.md": (REPO / "docs/setup.md").read_text(),
             "edition README": (REPO / "grader/author/edition.py").read_text()}
    for name, text in texts.items():
        stated = set(re.findall(r"Python (3\.\d+) or newer", text))
        assert stated <= {minimum}, f"{name} states Python {stated}, pyproject.toml {minimum}"
    assert "Python 3.11 or newer" in texts["README.md"] and "Python 3.11 or newer" in texts["docs/setup.md"]
    conda = re.search(r"- python=(3\.\d+)", (REPO / "environment.yml").read_text()).group(1)
    assert tuple(map(int, conda.split("."))) >= tuple(map(int, minimum.split(".")))


FAKE_PYTHON = """#!/bin/sh
# Stands in for .venv/bin/python: logs each call, answers `pip` as if it installed; -c runs the real python3.
echo "$*" >> "$LOG"
[ "$1" = "-c" ] && exec python3 "$@"
[ "$1 $2 $3 $4" = "-m pip install --no-deps" ] && mkdir -p "$ROOT_DIR/training_mechanics_lab.egg-info"
exit 0
"""


@pytest.fixture
def course_copy(tmp_path):
    """The course script with the pins and pyproject.toml, a .venv whose python only logs, and system packages there."""
    root = tmp_path / "course-copy"
    (root / ".venv/bin").mkdir(parents=True)
    for name in ("course", "requirements.txt", "pyproject.toml"):
        shutil.copy(REPO / name, root / name)
    python = root / ".venv/bin/python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    if not shutil.which("dot") or not (shutil.which("chromium") or shutil.which("/usr/bin/chromium")):
        pytest.skip("graphviz and chromium are installed by ./course setup; without them it would run apt-get")
    return root


def setup(root, **env) -> list[str]:
    log = root / "calls.log"
    log.write_text("")
    environment = {"PATH": "/usr/bin:/bin:/usr/local/bin", "HOME": str(root), "LOG": str(log), "ROOT_DIR": str(root),
                   **env}
    run = subprocess.run(["bash", str(root / "course"), "setup"], env=environment, capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    return [line for line in log.read_text().splitlines() if not line.startswith("-c")]


@pytest.mark.integration
def test_course_settings_do_not_run_set_up_again_but_the_project_metadata_does(course_copy):
    assert any("pip install -r" in call for call in setup(course_copy))
    assert setup(course_copy) == [], "a second run with nothing changed installs nothing"
    pyproject = course_copy / "pyproject.toml"
    text = pyproject.read_text()
    assert tomllib.loads(text)["tool"]["training-mechanics-lab"]["student-edition"]
    pyproject.write_text(re.sub(r'(?m)^student-edition = ".*"$', 'student-edition = "/srv/git/tml-students@v9"', text))
    assert setup(course_copy) == [], "a course setting changed: nothing to install"
    pyproject.write_text(pyproject.read_text().replace('"tqdm>=4.60"', '"tqdm>=4.61"'))
    assert any("pip install -r" in call for call in setup(course_copy)), "the project's dependencies changed"


@pytest.mark.integration
def test_torch_comes_from_tml_torch_index_and_no_egg_info_stays_in_the_lab_root(course_copy):
    index = "https://download.pytorch.org/whl/cpu"
    calls = setup(course_copy, TML_TORCH_INDEX=index)
    torch = [call for call in calls if "torch==" in call and "-r" not in call.split()]
    assert torch == [f"-m pip install --index-url {index} torch==2.13.0"]
    assert not list(course_copy.glob("*.egg-info"))
    (course_copy / ".venv/.course-installed").unlink()
    assert [c for c in setup(course_copy) if "torch==" in c] == ["-m pip install torch==2.13.0"], "PyPI without it"


@pytest.mark.integration
def test_an_old_python_is_refused_before_any_download(course_copy, tmp_path):
    old = tmp_path / "python3.10"
    old.write_text('#!/bin/sh\n[ "$1" = "--version" ] && { echo "Python 3.10.12"; exit 0; }\n'
                   'exec python3 -c "import sys; sys.exit(1)"\n')
    old.chmod(0o755)
    log = course_copy / "calls.log"
    log.write_text("")
    run = subprocess.run(["bash", str(course_copy / "course"), "setup"], capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "LOG": str(log), "ROOT_DIR": str(course_copy),
                              "COURSE_PYTHON": str(old)})
    assert run.returncode == 1
    assert "the course needs Python 3.11 or newer" in run.stdout and "COURSE_PYTHON=python3.11" in run.stdout
    assert "pip" not in log.read_text()


@pytest.mark.integration
def test_the_editions_course_script_says_the_grader_is_the_instructors_tool(tmp_path):
    script = tmp_path / "course"
    script.write_text(course_script())
    for command in ("grader", "test", "demo", "docs"):
        run = subprocess.run(["bash", str(script), command, "--help"], capture_output=True, text=True, timeout=30)
        assert run.returncode == 2 and f"./course {command} is the instructor's tool" in run.stdout, run.stdout
