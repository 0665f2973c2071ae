"""scripts/gpu_check.py runs the course's notebooks and reads the GPU figures from their outputs (issues 14.5, 37).

Its plan (the short check: the GPU-dependent solution notebooks; the full matrix), its budget arithmetic (the heavy
lane against the other lanes, sized by the CPU path's seconds) and its table file, written row by row. On this CPU
machine: the script says there is no GPU, runs the 'none' setting, prints and writes its table and the sizing from
its own times, and exits 0 (one notebook, to keep it short); its readers find the figures in outputs shaped as
notebooks 06 and 07 print them, and say "not found" instead of crashing when a line is missing.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
import time

import nbformat
import pytest
from conftest import PYTHON, REPO
from factories import notebook, read_only

from grader.course import assignments

sys.path.insert(0, str(REPO / "scripts"))
import gpu_check


def _notebook(tmp_path, *texts: str):
    """An executed notebook whose cells printed `texts`, one each."""
    nb = notebook(*(read_only(f"c{i}", "pass") for i in range(len(texts))))
    for cell, text in zip(nb.cells, texts):
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=text)]
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)
    return path


PRECISION = """bf16 on NVIDIA H200: native
TF32 on NVIDIA H200 (compute capability 9.0): present
  device |                      setting |  ms/step | peak above baseline | final loss | skipped steps
     cpu |                         fp32 |     3.10 |           n/a (CPU) |     0.9000 | 0
  cuda:0 |               fp32, TF32 off |     1.20 |         300.0 MiB |     0.8000 | 0
  cuda:0 |           fp32, TF32 matmuls |     0.60 |         300.0 MiB |     0.8001 | 0
  cuda:0 |   fp16 autocast + GradScaler |     0.40 |         200.0 MiB |     0.8002 | 1
"""
DDP = """torch 2.13.0; CUDA GPUs visible: 2; the demos use nccl with 2 processes
rank 0 trained on cuda:0 over nccl: largest difference from one CPU process 3e-08
rank 1 trained on cuda:1 over nccl: largest difference from one CPU process 3e-08
"""
FSDP = """26122 parameters, fp32 Adam, nccl. Prediction, bytes per rank: params 4Ψ = 104488, ...
                                           DDP  DDP, grads as bucket views                        FSDP
