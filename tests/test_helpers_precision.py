"""Tests for helpers.precision: timing on the CPU, the seeded MLP, one measured precision row per dtype, a timed
region without host syncs, skipped steps counted after it, and the GPU-only switches (TF32, bf16 support) as far as
the CPU can test them."""

from __future__ import annotations

import time

import pytest
import torch

import helpers.precision as precision
from grader.author.mutants import reference_function
from helpers.precision import (
    PrecisionRow,
    bf16_support,
    make_mlp,
    measure_precision,
    single_thread,
    synchronize,
    tf32_matmuls,
    tf32_support,
    time_call,
)

CPU = torch.device("cpu")
# the reference answer of notebook 06: helpers must not carry it (students receive helpers/)
amp_train_step = reference_function("06_mixed_precision", "amp_train_step_answer", "amp_train_step", {"torch": torch})


def test_synchronize_is_a_noop_on_cpu():
    synchronize(CPU)


def test_time_call_counts_calls_and_measures_sleep():
    calls = []

    def work():
        calls.append(1)
        time.sleep(0.01)

    seconds = time_call(work, CPU, repeats=3, warmup=2)
    assert len(calls) == 5
    assert 0.009 <= seconds < 0.5


def test_make_mlp_is_seeded_and_shaped():
    a, b = make_mlp(width=16, depth=3, d_in=4, d_out=2, seed=5), make_mlp(width=16, depth=3, d_in=4, d_out=2, seed=5)
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)
    assert a(torch.randn(7, 4)).shape == (7, 2)
    assert sum(isinstance(m, torch.nn.Linear) for m in a) == 4


@pytest.mark.parametrize("dtype", [None, torch.bfloat16, torch.float16])
def test_measure_precision_row_on_cpu(dtype):
    row = measure_precision(amp_train_step, CPU, dtype, steps=2, batch=16, width=16, depth=2)
    assert isinstance(row, PrecisionRow)
    assert row.device == "cpu" and row.peak_mib is None and row.baseline_mib is None
    assert row.ms_per_step > 0 and row.skipped_steps == 0
    assert torch.isfinite(torch.tensor(row.final_loss))
    assert row.label.startswith({None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype])


HOST_READS = ((torch.Tensor, "item"), (torch.Tensor, "tolist"), (torch.Tensor, "__float__"), (torch.Tensor, "__bool__"),
              (torch.amp.GradScaler, "get_scale"), (torch.amp.GradScaler, "_maybe_opt_step"), (torch.cuda, "synchronize"))


def _host_reads_while_timed(monkeypatch, train_step, dtype) -> list[str]:
    """The calls that read a device value on the host (on a GPU: wait for it) made inside `time_call`, by name.

    GradScaler._maybe_opt_step is where GradScaler.step reads the inf flag with .item() when the optimizer cannot
    take it on the device."""
    timing, seen = [False], []

    def counted(owner, name):
        real = getattr(owner, name)

        def call(*args, **kwargs):
            if timing[0]:
                seen.append(name)
            return real(*args, **kwargs)
        monkeypatch.setattr(owner, name, call)

    for owner, name in HOST_READS:
        counted(owner, name)
    real_time_call = precision.time_call

    def timed(*args, **kwargs):
        timing[0] = True
        try:
            return real_time_call(*args, **kwargs)
        finally:
            timing[0] = False
    monkeypatch.setattr(precision, "time_call", timed)
    precision.measure_precision(train_step, CPU, dtype, steps=3, batch=16, width=16, depth=2)
    return seen


@pytest.mark.parametrize("dtype", [None, torch.bfloat16, torch.float16])
def test_the_timed_region_holds_no_host_read(monkeypatch, dtype):
    assert _host_reads_while_timed(monkeypatch, amp_train_step, dtype) == []


def test_the_host_read_probe_sees_a_step_that_reads_its_loss(monkeypatch):
    def reads_loss(*args):
        return amp_train_step(*args).item()

    assert _host_reads_while_timed(monkeypatch, reads_loss, torch.float16) == ["item"] * 5  # 2 warm-up + 3 timed steps


def test_a_skipped_fp16_step_is_counted_after_the_timing():
    calls = []

    def first_batch_inf(model, batch, *rest):
        calls.append(1)
        X, y = batch
        return amp_train_step(model, (torch.full_like(X, float("inf")) if len(calls) == 1 else X, y), *rest)

    row = measure_precision(first_batch_inf, CPU, torch.float16, steps=3, batch=16, width=16, depth=2)
    assert len(calls) == 5 and row.skipped_steps == 1 and torch.isfinite(torch.tensor(row.final_loss))


