"""The student edition (`python -m grader edition OUT --git`): a repository for students with nothing secret in it.

Fast: the edition's course script, pins and pyproject are the instructor's less the instructor's tools. Slow (one
build, about 20 s of nbgrader): what the command writes and warns, that it is a git repository with its tag, that it
holds no solution, hidden test, grader, mutant or reference record, that a stale release is refused with the
reason; and the edition's own `./course setup` gives a JupyterLab with no nbgrader extension and no grading kernel.
"""

import dataclasses
import json
import os
import shutil
import subprocess
from pathlib import Path

import nbformat
import pytest
import tomllib
from conftest import PYTHON, REPO
from packaging.requirements import Requirement

from grader.author import check, edition
from grader.author.bootstrap import SETTING, settings

FILES = {"notebooks", "helpers", "labkit", "course", "requirements.txt", "environment.yml", "pyproject.toml",
         "README.md", ".gitignore"}


@pytest.mark.integration  # bash checks the script
def test_the_course_script_of_the_edition_has_no_instructor_command():
    script = edition.course_script()
    # the instructor's commands only say that they are the instructor's (tests/test_setup.py): none runs the grader
    for gone in ("-m grader", "nbgrader", "pytest", "ruff", "mypy", "chromium", "kernelspec", "demo)", "test)",
                 "# >>> instructor"):
        assert gone not in script, gone
    for kept in ("lab)", "setup)", "validate)", "quiet_lab", "fetchNews"):
        assert kept in script, kept
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)  # still a valid script


def test_the_edition_pins_leave_out_the_instructor_tools():
    pins = edition._without_instructor_pins((REPO / "requirements.txt").read_text())
    names = {Requirement(line).name.lower() for line in pins.splitlines() if line and not line.startswith("#")}
    assert not names & edition.INSTRUCTOR_ONLY and {"torch", "jupyterlab", "ipykernel", "torchviz"} <= names
    conda = edition._without_instructor_pins((REPO / "environment.yml").read_text())
    assert "nbgrader" not in conda and "jupyterlab==" in conda and "- -e ." in conda


def test_the_edition_pyproject_declares_ranges_and_torch_only_as_an_extra():
    ours = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    theirs = tomllib.loads(edition.pyproject(settings()))
    assert theirs["project"]["dependencies"] == ours["dependencies"]
    assert all(Requirement(d).name != "torch" and "==" not in d for d in theirs["project"]["dependencies"])
    assert theirs["project"]["optional-dependencies"]["torch"] == ours["optional-dependencies"]["torch"]
    assert theirs["tool"]["setuptools"]["packages"] == ["helpers", "labkit", "labkit.notebooks"]


def test_the_edition_never_empties_the_instructor_repository_or_a_folder_that_is_not_an_edition(tmp_path):
    for out, why in ((REPO, "instructor repository"), (REPO.parent, "instructor repository"),
                     (REPO / "notebooks", "not empty and not a git clone")):
        with pytest.raises(edition.EditionRefused, match=why):
            edition.write_edition(out)
    (tmp_path / "other" / ".git").mkdir(parents=True)
    (tmp_path / "other" / "solutions").mkdir()
    with pytest.raises(edition.EditionRefused, match="holds solutions"):
        edition.write_edition(tmp_path / "other")
    (tmp_path / "a-file").write_text("")
    with pytest.raises(edition.EditionRefused, match="is a file"):
        edition.write_edition(tmp_path / "a-file")
    assert (tmp_path / "other" / "solutions").is_dir() and (REPO / "solutions").is_dir()


