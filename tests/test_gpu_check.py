"""scripts/gpu_check.py runs the course's notebooks and reads the GPU figures from their outputs (issue 14.5).

On this CPU machine: the script says there is no GPU, runs the 'none' setting, prints its table and exits 0
(one notebook, to keep it short); its readers find the figures in outputs shaped as notebooks 06 and 07
print them, and say "not found" instead of crashing when a line is missing.
"""

from __future__ import annotations

import subprocess
import sys

import nbformat
import pytest
from conftest import PYTHON, REPO
from factories import notebook, read_only

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
def test_runs_a_notebook_and_prints_the_table_on_a_cpu(tmp_path):
    run = subprocess.run([PYTHON, "scripts/gpu_check.py", "--only", "01", "--out", str(tmp_path)], cwd=REPO,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "No CUDA device is visible" in run.stdout and "Running the 'none' setting only" in run.stdout
    rows = [line.split() for line in run.stdout.split("\nnotebook", 1)[1].splitlines()[1:3]]
    assert [row[:3] for row in rows] == [["solution", "01_gradient_descent", "ran"],
                                         ["released", "01_gradient_descent", "ran"]], run.stdout
    assert "2 of 2 runs ran to the end" in run.stdout
    assert (tmp_path / "none" / "released-01_gradient_descent.ipynb").exists()


def test_compile_deep_dive_is_opt_in_with_a_longer_cell_timeout(monkeypatch):
    monkeypatch.delenv("TML_COMPILE", raising=False)
    assert gpu_check.cell_timeout() == gpu_check.CELL_TIMEOUT_S
    monkeypatch.setenv("TML_COMPILE", "1")  # what --compile sets for every child and kernel
    assert gpu_check.cell_timeout() == gpu_check.COMPILE_CELL_TIMEOUT_S > gpu_check.CELL_TIMEOUT_S
