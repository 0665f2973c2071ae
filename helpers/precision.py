"""Timing done right on any device, and one fp32 / bf16 / fp16 autocast training run measured (notebook 06).

CUDA kernels run asynchronously: a Python timer around a CUDA call measures the launch, not the
work. `time_call` synchronises (CUDA events on a GPU, `perf_counter` on the CPU, where every call
is synchronous). `measure_precision` trains the same model for a few steps of a given AMP step
function (notebook 06's `amp_train_step`, the student's own) under one autocast dtype and reports
time per step, peak memory (CUDA only: torch has no allocator statistics for the CPU) and the final
loss; `scripts/gpu_check.py` and notebook 06 both build their tables with it.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn


def synchronize(device: torch.device) -> None:
    """Wait for all queued work on `device` (a no-op on the CPU, where work is never queued) (notebook 06)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn: Callable[[], object], device: torch.device, *, repeats: int = 10, warmup: int = 2) -> float:
    """Seconds per call of `fn`, measured correctly: warm-up calls first, then CUDA events or perf_counter (notebook 06)."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000.0 / repeats
    began = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - began) / repeats


def make_mlp(width: int = 256, depth: int = 3, d_in: int = 64, d_out: int = 10, seed: int = 0) -> nn.Sequential:
    """A seeded ReLU MLP with LayerNorm, the model every precision measurement trains (notebook 06)."""
    torch.manual_seed(seed)
    layers: list[nn.Module] = [nn.Linear(d_in, width), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.LayerNorm(width), nn.ReLU()]
    layers.append(nn.Linear(width, d_out))
    return nn.Sequential(*layers)


@dataclass(frozen=True)
class PrecisionRow:
    """One row of the precision table: what was run and what was measured (notebook 06)."""

    label: str
    device: str
    ms_per_step: float
    peak_mib: float | None  # None on the CPU: torch keeps no allocator statistics there
    final_loss: float
    skipped_steps: int


# amp_train_step(model, batch, loss_fn, optimizer, scaler, device, dtype) -> loss (notebook 06's contract)
AmpStep = Callable[..., float]


def measure_precision(
    train_step: AmpStep,
    device: torch.device,
    dtype: torch.dtype | None,
    *,
    steps: int = 30,
    batch: int = 256,
    width: int = 256,
    depth: int = 3,
    seed: int = 0,
) -> PrecisionRow:
    """Train `make_mlp` for `steps` Adam steps of `train_step` under autocast(`dtype`) (None = fp32) and measure it (notebook 06).

    fp16 gets an enabled GradScaler (the scale guards against underflow); bf16 has fp32's exponent
    range and fp32 needs no scaling, so theirs is disabled. Parameters stay fp32 in every row.
    """
    model = make_mlp(width, depth, seed=seed).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(seed + 1)
    X = torch.randn(batch, 64, generator=gen).to(device)
    y = torch.randint(0, 10, (batch,), generator=gen).to(device)
    loss_fn = nn.CrossEntropyLoss()
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    skipped = 0

    def step() -> float:
        nonlocal skipped
        before = scaler.get_scale() if scaler.is_enabled() else 1.0
        with warnings.catch_warnings():
            # the fp32 row asks autocast for float32, which it switches off with a warning: wanted here
            warnings.filterwarnings("ignore", message=".*autocast.*")
            loss = train_step(model, (X, y), loss_fn, optimizer, scaler, device, dtype or torch.float32)
        if scaler.is_enabled() and scaler.get_scale() < before:
            skipped += 1
        return loss

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    seconds = time_call(step, device, repeats=steps, warmup=2)
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
    with torch.no_grad():
        final = float(loss_fn(model(X).float(), y))
    label = {None: "fp32", torch.bfloat16: "bf16 autocast", torch.float16: "fp16 autocast + GradScaler"}[dtype]
    return PrecisionRow(label, str(device), seconds * 1000.0, peak, final, skipped)