def test_measure_precision_lowers_the_loss():
    start = measure_precision(amp_train_step, CPU, None, steps=1, batch=32, width=16, depth=2)
    longer = measure_precision(amp_train_step, CPU, None, steps=20, batch=32, width=16, depth=2)
    assert longer.final_loss < start.final_loss


def test_tf32_is_refused_on_cpu():
    with pytest.raises(ValueError, match="CUDA"):
        measure_precision(amp_train_step, CPU, None, tf32=True, steps=1, batch=8, width=8, depth=2)


def test_tf32_matmuls_switches_and_restores_both_flags():
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    for wanted in (True, False):
        with tf32_matmuls(wanted):
            assert torch.backends.cuda.matmul.allow_tf32 is wanted and torch.backends.cudnn.allow_tf32 is wanted
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == saved
    with pytest.raises(RuntimeError), tf32_matmuls(not saved[0]):
        raise RuntimeError("restored on errors too")
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == saved


def test_bf16_support_on_cpu():
    assert bf16_support(CPU) == "cpu"
    assert bf16_support("cpu") == "cpu"


@pytest.mark.parametrize("capability, says_supported, expected", [
    ((9, 0), True, "native"), ((8, 0), True, "native"), ((7, 5), True, "emulated"), ((6, 1), False, "not supported")])
def test_bf16_support_reads_the_compute_capability(monkeypatch, capability, says_supported, expected):
    # A T4 (7.5) answers is_bf16_supported() with True through emulation: only >= 8.0 is native.
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: says_supported)
    assert bf16_support(torch.device("cuda")) == expected


@pytest.mark.parametrize("capability, expected", [((9, 0), "native"), ((8, 0), "native"), ((7, 5), "absent")])
def test_tf32_support_reads_the_compute_capability(monkeypatch, capability, expected):
    # A T4 (7.5) accepts allow_tf32 and has no TF32 tensor cores: its "TF32" row is true fp32 again.
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert tf32_support(torch.device("cuda")) == expected
    assert tf32_support(CPU) == "cpu"


def test_single_thread_restores_the_thread_count():
    before = torch.get_num_threads()
    with single_thread():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError), single_thread():
        raise RuntimeError("restored on errors too")
    assert torch.get_num_threads() == before


def test_gradscaler_scales_backs_off_on_inf_and_grows_after_the_interval():
    assert precision.gradscaler_scales([False, False, True, False], init_scale=8.0, growth_interval=2) == [8.0, 16.0,
                                                                                                        8.0, 8.0]


def test_scale_trace_mistake_names_a_division_early_growth_and_agreement():
    flags = [False, True, False, False]
    settings = dict(init_scale=8.0, growth_interval=2)
    want = precision.gradscaler_scales(flags, **settings)
    assert precision.scale_trace_mistake(flags, want, want, **settings) is None
    divided = precision.scale_trace_mistake(flags, [8.0, 16.0, 16.0, 32.0], want, **settings)
    assert "step 2" in divided and "division by backoff_factor" in divided
    early = precision.scale_trace_mistake(flags, [8.0, 4.0, 8.0, 8.0], want, **settings)
    assert "step 3" in early and "grew before GradScaler's" in early
    late = precision.scale_trace_mistake([False, False], [8.0, 8.0], [8.0, 16.0], **settings)
    assert "did not" in late


@pytest.mark.parametrize("mistake, says", [("update", "end every optimizer step with scaler.update()"),
                                           ("optimizer.step", "instead of optimizer.step()"),
                                           ("unscale twice", "unscale once per optimizer step")])
def test_named_scaler_errors_names_gradscalers_complaints(mistake, says):
    weight = torch.nn.Parameter(torch.ones(2))
    sgd = torch.optim.SGD([weight], lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    with pytest.raises(precision.CheckFailure, match="GradScaler refused a call") as failure, \
            precision.named_scaler_errors("a step"):
        for _ in range(2):
            scaler.scale(weight.sum()).backward()
            if mistake == "optimizer.step":
                sgd.step()
                scaler.update()
            elif mistake == "unscale twice":
                scaler.unscale_(sgd)
            else:
                scaler.step(sgd)
    assert says in str(failure.value)


def test_named_scaler_errors_lets_other_errors_through():
    with pytest.raises(RuntimeError, match="unrelated"), precision.named_scaler_errors("a step"):
        raise RuntimeError("unrelated")
