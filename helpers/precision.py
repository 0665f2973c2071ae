"""Timing done right on any device, and one fp32 / bf16 / fp16 autocast training run measured (notebook 06).

CUDA kernels run asynchronously: a Python timer around a CUDA call measures the launch, not the
work. `time_call` synchronises (CUDA events on a GPU, `perf_counter` on the CPU, where every call
is synchronous). `measure_precision` trains the same model for a few steps of a given AMP step
function (notebook 06's `amp_train_step`, the student's own) under one autocast dtype and reports
time per step, peak memory (CUDA only: torch has no allocator statistics for the CPU) and the final
loss; `scripts/gpu_check.py` and notebook 06 both build their tables with it. The timed region holds the steps
alone: the step returns its loss as a tensor (no `.item()`), the Adam is fused (GradScaler reads no inf flag on the
host), and skipped steps are counted afterwards from the optimizer's own step count. On a GPU the fp32 row
can be measured with TF32 matmuls off (true fp32) or on (`tf32=`), peak memory is counted above what was
allocated before the run, `bf16_support` says whether bf16 is native or emulated on the device, and
`tf32_support` whether the device has TF32 at all (a row that asked for it on a GPU without says so in its label).

For the loss-scaling exercises' visible checks: `gradscaler_scales` drives a real GradScaler through a pattern of
good and overflowing steps, `scale_trace_mistake` says where a hand-written scaler's trace first leaves it and what
that step shows, and `named_scaler_errors` turns GradScaler's own complaints into the mistake each one names.
"""

from __future__ import annotations

import contextlib
import math
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn as nn

from helpers.checks import CheckFailure


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


def bf16_support(device: torch.device) -> str:
    """"native", "emulated" or "not supported" for bf16 on a CUDA device; "cpu" for the CPU (notebook 06).

    `torch.cuda.is_bf16_supported()` also says True on GPUs that only emulate bf16 (e.g. a T4, compute
    capability 7.5): bf16 runs there, without tensor-core speed. Native bf16 needs compute capability 8.0+.
    """
    device = torch.device(device)
    if device.type != "cuda":
        return "cpu"
    if torch.cuda.get_device_capability(device) >= (8, 0):
        return "native"
    return "emulated" if torch.cuda.is_bf16_supported() else "not supported"


def tf32_support(device: torch.device) -> str:
    """"native" when a CUDA device has TF32 tensor cores, "absent" when it has not, "cpu" for the CPU (notebook 06).

    TF32 arrived with compute capability 8.0 (Ampere). Below it (a T4 is 7.5) `allow_tf32` is accepted and
    changes nothing: the matmuls stay true fp32.
    """
    device = torch.device(device)
    if device.type != "cuda":
        return "cpu"
    return "native" if torch.cuda.get_device_capability(device) >= (8, 0) else "absent"


@contextlib.contextmanager
def tf32_matmuls(enabled: bool) -> Iterator[None]:
    """Switch TF32 for CUDA matmuls and cuDNN convolutions on or off inside the block, then restore both (notebook 06)."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@contextlib.contextmanager
def single_thread() -> Iterator[None]:
    """Run the block on one CPU thread, then restore torch's thread count (notebook 06).

    Small steps spend more time starting and joining threads than computing, and on a CPU that other programs
    share, waiting threads stretch every tiny operation; one thread is faster there and gives steadier timings.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


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
    peak_mib: float | None  # peak allocated above baseline_mib; None on the CPU (no allocator statistics there)
    final_loss: float
    skipped_steps: int
    baseline_mib: float | None = None  # allocated on the device before the run (earlier tensors); None on the CPU


# amp_train_step(model, batch, loss_fn, optimizer, scaler, device, dtype) -> the loss, a detached 0-d tensor (notebook 06)
AmpStep = Callable[..., torch.Tensor]


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
    tf32: bool | None = None,
) -> PrecisionRow:
    """Train `make_mlp` for `steps` Adam steps of `train_step` under autocast(`dtype`) (None = fp32) and measure it (notebook 06).

    fp16 gets an enabled GradScaler (the scale guards against underflow); bf16 has fp32's exponent
    range and fp32 needs no scaling, so theirs is disabled. Parameters stay fp32 in every row. Nothing inside the
    timed steps waits for the device: the Adam is fused, so GradScaler hands it the inf flag on the device instead
    of reading it on the host, and a skipped step is counted after the timing, from the optimizer's step count.
    `tf32` (CUDA only) runs the row with TF32 matmuls switched on or off (None: leave the setting as it is).
    Peak memory is counted above what was already allocated on the device when the call began.
    """
    device = torch.device(device)
    if tf32 is not None and device.type != "cuda":
        raise ValueError("tf32= switches CUDA matmuls only; on the CPU leave it None")
    baseline = torch.cuda.memory_allocated(device) if device.type == "cuda" else None
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    with tf32_matmuls(tf32) if tf32 is not None else contextlib.nullcontext():
        return _measure(train_step, device, dtype, steps, batch, width, depth, seed, tf32, baseline)


