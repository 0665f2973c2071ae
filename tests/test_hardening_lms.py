"""Hostile LMS zips (issue 36 item 8): members that are links, folders or special files, unsafe paths written the
Windows way, names that collide once made safe (case, Unicode normalisation, invisible and RTL characters), very long
names, bombs and nested zips. Nothing is written outside the output folder, nothing is followed through a link, no
student's hand-in is graded as another's, every member left out is named with why, and every name shown is safe.
Then the similarity report on hand-ins as a class writes them: honest students who write the obvious answers, the
released skeleton, and copies disguised by reordering, dead code or rewritten expressions.

Unit-level: the collector on zips built in memory, the comparison on answers in memory; no kernel."""

import os
import stat
import sys
import threading
import unicodedata
import zipfile
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest

from grader.author.mutants import reference_submission
from grader.collect import lms_zip, submissions
from grader.collect.submissions import CollectionError, collect, unpack_zip
from grader.course import assignment_named, assignments
from grader.report import similarity as similarity_module
from grader.report.similarity import MIN_TOKENS, SHARE, similarity, tokens
from grader.results import NoteKind
from labkit import cells

ONE = "01_gradient_descent"
A = assignment_named(ONE)
NOTEBOOK = nbformat.writes(reference_submission(A))


def member(name: str, mode: int = stat.S_IFREG | 0o644) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=(2030, 1, 15, 12, 0, 0))
    info.external_attr = mode << 16
    info.create_system = 3  # unix: the mode bits are read
    return info