@pytest.mark.integration  # runs git
def test_the_edition_ships_only_what_git_tracks(tmp_path, monkeypatch):
    repo = tmp_path / "instructor"
    (repo / "helpers").mkdir(parents=True)
    (repo / "helpers" / "plots.py").write_text("")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", "helpers"], check=True)
    (repo / "helpers" / "__pycache__").mkdir()
    (repo / "helpers" / "__pycache__" / "plots.cpython-311.pyc").write_text("")
    (repo / ".gitignore").write_text("__pycache__/\n")
    monkeypatch.setattr(edition, "REPO", repo)
    assert edition._tracked(repo / "helpers") == [repo / "helpers" / "plots.py"]
    (repo / "helpers" / "answers_draft.py").write_text("")
    with pytest.raises(edition.EditionRefused, match="git does not track.*helpers/answers_draft.py"):
        edition._tracked(repo / "helpers")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """`python -m grader edition OUT --git`, as an instructor runs it."""
    out = tmp_path_factory.mktemp("edition") / "tml-students"
    run = subprocess.run([PYTHON, "-m", "grader", "edition", str(out), "--git"], cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    return out, run


@pytest.mark.slow
def test_the_edition_is_a_tagged_repository_with_nothing_secret(built):
    out, run = built
    assert {p.name for p in out.iterdir()} - {".git"} == FILES | ({"LICENSE"} if (REPO / "LICENSE").exists() else set())
    assert edition.edition_leaks(out) == []
    s = settings()
    assert subprocess.run(["git", "-C", str(out), "tag"], capture_output=True, text=True).stdout.split() == [s.release_tag]
    assert subprocess.run(["git", "-C", str(out), "status", "--porcelain"], capture_output=True, text=True).stdout == ""
    assert f"push origin main {s.release_tag}" in run.stdout and "MiB" in run.stdout
    if not s.published:
        assert f"warning: {SETTING} is still the placeholder" in run.stderr
    for assignment in ("01_gradient_descent", "07_distributed"):
        theirs = nbformat.read(out / "notebooks" / assignment / f"{assignment}.ipynb", as_version=4)
        assert theirs == nbformat.read(REPO / "notebooks" / assignment / f"{assignment}.ipynb", as_version=4)
    readme = (out / "README.md").read_text()
    assert "Check, then hand in" in readme and s.release_tag in readme
    with pytest.raises(edition.EditionRefused, match="already has the tag"):
        edition.commit_and_tag(out)
    readme_before = (out / "README.md").read_text()
    (out / "README.md").write_text("edited in the clone")
    again = subprocess.run([PYTHON, "-m", "grader", "edition", str(out), "--git"], cwd=REPO, capture_output=True, text=True)
    assert again.returncode == 1 and "already has the tag" in again.stderr, again.stderr
    assert (out / "README.md").read_text() == "edited in the clone", "refused before anything was written"
    (out / "README.md").write_text(readme_before)


@pytest.mark.slow
def test_the_leak_check_finds_what_must_not_be_published(built, tmp_path):
    out = tmp_path / "copy"
    shutil.copytree(built[0], out, ignore=shutil.ignore_patterns(".git"))
    source = nbformat.read(REPO / "solutions/01_gradient_descent/01_gradient_descent.ipynb", as_version=4)
    (out / "notebooks" / "solution.ipynb").write_text(nbformat.writes(source))
    (out / "labkit" / "mutants").mkdir()
    (out / "labkit" / "mutants" / "01.toml").write_text("")
    leaks = edition.edition_leaks(out)
    assert any("solution/hidden-test marker" in leak for leak in leaks)
    assert any("labkit/mutants/01.toml must not be in the edition" in leak for leak in leaks)


@pytest.mark.slow
def test_a_stale_release_is_refused_with_the_reason(tmp_path, monkeypatch):
    stale = tmp_path / "notebooks"
    shutil.copytree(REPO / "notebooks", stale)
    path = stale / "01_gradient_descent" / "01_gradient_descent.ipynb"
    nb = nbformat.read(path, as_version=4)
    nb.cells[-3].source += "\n# edited by hand"
    nbformat.write(nb, path)
    monkeypatch.setattr(check, "NOTEBOOKS", stale)
    with pytest.raises(edition.EditionRefused, match="release is stale.*01_gradient_descent.*run `python -m grader release`"):
        edition.write_edition(tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_the_edition_lab_has_no_nbgrader_and_no_grading_kernel(built):
    """The edition's own `./course setup`, as a student runs it on a laptop: then what its JupyterLab would load."""
    out, _ = built
    run = subprocess.run([str(out / "course"), "setup"], capture_output=True, text=True,
                         env={k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")})
    assert run.returncode == 0, run.stdout + run.stderr
    jupyter = str(out / ".venv" / "bin" / "jupyter")
    specs = json.loads(subprocess.run([jupyter, "kernelspec", "list", "--json"], capture_output=True, text=True,
                                      check=True).stdout)["kernelspecs"]
    assert list(specs) == ["python3"], specs
    extensions = subprocess.run([jupyter, "labextension", "list"], capture_output=True, text=True, check=True)
    server = subprocess.run([jupyter, "server", "extension", "list"], capture_output=True, text=True, check=True)
    for listing in (extensions, server):
        assert "nbgrader" not in (listing.stdout + listing.stderr).lower()
    overrides = json.loads((out / ".venv/share/jupyter/lab/settings/overrides.json").read_text())
    assert overrides["@jupyterlab/apputils-extension:notification"]["fetchNews"] == "false"
    validate = subprocess.run([str(out / "course"), "validate", "notebooks/01_gradient_descent/01_gradient_descent.ipynb"],
                              cwd=out, capture_output=True, text=True)
    assert validate.returncode == 1 and "✗ mse_grad: not answered yet" in validate.stdout, validate.stdout


def test_the_edition_readme_links_every_notebook_once_published():
    published = dataclasses.replace(settings(), repository="https://github.com/some-school/tml-students", release_tag="v9.1")
    text = edition.readme(published)
    for name in ("00_setup", "07_distributed"):
        assert f"colab.research.google.com/github/some-school/tml-students/blob/v9.1/notebooks/{name}/{name}.ipynb" in text
    assert "git clone https://github.com/some-school/tml-students.git" in text
    unpublished = dataclasses.replace(published, repository="https://github.com/YOUR-ORG/tml-students")
    assert "colab.research.google.com/github" not in edition.readme(unpublished)
    assert "YOUR-ORG" not in edition.readme(unpublished)


def _tree(folder: Path) -> dict[str, bytes | str]:
    """Every path under `folder` with its bytes (a link: where it points; a folder: '')."""
    return {str(p.relative_to(folder)): str(p.readlink()) if p.is_symlink() else p.read_bytes() if p.is_file() else ""
            for p in sorted(folder.rglob("*"))}


@pytest.fixture
def instructor(tmp_path, monkeypatch):
    """A committed instructor checkout (the course's own pins and script, one helper, one released notebook) that
    the edition is built from; `commit()` commits what was added since. The release counts as fresh."""
    repo = tmp_path / "instructor"
    for name in ("course", "requirements.txt", "environment.yml", "pyproject.toml"):
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, repo / name)
    for name in ("helpers/__init__.py", "labkit/__init__.py", "notebooks/00_setup/00_setup.ipynb",
                 "solutions/01_gradient_descent/01_gradient_descent.ipynb"):
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, repo / name)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)

    def commit() -> None:
        subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
        subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@invalid", "commit", "-qm", "x"],
                       check=True)

    commit()
    monkeypatch.setattr(edition, "REPO", repo)
    monkeypatch.setattr(edition, "NOTEBOOKS", repo / "notebooks")
    monkeypatch.setattr(edition, "KERNEL_PACKAGES", (repo / "helpers", repo / "labkit"))
    monkeypatch.setattr(edition, "_refuse_stale", lambda: None)  # check.stale_problems has tests of its own
    return repo, commit


