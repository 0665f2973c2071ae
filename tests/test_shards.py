"""Classes beyond one machine: `autograde --shard K/N` splits a class by student, `grader merge` joins the shards into
exactly what a single run writes (issue 16 item 6)."""

import filecmp
import html
import json
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from conftest import PYTHON, REPO, autograde
from instructor_class import ONE, A

from grader.author.mutants import blank_submission, load_mutants, mutant_submission, reference_submission
from grader.author.selftest import put
from grader.batch.shards import ShardError, check_shards, parse_shard, shard_of

TIMEOUT = "10"


def test_a_shard_spec_is_k_of_n():
    assert parse_shard("2/8") == (2, 8) and parse_shard(" 1/1 ") == (1, 1)
    for bad in ("0/3", "4/3", "3", "a/b", "1/0", "-1/3"):
        with pytest.raises(ShardError, match="write K/N"):
            parse_shard(bad)


def test_the_partition_depends_only_on_the_student_key():
    # Literal values: the split must not change between machines, runs or Python versions (sha256, not hash()).
    assert [shard_of(s, 3) for s in ("alice", "bob", "ref-a_1001", "jdoe@uni.example", "Zoë")] == [3, 3, 3, 2, 3]
    assert [shard_of(s, 8) for s in ("alice", "bob", "ref-a_1001", "jdoe@uni.example", "Zoë")] == [8, 3, 4, 8, 1]
    sizes = Counter(shard_of(f"student{i:04d}", 4) for i in range(2000))
    assert sorted(sizes) == [1, 2, 3, 4] and min(sizes.values()) > 450  # every shard gets about a quarter


def manifest(folder: Path, shard: int, of: int, students=(), digest="abc", results=True):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "shard.json").write_text(json.dumps({"shard": shard, "of": of, "class": digest, "students": list(students)}))
    if results:
        (folder / "results.json").write_text("[]")
    return folder


@pytest.mark.parametrize("shards, says", [
    ([(1, 3), (2, 3)], "shard(s) 3/3 missing: merge needs all 3"),
    ([(1, 2), (1, 2)], "shard 1/2 given twice"),
    ([(1, 2), (2, 3)], "different splits"),
])
def test_merge_refuses_an_incomplete_or_mixed_set_of_shards(tmp_path, shards, says):
    folders = [manifest(tmp_path / f"s{i}", k, n) for i, (k, n) in enumerate(shards)]
    with pytest.raises(ShardError, match=says.replace("(", r"\(").replace(")", r"\)")):
        check_shards(folders)


def test_merge_refuses_shards_of_different_classes_and_unfinished_shards(tmp_path):
    with pytest.raises(ShardError, match="saw different classes"):
        check_shards([manifest(tmp_path / "a", 1, 2, digest="x"), manifest(tmp_path / "b", 2, 2, digest="y")])
    with pytest.raises(ShardError, match="has no results.json — did its run finish"):
        check_shards([manifest(tmp_path / "c", 1, 2), manifest(tmp_path / "d", 2, 2, results=False)])
    with pytest.raises(ShardError, match="no shard.json"):
        check_shards([tmp_path / "nowhere"])


# --- slow: three shards side by side against one run -------------------------------------------------------------

CONFIG = f"""
feedback = "at-once"
[due]
{ONE} = "2030-01-15 23:59"
[late]
per_day = 10
"""


def small_class(root: Path) -> dict[str, int]:
    """Nine students spread over three shards: reference, blank, known mistakes, a late one, an empty folder."""
    mutants = {m.name: m for m in load_mutants(A)}
    hand_ins = {"ref-a_1": reference_submission(A), "ref-b_2": reference_submission(A), "blank_3": blank_submission(A),
                "factor2_4": mutant_submission(A, [mutants["mse_grad_missing_factor_2"]]),
                "ascends_5": mutant_submission(A, [mutants["gradient_descent_ascends"]]),
                "lambda-min_6": mutant_submission(A, [mutants["critical_lr_lambda_min"]]),
                "late_7": mutant_submission(A, [mutants["numerical_grad_moves_w"]]),
                "honest_9": reference_submission(A)}
    for student, nb in hand_ins.items():
        path = put(root, student, A, nb)
        (path.parent / "timestamp.txt").write_text("2030-01-17 08:00:00" if student == "late_7" else "2030-01-15 12:00:00")
    (root / "nothing_8").mkdir()
    return {s: shard_of(s, 3) for s in [*hand_ins, "nothing_8"]}


def tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


@pytest.mark.slow
def test_three_shards_side_by_side_merge_into_exactly_the_single_run(tmp_path):
    split = small_class(tmp_path / "class")
    assert sorted(set(split.values())) == [1, 2, 3]  # every shard has students
    config = tmp_path / "grading.toml"
    config.write_text(CONFIG)
    common = ["--timeout", TIMEOUT, "--config", str(config)]
    autograde(tmp_path / "class", tmp_path / "single", *common)
    runs = [subprocess.Popen([PYTHON, "-m", "grader", "autograde", str(tmp_path / "class"), "--out",
                              str(tmp_path / "shards" / str(k)), "--shard", f"{k}/3", "--jobs", "1", *common],
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for k in (1, 2, 3)]
    for run in runs:
        output, _ = run.communicate(timeout=900)
        assert run.returncode == 0, output
    shards = [tmp_path / "shards" / str(k) for k in (1, 2, 3)]
    for k, folder in enumerate(shards, 1):
        assert json.loads((folder / "shard.json").read_text())["students"] == sorted(s for s, n in split.items() if n == k)
    incomplete = subprocess.run([PYTHON, "-m", "grader", "merge", str(tmp_path / "bad"), *map(str, shards[:2])],
                                cwd=REPO, capture_output=True, text=True)
    assert incomplete.returncode == 2 and "shard(s) 3/3 missing" in incomplete.stderr
    merged = tmp_path / "merged"
    run = subprocess.run([PYTHON, "-m", "grader", "merge", str(merged), *map(str, shards)], cwd=REPO,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    single = tmp_path / "single"
    # grades.csv and the report byte for byte; the feedback tree file for file.
    assert (merged / "grades.csv").read_bytes() == (single / "grades.csv").read_bytes()
    for name in ("report.html", "report.json"):
        assert (merged / "report" / name).read_bytes() == (single / "report" / name).read_bytes(), name
    assert tree(merged / "feedback") == tree(single / "feedback") and len(tree(single / "feedback")) == 8
    _, mismatch, errors = filecmp.cmpfiles(merged / "feedback", single / "feedback", tree(single / "feedback"),
                                           shallow=False)
    assert mismatch == [] and errors == []
    # results.json too, but for the seconds each hand-in took.
    def timeless(folder):
        return [{k: v for k, v in r.items() if k != "seconds"} for r in json.loads((folder / "results.json").read_text())]
    assert timeless(merged) == timeless(single)
    # The config's feedback mode reached every page: points only, nothing the hidden tests found.
    late = next(r for r in timeless(single) if r["student"] == "late_7")
    assert late["penalty"] == 1.6 and late["lateness"]["late_by"] == 32.02  # 8 earned, 2 started days × 10 %
    page = html.unescape((single / "feedback" / "late_7" / ONE / f"{ONE}.html").read_text())
    assert late["messages"]["numerical_grad"][:40] not in page and "shown after the release" in page