def build(path, members):
    """`members`: (ZipInfo or name, text) pairs; a name may repeat."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for info, text in members:
            if isinstance(info, str):
                info = member(info)
            with pytest.warns(UserWarning) if info.filename in zf.NameToInfo else _nothing():
                zf.writestr(info, text)
    return path


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def unpacked(tmp_path, members):
    result = unpack_zip(build(tmp_path / "lms.zip", members), tmp_path / "out" / "unpacked", assignments())
    found = {(s.student, s.assignment): s for s in collect(result.root, assignments())}
    return found, result


def everything_under(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_a_member_that_is_a_link_is_named_and_never_written_or_followed(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("the instructor's own file")
    found, result = unpacked(tmp_path, [
        (member(f"ann_1_2_{A.notebook}", stat.S_IFLNK | 0o777), str(secret)),
        (member(f"bob/{ONE}/{A.notebook}", stat.S_IFLNK | 0o777), f"../../ann_1/{ONE}/{A.notebook}"),
        (f"cid_3_4_{A.notebook}", NOTEBOOK),
    ])
    assert sorted(result.skipped) == sorted([
        f"ann_1_2_{A.notebook} (a link: not followed)", f"bob/{ONE}/{A.notebook} (a link: not followed)"])
    assert set(found) == {("cid_3", ONE)}
    assert not any(p.is_symlink() for p in result.root.rglob("*"))


@pytest.mark.parametrize("kind, why", [(stat.S_IFDIR, "a folder"), (stat.S_IFIFO, "a special file"),
                                       (stat.S_IFCHR, "a special file")])
def test_a_member_marked_as_a_folder_or_special_file_but_named_like_a_notebook_is_named(tmp_path, kind, why):
    found, result = unpacked(tmp_path, [(member(f"ann_1_2_{A.notebook}", kind | 0o755), ""),
                                        (f"cid_3_4_{A.notebook}", NOTEBOOK)])
    assert result.skipped == [f"ann_1_2_{A.notebook} ({why})"] and set(found) == {("cid_3", ONE)}


@pytest.mark.parametrize("name", [
    f"..\\..\\{A.notebook}", f"ann\\..\\..\\..\\{A.notebook}", f"C:\\Users\\ann\\{ONE}\\{A.notebook}",
    f"C:/ann/{ONE}/{A.notebook}", f"/tmp/ann/{ONE}/{A.notebook}", f"ann/{ONE}/../../../{A.notebook}",
    f"//server/share/ann/{ONE}/{A.notebook}",
])
def test_unsafe_paths_written_the_posix_or_the_windows_way_are_named_and_nothing_lands_outside(tmp_path, name):
    found, result = unpacked(tmp_path, [(name, NOTEBOOK), (f"cid_3_4_{A.notebook}", NOTEBOOK)])
    assert result.skipped == [f"{name} (unsafe path)"]
    assert set(found) == {("cid_3", ONE)}
    assert everything_under(tmp_path) == sorted([
        "lms.zip", "out", "out/unpacked", "out/unpacked/.collection-times.json", "out/unpacked/cid_3",
        f"out/unpacked/cid_3/{ONE}", f"out/unpacked/cid_3/{ONE}/{A.notebook}"])


def test_a_zip_made_on_windows_with_backslashes_is_read_as_folders(tmp_path):
    found, result = unpacked(tmp_path, [(f"ann\\{ONE}\\{A.notebook}", NOTEBOOK)])
    assert set(found) == {("ann", ONE)} and found["ann", ONE].notebook is not None and result.skipped == []


def test_the_same_member_twice_keeps_one_and_names_the_other(tmp_path):
    found, result = unpacked(tmp_path, [(f"ann_1_2_{A.notebook}", NOTEBOOK), (f"ann_1_2_{A.notebook}", "{}")])
    assert len(result.skipped) == 1 and result.skipped[0].startswith(f"ann_1_2_{A.notebook} (another file of this name")
    assert nbformat.read(found["ann_1", ONE].notebook, as_version=4).cells  # the first, the readable one


# Names that become one key once made safe: case (one folder on macOS and Windows), NFC against NFD, two accents,
# an invisible character, an RTL override. Each is another student: never graded as the other one.
COLLIDING = [("ann", "Ann"), (unicodedata.normalize("NFC", "José"), unicodedata.normalize("NFD", "José")),
             ("Zoë", "Zoé"), ("bob", "bob\u200b"), ("eve", "\u202eeve")]


@pytest.mark.parametrize("first, second", COLLIDING)
def test_names_that_collide_once_made_safe_stay_two_students(tmp_path, first, second):
    # the second student has only a renamed copy: before, it landed in the first one's folder, an extra file there
    found, result = unpacked(tmp_path, [(f"{first}/{ONE}/{A.notebook}", NOTEBOOK),
                                        (f"{second}/{ONE}/Copy of {A.notebook}", NOTEBOOK)])
    assert result.skipped == []
    assert len(found) == 2, found
    for sub in found.values():
        assert sub.notebook is not None and not sub.problem
        assert not [n for n in sub.notes if n.kind.value == "extra files"]
    if submissions.slug(first).casefold() == submissions.slug(second).casefold():  # (NFD keeps an "e": "Jose")
        assert len(result.renamed) == 2 and all("the same key" in line for line in result.renamed)
    names = [sub.notebook.name for sub in sorted(found.values(), key=lambda s: s.student)]
    assert sorted(names) == sorted([A.notebook, f"Copy-of-{A.notebook}"])
    assert all(submissions.SAFE_NAME.match(student) for student, _ in found)


def test_canvas_names_differing_only_by_case_with_one_user_id_are_not_merged(tmp_path):
    found, result = unpacked(tmp_path, [(f"ann_1_2_{A.notebook}", NOTEBOOK), (f"Ann_1_3_Copy of {A.notebook}", NOTEBOOK)])
    keys = sorted(student for student, _ in found)
    assert len(keys) == 2 and len({k.casefold() for k in keys}) == 2, keys  # one folder on a case-insensitive disk


def test_rtl_and_control_characters_never_reach_the_terminal(tmp_path, capsys):
    from grader.batch.autograde import _unpacked as unpacked_for_the_run

    archive = build(tmp_path / "lms.zip", [(f"ann_1_2_{A.notebook}", NOTEBOOK),
                                           ("\u202egnp.\x1b[31mexe.txt", "x"),
                                           ("ann\x1b]0;pwned\x07.bin", "x")])
    run = SimpleNamespace(work=tmp_path / "work", known={a.name: a for a in assignments()})
    with unpacked_for_the_run(archive, run, None) as root:
        keys = [p.name for p in root.iterdir() if not p.name.startswith(".")]
    err = capsys.readouterr().err
    assert all(submissions.SAFE_NAME.match(k) for k in keys)
    assert "\x1b" not in err and "\u202e" not in err and "\x07" not in err
    assert "\\u202e" in err and "\\x1b" in err  # named, escaped


def test_a_very_long_name_is_named_short(tmp_path):
    long = "a" * 5000
    found, result = unpacked(tmp_path, [(f"{long}/{ONE}/{A.notebook}", NOTEBOOK), (f"cid_3_4_{A.notebook}", NOTEBOOK)])
    key = submissions.hashed_key(long)  # no safe key: a `refused` row, as folder collection gives such a folder
    assert set(found) == {("cid_3", ONE), (key, "?")} and found[key, "?"].problem.kind == NoteKind.REFUSED
    assert len(result.skipped) == 1 and len(result.skipped[0]) < 400 and result.skipped[0].endswith("says refused)")


def test_a_zip_bomb_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.setattr(lms_zip, "MAX_ZIP_BYTES", 2**20)  # the same check as at 2 GiB, on a small zip
    archive = tmp_path / "bomb.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(f"ann_1_2_{A.notebook}", NOTEBOOK)
        zf.writestr("bob_2_3_zeros.ipynb", b"\0" * (2 * 2**20))
    assert archive.stat().st_size < 2**16
    with pytest.raises(CollectionError, match="unpacks to more than"):
        unpack_zip(archive, tmp_path / "out", assignments())
    assert not any((tmp_path / "out").rglob("*.ipynb"))


def test_a_zip_of_too_many_members_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(lms_zip, "MAX_MEMBERS", 50)
    with pytest.raises(CollectionError, match="more than 50 files"):
        unpacked(tmp_path, [(f"s{k}_{k}_1_{A.notebook}", "{}") for k in range(51)])


def test_a_member_whose_declared_size_lies_stops_collection_in_one_line(tmp_path):
    archive = build(tmp_path / "lms.zip", [(f"ann_1_2_{A.notebook}", NOTEBOOK), ("bob_2_3_big.ipynb", "x" * 100_000)])
    data = bytearray(archive.read_bytes())
    with zipfile.ZipFile(archive) as zf:
        info = zf.getinfo("bob_2_3_big.ipynb")
    # the central directory says 10 bytes; the data inflates to 100 000
    central = data.rfind(b"PK\x01\x02", 0, data.rfind(b"bob_2_3_big.ipynb"))
    data[central + 24:central + 28] = (10).to_bytes(4, "little")
    archive.write_bytes(bytes(data))
    assert info.file_size == 100_000
    with pytest.raises(CollectionError, match="not a readable zip"):
        unpack_zip(archive, tmp_path / "out", assignments())


def test_a_nested_zip_is_not_opened_and_the_row_names_it(tmp_path):
    found, result = unpacked(tmp_path, [(f"ann/{ONE}/handin.zip", "PK\x05\x06" + "\0" * 18)])
    sub = found["ann", ONE]
    assert sub.notebook is None and "handin.zip" in sub.problem.text, sub.problem
    assert not any(p.suffix == ".ipynb" for p in result.root.rglob("*"))


def test_a_folder_named_like_a_notebook_is_not_a_notebook(tmp_path):
    found, result = unpacked(tmp_path, [(member(f"ann/{ONE}/{A.notebook}/"), ""),
                                        (f"ann/{ONE}/{A.notebook}/notes.txt", "hi"),
                                        (f"bob/{ONE}/{A.notebook}", NOTEBOOK),
                                        (f"bob/{ONE}/{A.notebook}/{A.notebook}", NOTEBOOK)])
    assert found["ann", ONE].notebook is None and found["ann", ONE].problem.kind.value == "missing"
    assert found["bob", ONE].notebook is not None
    assert [line.split(" (")[0] for line in result.skipped] == [f"bob/{ONE}/{A.notebook}/{A.notebook}"]



# --- the similarity report: no honest pair listed, and what a disguised copy does to it ---------------------------

def answers_of(notebook) -> dict[str, str]:
    return {cells.grade_id(c): c.source for c in notebook.cells if cells.kind(c) == cells.ANSWER}


def pairs(hand_ins: dict[str, dict[str, str]], name: str = ONE) -> list[list[str]]:
    rows = [{"student": s, "assignment": name, "answers": a} for s, a in hand_ins.items()]
    return [p["students"] for p in similarity(rows)["assignments"][name]["pairs"]]


@pytest.mark.parametrize("name", ["01_gradient_descent", "02_autograd_graph"])
def test_two_honest_students_who_write_the_obvious_short_answers_are_not_a_pair(name):
    # both answered only the short exercises, each with the one-liner everybody writes (the reference's): before,
    # 01 listed them with similarity 1.0 on 74 shared tokens, 02 on 83
    assignment = assignment_named(name)
    stubs, reference = answers_of(nbformat.read(assignment.release, as_version=4)), answers_of(reference_submission(assignment))
    short = {cell: source for cell, source in reference.items() if len(tokens(source)) <= MIN_TOKENS}
    assert short
    assert pairs({"a": {**stubs, **short}, "b": {**stubs, **short}}, name) == []
    assert pairs({"a": reference, "b": dict(reference)}, name) == []  # a class of two, both with the reference answers


def test_the_released_skeleton_and_its_visible_tests_pasted_into_answers_are_not_evidence():
    release = nbformat.read(A.release, as_version=4)
    visible = "\n".join(c.source for c in release.cells if cells.kind(c) == cells.TEST)
    stubs = answers_of(release)
    pasted = {cell: f"{source}\n{visible}\n" for cell, source in stubs.items()}
    assert pairs({"a": pasted, "b": dict(pasted), "c": stubs}) == []


def reordered(source: str) -> str:
    """The copy with independent statements swapped: numerical_grad's two set-up lines and its two steps."""
    swaps = [("    v = w.detach().reshape(-1).clone()\n    g = torch.empty_like(v)\n",
              "    g = torch.empty_like(w.detach().reshape(-1))\n    v = w.detach().reshape(-1).clone()\n"),
             ("        a[j] += eps\n        b[j] -= eps\n", "        b[j] -= eps\n        a[j] += eps\n"),
             ("        fa = f(a.reshape(w.shape))\n        fb = f(b.reshape(w.shape))\n",
              "        fb = f(b.reshape(w.shape))\n        fa = f(a.reshape(w.shape))\n"),
             ("    ls = []\n    t = 0\n", "    t = 0\n    ls = []\n")]
    for old, new in swaps:
        source = source.replace(old, new)
    return source