rank 0      params                      104488                      104488                       52244
rank 0       grads                      104488                      104488                       52244
rank 1      params                      104488                      104488                       52244
total on rank 0, DDP: 522440 bytes
total on rank 0, FSDP: 208976 bytes
largest difference between FSDP's gathered parameters and DDP's after training: 1.2e-07 (the same training)
"""


def test_figures_read_from_outputs(tmp_path):
    lines = gpu_check.figures_06(_notebook(tmp_path, PRECISION))
    assert lines[:2] == ["bf16 on NVIDIA H200: native", "TF32 on NVIDIA H200 (compute capability 9.0): present"]
    assert any("cuda:0" in line and "fp32, TF32 matmuls" in line and "0.60" in line for line in lines)
    assert not any("not found" in line for line in lines)
    lines = gpu_check.figures_07(_notebook(tmp_path, DDP, FSDP))
    text = "\n".join(lines)
    assert "DDP demos: nccl with 2 processes" in text
    assert "ddp_train rank 1 on cuda:1 over nccl: max |param diff| vs one process 3e-08" in text
    assert "FSDP bytes on rank 0: params 52244, grads 52244" in text and "total bytes on rank 0, FSDP: 208976" in text
    assert "FSDP vs DDP final parameters, max |diff|: 1.2e-07" in text


def test_figures_missing_say_not_found(tmp_path):
    empty = _notebook(tmp_path, "nothing here\n")
    assert sum("not found" in line for line in gpu_check.figures_06(empty)) == 3
    assert sum("not found" in line for line in gpu_check.figures_07(empty)) == 4
    assert gpu_check.figures_06(tmp_path / "missing.ipynb")[-1] == "precision table: not found"


@pytest.mark.slow
def test_runs_a_notebook_and_writes_the_table_on_a_cpu(tmp_path):
    table = tmp_path / "table.md"
    run = subprocess.run([PYTHON, "scripts/gpu_check.py", "--only", "01", "--out", str(tmp_path), "--table", str(table)],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "No CUDA device is visible" in run.stdout and "Running the 'none' setting only" in run.stdout
    rows = [line.split(" | ") for line in run.stdout.splitlines() if line.startswith("| solution")]
    assert [row[:3] for row in rows] == [["| solution 01_gradient_descent", "none", "ran"]], run.stdout
    seconds = float(rows[0][3])
    # the CPU path prints its own per-run time, and sizes the plan from it as from CPU_SECONDS
    assert f"sizing from this check's runs: 01 {seconds:.0f} s" in run.stdout
    assert "sizing from CPU_SECONDS: 01 " in run.stdout and "1 of 1 runs ran to the end" in run.stdout
    written = table.read_text()
    assert " | ".join(rows[0]) in written and written.rstrip().endswith(run.stdout.rstrip().splitlines()[-1])
    assert (tmp_path / "none" / "solution-01_gradient_descent.ipynb").exists()
    assert json.loads((tmp_path / "results.json").read_text())["runs"][0]["status"] == "ran"


# ---- the plan, its budget, the table file -----------------------------------------------------------------

def _asks_for_a_gpu(assignment) -> bool:
    """Read from the raw notebook: a code cell that mentions cuda or nccl (the plan reads it with nbformat)."""
    cells = json.loads(assignment.source.read_text())["cells"]
    return any(c["cell_type"] == "code" and ("cuda" in "".join(c["source"]).lower() or "nccl" in "".join(c["source"]))
               for c in cells)


def test_the_short_plan_runs_the_gpu_dependent_solution_notebooks_once():
    runs = gpu_check.plan(1)
    names = [r.name for r in runs]
    assert {(r.kind, r.setting) for r in runs} == {("solution", "all")} and len(set(names)) == len(names)
    assert names[:2] == ["06_mixed_precision", "07_distributed"] and all(not r.heavy for r in runs[2:])
    assert {a.name for a in assignments() if _asks_for_a_gpu(a)} == set(names)
    assert {r.setting for r in gpu_check.plan(0)} == {"none"} and [r.name for r in gpu_check.plan(0, only=["01"])] == [
        "01_gradient_descent"]


@pytest.mark.parametrize("gpus, settings", [(0, {"none"}), (1, {"all", "none"}), (2, {"all", "one", "none"})])
def test_the_full_matrix_keeps_both_copies_under_every_setting(gpus, settings):
    runs = gpu_check.plan(gpus, full=True)
    assert {r.setting for r in runs} == settings
    assert len(runs) == len(set(runs)) == len(assignments()) * 2 * len(settings)


def test_the_estimate_runs_the_heavy_lane_beside_the_others_longest_first():
    seconds = {"06_a": 100.0, "07_b": 120.0, "00_c": 50.0, "02_d": 40.0, "05_e": 30.0, "01_f": 20.0}
    runs = [gpu_check.Planned("solution", name, "all") for name in seconds]
    assert [r.heavy for r in runs] == [True, True, False, False, False, False]
    # two lanes: 50 | 40, then 30 joins the 40 (70), 20 the 50 (70)
    assert gpu_check.estimate(runs, 2, seconds) == (220.0, 70.0, 220.0)
    assert gpu_check.estimate(runs, 1, seconds) == (220.0, 140.0, 220.0)
    assert gpu_check.estimate(runs[2:], 2, seconds) == (0.0, 70.0, 70.0)
    assert gpu_check.estimate(runs[:2] + runs[2:3], 1, {**seconds, "06_a": 1.0, "07_b": 2.0}) == (3.0, 50.0, 50.0)


def test_the_short_plan_fits_its_share_of_the_limit_by_the_cpu_paths_seconds():
    runs = gpu_check.plan(1)
    assert {r.name for r in runs} <= set(gpu_check.CPU_SECONDS), "a planned notebook has no measured CPU time"
    _, _, wall = gpu_check.estimate(runs, 1, gpu_check.CPU_SECONDS)  # one lane beside the heavy one: the worst case
    assert wall <= gpu_check.HEADROOM * gpu_check.LIMIT_S
    line = gpu_check.sizing(runs, 1, gpu_check.LIMIT_S, False, gpu_check.CPU_SECONDS, "CPU_SECONDS")
    assert f"estimate {wall:.0f} s, within {gpu_check.HEADROOM * gpu_check.LIMIT_S:.0f} s" in line
    over = gpu_check.sizing(runs, 1, wall, False, gpu_check.CPU_SECONDS, "CPU_SECONDS")
    assert f"OVER {gpu_check.HEADROOM * wall:.0f} s" in over


def test_a_run_that_cannot_end_before_the_limit_does_not_start(tmp_path):
    planned = gpu_check.Planned("solution", "06_mixed_precision", "none")
    run = gpu_check.run_in_child(planned, tmp_path, tmp_path, deadline=time.monotonic() + 1)
    assert run.status == "not run" and run.expected == gpu_check.CPU_SECONDS["06_mixed_precision"]
    assert run.first_failure.startswith(f"expected {run.expected:.0f} s") and not list(tmp_path.iterdir())


def test_the_table_file_holds_each_row_as_soon_as_it_is_added(tmp_path):
    table = gpu_check.TableFile(tmp_path / "gpu.md", "# GPU check")
    ran = gpu_check.Run("solution 06_mixed_precision", "all", "ran", "", 61.4, 14.0)
    failed = gpu_check.Run("solution 07_distributed", "all", "failed", "cell 18 (demo_ddp_gpu): LaunchError: a|b", 70.0, 17.0)
    table.add(gpu_check.table_row(ran))
    assert table.path.read_text().splitlines() == [
        "# GPU check", "", *gpu_check.TABLE_HEAD.splitlines(), "| solution 06_mixed_precision | all | ran | 61 | 14 |  |"]
    table.add(gpu_check.table_row(failed))  # a check cut off after this keeps both rows
    assert table.path.read_text().splitlines()[-1] == (
        "| solution 07_distributed | all | failed @cell 18 | 70 | 17 | cell 18 (demo_ddp_gpu): LaunchError: a\\|b |")


def test_the_table_is_named_after_the_device_and_the_day(tmp_path, monkeypatch):
    day = datetime.date(2026, 1, 2)
    assert gpu_check.table_path("cpu", tmp_path, 0, day) == tmp_path / "cpu-2026-01-02.md"
    monkeypatch.setattr(gpu_check, "REPO", tmp_path)
    first = gpu_check.table_path("NVIDIA H100 80GB HBM3", tmp_path, 1, day)
    assert first == tmp_path / "benchmarks" / "gpu-nvidia-h100-80gb-hbm3-2026-01-02.md"
    first.parent.mkdir()
    first.write_text("an earlier check that day")
    assert gpu_check.table_path("NVIDIA H100 80GB HBM3", tmp_path, 1, day).name == "gpu-nvidia-h100-80gb-hbm3-2026-01-02-2.md"


def test_compile_deep_dive_is_opt_in_with_a_longer_cell_timeout(monkeypatch):
    monkeypatch.delenv("TML_COMPILE", raising=False)
    assert gpu_check.cell_timeout() == gpu_check.CELL_TIMEOUT_S
    monkeypatch.setenv("TML_COMPILE", "1")  # what --compile sets for every child and kernel
    assert gpu_check.cell_timeout() == gpu_check.COMPILE_CELL_TIMEOUT_S > gpu_check.CELL_TIMEOUT_S