def _clone_of_an_earlier_edition(out: Path) -> Path:
    (out / ".git").mkdir(parents=True)
    (out / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (out / "README.md").write_text("the earlier edition's README")
    (out / "helpers").mkdir()
    (out / "helpers" / "gone.py").write_text("# a helper the new version no longer has")
    return out


@pytest.mark.integration  # runs git
@pytest.mark.parametrize("link", ["helpers/x.ipynb", "helpers/more", "LICENSE"])
def test_a_link_in_what_the_edition_ships_is_refused_and_out_is_left_as_it_was(instructor, tmp_path, link):
    """Issue 36 item 3: a committed link to a solution notebook (or to the folder holding it) is refused by name
    before OUT is touched; it was published as the file it points to, and OUT written before the refusal."""
    repo, commit = instructor
    target = repo / "solutions" / "01_gradient_descent" / ("01_gradient_descent.ipynb" if link != "helpers/more" else "")
    (repo / link).symlink_to(os.path.relpath(target, (repo / link).parent))
    commit()
    out = _clone_of_an_earlier_edition(tmp_path / "clone")
    before = _tree(out)
    with pytest.raises(edition.EditionRefused, match=f"{link} is a symbolic link"):
        edition.write_edition(out)
    assert _tree(out) == before
    with pytest.raises(edition.EditionRefused, match="symbolic link"):
        edition.write_edition(tmp_path / "new")
    assert not (tmp_path / "new").exists()


@pytest.mark.integration  # runs git
def test_a_leak_is_refused_before_out_is_touched_and_a_clean_edition_replaces_its_files(instructor, tmp_path):
    repo, commit = instructor
    (repo / "helpers" / "draft.py").write_text("x = 1\n### BEGIN SOLUTION\nx = 2\n### END SOLUTION\n")
    commit()
    out = _clone_of_an_earlier_edition(tmp_path / "clone")
    before = _tree(out)
    with pytest.raises(edition.EditionRefused, match="leak.*helpers/draft.py"):
        edition.write_edition(out)
    assert _tree(out) == before
    (repo / "helpers" / "draft.py").unlink()
    commit()
    files = edition.write_edition(out)
    assert {str(p.relative_to(out)) for p in files} >= {"helpers/__init__.py", "notebooks/00_setup/00_setup.ipynb",
                                                        "README.md", "course"}
    assert not (out / "helpers" / "gone.py").exists() and (out / ".git" / "HEAD").read_text() == "ref: refs/heads/main\n"
    assert not any(p.is_symlink() for p in out.rglob("*"))