def with_dead_code(source: str) -> str:
    """A dead statement after every statement that does not open a block or return."""
    lines = []
    for line in source.splitlines():
        lines.append(line)
        stripped = line.strip()
        if stripped and not stripped.endswith((":", "(")) and not stripped.startswith(("return", "len(", "float(")):
            lines.append(line[: len(line) - len(line.lstrip())] + "_unused = None  # nothing")
    return "\n".join(lines) + "\n"


REWRITTEN = {  # COPY's answers, each expression rewritten into an equivalent one
    "mse_grad_answer": "def mse_grad(w, X, y):\n    n = y.shape[0]\n    return X.T @ (X @ w - y) * (2.0 / n)\n",
    "numerical_grad_answer": "def numerical_grad(f, w, eps=1e-3):\n    base = w.detach().flatten()\n"
                             "    grads = []\n    for j, _ in enumerate(base):\n        step = torch.zeros_like(base)\n"
                             "        step[j] = eps\n        up = f((base + step).view_as(w))\n"
                             "        down = f((base - step).view_as(w))\n        grads.append((up - down) / eps / 2)\n"
                             "    return torch.stack([torch.as_tensor(g) for g in grads]).view_as(w)\n",
    "gradient_descent_answer": "def gradient_descent(w0, X, y, lr, steps):\n    theta, ls = w0.detach().clone(), []\n"
                               "    for _ in range(steps):\n        ls.append(((theta @ X.T - y) ** 2).mean().item())\n"
                               "        theta -= lr * mse_grad(theta, X, y)\n    return theta, ls\n",
    "critical_lr_answer": "def critical_lr(X):\n    m = torch.linalg.eigvalsh(X.T.matmul(X) * 2 / len(X)).max()\n"
                          "    return 2 / m.item()\n",
}