def _measure(train_step: AmpStep, device: torch.device, dtype: torch.dtype | None, steps: int, batch: int, width: int,
             depth: int, seed: int, tf32: bool | None, baseline: int | None) -> PrecisionRow:
    model = make_mlp(width, depth, seed=seed).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
    gen = torch.Generator().manual_seed(seed + 1)
    X = torch.randn(batch, 64, generator=gen).to(device)
    y = torch.randint(0, 10, (batch,), generator=gen).to(device)
    loss_fn = nn.CrossEntropyLoss()
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    warmup = 2

    def step() -> torch.Tensor:
        with warnings.catch_warnings():
            # The fp32 row passes dtype=float32. CPU autocast accepts only bf16 and fp16 and switches itself off
            # with a warning, silenced here; CUDA autocast stays on with float32 as its low dtype, which casts nothing.
            warnings.filterwarnings("ignore", message=".*autocast.*")
            return train_step(model, (X, y), loss_fn, optimizer, scaler, device, dtype or torch.float32)

    seconds = time_call(step, device, repeats=steps, warmup=warmup)
    # fused Adam counts only the steps it took (a step with inf gradients is taken back); read after the timing
    stepped = int(optimizer.state[next(model.parameters())]["step"])
    peak = (torch.cuda.max_memory_allocated(device) - baseline) / 2**20 if baseline is not None else None
    with torch.no_grad():
        final = float(loss_fn(model(X).float(), y))
    label = {None: "fp32", torch.bfloat16: "bf16 autocast", torch.float16: "fp16 autocast + GradScaler"}[dtype]
    if dtype is None and tf32 is not None:
        label = "fp32, TF32 off" if not tf32 else (
            "fp32, TF32 matmuls" if tf32_support(device) == "native" else "fp32, TF32 asked, none here")
    return PrecisionRow(label, str(device), seconds * 1000.0, peak, final, warmup + steps - stepped,
                        baseline / 2**20 if baseline is not None else None)


def gradscaler_scales(flags: list[bool], **settings: float) -> list[float]:
    """The scale a real `torch.amp.GradScaler("cpu", **settings)` holds after each step; True in `flags` = an inf step
    (notebook 06)."""
    scaler = torch.amp.GradScaler("cpu", **settings)  # type: ignore[arg-type]
    weight = nn.Parameter(torch.zeros(1))
    sgd = torch.optim.SGD([weight], lr=0.0)
    scales = []
    for inf in flags:
        scaler.scale(torch.ones(()))  # GradScaler makes its scale tensor on first use
        weight.grad = torch.full((1,), float("inf") if inf else 1.0)
        scaler.step(sgd)
        scaler.update()
        scales.append(scaler.get_scale())
    return scales


def scale_trace_mistake(flags: list[bool], got: list[float], want: list[float], *, init_scale: float = 65536.0,
                        growth_factor: float = 2.0, backoff_factor: float = 0.5, growth_interval: int = 2000) -> str | None:
    """Where a loss-scale trace `got` first leaves GradScaler's `want`, and what that step says; None if they agree
    (notebook 06). `flags[i]` is True when step i + 1's gradients held an inf."""
    before = float(init_scale)
    for step, (inf, mine, right) in enumerate(zip(flags, got, want), start=1):
        if not math.isclose(mine, right, rel_tol=1e-9):
            kind = "an inf step (X)" if inf else "a good step (.)"
            where = f"at step {step}, {kind}, the scale went from {before:g} to {mine:g}; GradScaler's went to {right:g}"
            if inf and math.isclose(mine, before / backoff_factor, rel_tol=1e-9):
                why = ("that is a division by backoff_factor, so your scale grew on an overflow — what must an overflow "
                       "do to the scale, and what do you multiply by?")
            elif inf and math.isclose(mine, before * growth_factor * backoff_factor, rel_tol=1e-9):
                why = "yours backed off and grew on the same step: the overflowing step was counted as a good one"
            elif inf and mine >= before:
                why = "an overflow must make the scale smaller, and yours did not shrink"
            elif not inf and mine > before and math.isclose(right, before, rel_tol=1e-9):
                why = ("yours grew before GradScaler's: which steps count toward growth_interval, and when does that "
                       "count start again?")
            elif not inf and mine == before and right > before:
                why = ("GradScaler grew here and yours did not: which steps count toward growth_interval, and when does "
                       "that count start again?")
            else:
                why = ""
            return where + (f": {why}" if why else ".")
        before = right
    if len(got) != len(want):
        return f"expected one scale per step ({len(want)}), got {len(got)}."
    return None


# GradScaler's own errors (their text in torch/amp/grad_scaler.py), each the sign of one mistake in a training step.
SCALER_COMPLAINTS = {
    "step() has already been called since the last update()":
        "scaler.step(optimizer) ran again before any scaler.update(): without update() GradScaler refuses the next "
        "step — end every optimizer step with scaler.update(), once",
    "unscale_() has already been called on this optimizer since the last update()":
        "scaler.unscale_(optimizer) ran twice before scaler.update(): unscale once per optimizer step, after the last "
        "backward of that step, not once per micro batch",
    "unscale_() is being called after step()": "scaler.unscale_(optimizer) ran after scaler.step(optimizer): unscale first",
    "No inf checks were recorded for this optimizer":
        "scaler.step(optimizer) found no gradient to unscale (every .grad was None): the gradients were zeroed after "
        "the backward — zero them at the start of the step, before the backward",
    "No inf checks were recorded prior to update":
        "scaler.update() found no scaler.step(optimizer) before it: the optimizer was stepped directly — call "
        "scaler.step(optimizer) instead of optimizer.step(); it unscales, checks for inf/NaN and skips such a step",
    "but _scale is None":
        "GradScaler was asked to step before it ever scaled a loss: the backward must start from scaler.scale(loss)",
}


@contextlib.contextmanager
def named_scaler_errors(name: str) -> Iterator[None]:
    """Turn GradScaler's own complaints raised inside the block into a CheckFailure naming the mistake (notebook 06)."""
    try:
        yield
    except CheckFailure:
        raise
    except (AssertionError, RuntimeError) as error:  # GradScaler's own checks raise both
        advice = next((advice for text, advice in SCALER_COMPLAINTS.items() if text in str(error)), None)
        if advice is None:
            raise
        raise CheckFailure(f"{name}: GradScaler refused a call (\"{str(error).strip()}\") — {advice}.") from None