def test_a_copy_reordered_or_padded_with_dead_code_is_listed_and_a_rewritten_one_is_not():
    from test_similarity import COPY, ORIGINAL

    def share(copy):
        found = similarity([{"student": s, "assignment": ONE, "answers": a}
                            for s, a in {"p": ORIGINAL, "q": copy}.items()])["assignments"][ONE]["pairs"]
        return found[0]["similarity"] if found else 0.0

    moved = {cell: reordered(source) for cell, source in COPY.items()}
    assert moved != COPY and share(moved) >= SHARE
    padded = {cell: with_dead_code(source) for cell, source in COPY.items()}
    assert padded["mse_grad_answer"].count("_unused") >= 2 and share(padded) >= SHARE
    assert share(REWRITTEN) < SHARE  # the limit docs/instructor/grading.md names: expressions rewritten throughout



# --- a hand-in folder the student can still write -----------------------------------------------------------


def test_a_notebook_swapped_for_a_fifo_after_listing_neither_hangs_collection_nor_is_read(tmp_path, monkeypatch):
    folder = tmp_path / "sub" / "ann" / ONE
    folder.mkdir(parents=True)
    notebook = folder / A.notebook
    notebook.write_text(NOTEBOOK)
    listed = submissions._entries

    def swapped(where):  # the student's racer: the listing saw a file, the open meets a FIFO
        found = listed(where)
        notebook.unlink()
        os.mkfifo(notebook)
        return found

    monkeypatch.setattr(submissions, "_entries", swapped)
    done = []
    worker = threading.Thread(target=lambda: done.append(collect(tmp_path / "sub", assignments(), ONE)), daemon=True)
    worker.start()
    worker.join(10)
    if worker.is_alive():  # today's code: blocked in open(); let it go before failing
        os.close(os.open(notebook, os.O_WRONLY | os.O_NONBLOCK))
    assert done, "collection blocked on a FIFO"


def test_the_collection_reader_follows_no_link_to_a_file_or_through_a_folder(tmp_path):
    secret = tmp_path / "secret.ipynb"
    secret.write_text(NOTEBOOK)
    folder = tmp_path / "ann" / ONE
    folder.mkdir(parents=True)
    (folder / "link.ipynb").symlink_to(secret)
    (folder / "deep").symlink_to(tmp_path)  # a sub-folder swapped for a link after the listing
    assert submissions.read_bounded(folder / "link.ipynb") == b""
    assert submissions.read_bounded(folder / "deep" / "secret.ipynb", folder) == b""
    assert submissions.read_bounded(Path("/dev/zero")) == b""
    (folder / "real").mkdir()
    (folder / "real" / "n.ipynb").write_text("{}")
    assert submissions.read_bounded(folder / "real" / "n.ipynb", folder) == b"{}"


# --- the student is always the LMS's own part of the name ------------------------------------------------------


@pytest.mark.parametrize("name, owner", [
    (f"eve_5_6_x\\bob_999_1_{A.notebook}", "eve_5"),  # Canvas: "\" in Eve's own file name (Linux and macOS allow it)
    (f"Eve_5_assignsubmission_file_x\\bob_999_1_{A.notebook}", "Eve_5"),  # Moodle's flat names, the same
    (f"Eve_5_assignsubmission_file_x\\Bob_999_assignsubmission_file_\\{A.notebook}", "Eve_5"),
])
def test_a_backslash_in_a_students_own_file_name_never_hands_in_under_another_key(tmp_path, name, owner):
    found, result = unpacked(tmp_path, [(name, NOTEBOOK), (f"carl_7_8_{A.notebook}", NOTEBOOK)])
    assert set(found) == {(owner, ONE), ("carl_7", ONE)} and result.skipped == []
    assert found[owner, ONE].notebook is not None  # graded as Eve's (its metadata names the assignment)


def test_a_canvas_name_inside_a_folder_is_canvas_only_when_every_member_shares_that_folder(tmp_path):
    found, result = unpacked(tmp_path, [(f"eve_5_6_x/bob_999_1_{A.notebook}", NOTEBOOK),
                                        (f"carl_7_8_{A.notebook}", NOTEBOOK)])
    assert set(found) == {("carl_7", ONE)}
    assert result.skipped == [f"eve_5_6_x/bob_999_1_{A.notebook} (fits no known layout)"]
    windows = member(f"canvas\\ann_1_2_{A.notebook}")
    windows.create_system = 0
    found, result = unpacked(_mkdir(tmp_path / "wrapped"), [(f"canvas/carl_7_8_{A.notebook}", NOTEBOOK), (windows, NOTEBOOK)])
    assert set(found) == {("ann_1", ONE), ("carl_7", ONE)} and result.skipped == []


def test_a_zip_student_with_no_safe_name_gets_the_refused_row_folder_collection_gives(tmp_path):
    found, result = unpacked(tmp_path, [(f"张伟/{ONE}/{A.notebook}", NOTEBOOK), (f"ann/{ONE}/{A.notebook}", NOTEBOOK)])
    folder = tmp_path / "folders" / "张伟" / ONE
    folder.mkdir(parents=True)
    (folder / A.notebook).write_text(NOTEBOOK)
    [by_folder] = collect(tmp_path / "folders", assignments())
    assert by_folder.student.startswith("unsafe-name~") and by_folder.problem.kind == NoteKind.REFUSED
    assert set(found) == {("ann", ONE), (by_folder.student, "?")}
    assert found[by_folder.student, "?"].problem.kind == NoteKind.REFUSED and "张伟" in found[by_folder.student, "?"].problem.text
    assert len(result.skipped) == 1 and "the row unsafe-name~" in result.skipped[0]
    alone = unpack_zip(build(tmp_path / "one.zip", [(f"李娜/{ONE}/{A.notebook}", NOTEBOOK)]), tmp_path / "one", assignments())
    assert [s.problem.kind for s in collect(alone.root, assignments())] == [NoteKind.REFUSED]  # a row, not "no hand-in"


def _mkdir(path):
    path.mkdir()
    return path


def share(copy, original=None):
    from test_similarity import ORIGINAL

    found = similarity([{"student": s, "assignment": ONE, "answers": a}
                        for s, a in {"p": original or ORIGINAL, "q": copy}.items()])["assignments"][ONE]["pairs"]
    return found[0]["similarity"] if found else 0.0


@pytest.mark.parametrize("line", ["%env X=(", "!echo \\(", "!echo '", "%alias_magic -l q (", "x = (", "  )"])
@pytest.mark.parametrize("ipython", [True, False])
def test_a_line_that_does_not_tokenize_in_every_answer_cell_hides_no_copy(monkeypatch, line, ipython):
    from test_similarity import COPY, ORIGINAL

    if not ipython:  # where the report is made without IPython: the failing lines alone are dropped
        monkeypatch.setattr(similarity_module, "_transformer", lambda: None)
    padded = {cell: source.rstrip("\n") + f"\n{line}\n" for cell, source in COPY.items()}
    assert share(padded) >= SHARE
    assert share({cell: source.rstrip("\n") + f"\n{line}\n" for cell, source in ORIGINAL.items()}) >= 0.9


def test_answers_wrapped_in_exec_eval_or_compile_are_read_as_code():
    from test_similarity import COPY

    assert share({cell: f"exec({source!r})\n" for cell, source in COPY.items()}) >= SHARE
    assert share({cell: f"exec(compile({source!r}, 'x', 'exec'))\n" for cell, source in COPY.items()}) >= SHARE
    assert share({cell: f"exec(b{source!r})\n" for cell, source in COPY.items()}) >= SHARE


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
