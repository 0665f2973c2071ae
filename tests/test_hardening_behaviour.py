"""Issue 36 items 7 and 5: behaviour checks see the ways a hostile hand-in got past them; odd values get plain verdicts.

The attacks, each as the review ran it: autograd in a thread pool started before the test (`mse_grad`), torch's
`clip_grad_norm_` in a thread started during the call (`clip_by_global_norm`), `torch.finfo` held in a dict
(`smallest_subnormal`), `torch.ops.aten._amp_update_scale_` (`DynamicLossScaler`), `builtins.all` rebound while a
hidden test runs (a property check). Each is now counted (labkit.scenario: code swapped process-wide, ops watched in
torch's dispatcher, C types swapped inside containers, the scenario's builtins copied before any student code).
Item 5: a float32 answer for float64 inputs fails the hidden test as it fails the visible one; a 401-digit return
value is a wrong value, not interference. Fast tests run in process; the integration ones grade notebook 01.
"""

import _thread
import builtins
import concurrent.futures
import contextlib
import functools
import json
import threading

import nbformat
import pytest
import torch
import torch.nn.utils.clip_grad as clip_module

from grader.author.mutants import reference_submission
from grader.course import assignment_named
from grader.judge.judge import compare, decode_messages, decode_value
from grader.judge.rebuild import rebuild
from grader.kernel import probe
from labkit.scenario import autograd_guard, watch_calls

X, y, w = torch.randn(6, 2, dtype=torch.float64), torch.randn(6, dtype=torch.float64), torch.randn(2, dtype=torch.float64)
POOL = concurrent.futures.ThreadPoolExecutor(2)
POOL.submit(lambda: None).result()  # its threads run before any guard starts


def mse_grad_in_the_pool(w, X, y):
    def work():
        v = w.detach().clone().requires_grad_(True)
        ((X @ v - y) ** 2).mean().backward()
        return v.grad
    return POOL.submit(work).result()


def test_autograd_in_a_thread_pool_started_before_the_test_is_counted():
    with autograd_guard() as guard:
        got = mse_grad_in_the_pool(w, X, y)
    assert guard.calls > 0 and torch.allclose(got, 2 / 6 * X.T @ (X @ w - y))
    with autograd_guard() as guard:
        POOL.submit(lambda: 2 / 6 * X.T @ (X @ w - y)).result()  # closed form in the pool: nothing
    assert guard.calls == 0 and not torch.is_anomaly_enabled()


def clipping_functions():
    """What 05's hidden test watches: every function of torch's clipping module."""
    return [v for v in vars(clip_module).values()
            if getattr(getattr(v, "__code__", None), "co_filename", None) == clip_module.__file__]


@pytest.mark.parametrize("start", ["_thread", "threading"])
def test_clip_grad_norm_in_a_thread_started_during_the_call_is_counted(start):
    def clip_by_global_norm(grads, max_norm):
        done, out = threading.Event(), []

        def run():
            params = [torch.nn.Parameter(g.clone()) for g in grads]
            for p, g in zip(params, grads):
                p.grad = g.clone()
            out.append(([p.grad for p in params], torch.nn.utils.clip_grad_norm_(params, max_norm)))
            done.set()
        if start == "_thread":
            _thread.start_new_thread(run, ())
        else:
            threading.Thread(target=run).start()
        done.wait()
        return out[0]

    kept = torch.nn.utils.clip_grad_norm_
    with watch_calls(*clipping_functions()) as seen:
        clip_by_global_norm([torch.randn(3)], 0.1)
    assert seen.calls > 0
    assert torch.nn.utils.clip_grad_norm_ is kept and kept.__code__.co_filename == clip_module.__file__


FINFO_TABLE = {"finfo": torch.finfo}
HOLDER = type("Holder", (), {})()
HOLDER.finfo = torch.finfo
HOLDERS = {
    "a dict": lambda dt: FINFO_TABLE["finfo"](dt),
    "a list": lambda dt, held=[torch.finfo]: held[0](dt),
    "a tuple": lambda dt, held=(torch.finfo,): held[0](dt),
    "an object": lambda dt: HOLDER.finfo(dt),
}


@pytest.mark.parametrize("holder", HOLDERS)
def test_finfo_held_in_a_container_is_counted_and_put_back(holder):
    smallest_subnormal = HOLDERS[holder]
    with watch_calls(torch.finfo) as seen:
        smallest_subnormal(torch.float32)
    assert seen.calls == 1
    assert FINFO_TABLE["finfo"] is torch.finfo and type(torch.finfo(torch.float32)).__name__ == "finfo"


class DynamicLossScalerOnTheOp:
    """The attack: GradScaler's update op reached through torch.ops, not GradScaler."""

    def __init__(self):
        self.scale_t, self.tracker = torch.full((), 65536.0), torch.zeros((), dtype=torch.int32)

    def update(self, found_inf):
        torch.ops.aten._amp_update_scale_(self.scale_t, self.tracker, torch.full((), float(found_inf)), 2.0, 0.5, 2000)
        return found_inf


def test_the_amp_update_op_through_torch_ops_is_counted_from_any_thread():
    ops = (torch.ops.aten._amp_update_scale_, torch.ops.aten._amp_foreach_non_finite_check_and_unscale_)
    with watch_calls(*ops) as seen:
        DynamicLossScalerOnTheOp().update(True)
        threading.Thread(target=DynamicLossScalerOnTheOp().update, args=(False,)).start()
        POOL.submit(lambda: torch._amp_update_scale_(*vars(DynamicLossScalerOnTheOp()).values(), torch.zeros(()),
                                                     2.0, 0.5, 1)).result()
    assert seen.calls >= 2  # the thread's may come after the block ends
    before = seen.calls
    DynamicLossScalerOnTheOp().update(True)  # the watch is gone afterwards
    assert seen.calls == before


SCENARIO = """\
grads = [1.0, 2.0]
out = clip(grads)
observe("input left untouched", all(g == h for g, h in zip(grads, [1.0, 2.0])))
"""
STEERING = ("import builtins\n"
            "def clip(grads):\n"
            "    grads[0] = 0.0\n"
            "    builtins.all = lambda items: True  # steers the test's property check\n"
            "    return grads\n")


def test_builtins_rebound_during_a_hidden_test_do_not_steer_its_checks(monkeypatch):
    published: list[dict] = []
    monkeypatch.setattr(probe, "publish", lambda message: published.append(json.loads(json.dumps(message))))
    monkeypatch.setattr(builtins, "all", builtins.all)  # put back after the test
    recorder = probe.Recorder("clip")
    user_ns: dict = {}
    exec(STEERING, user_ns)
    probe._scenario(user_ns, "clip", SCENARIO, ("clip",), "", (), recorder)
    recorder.end(None)
    record = decode_messages(published, "clip")
    assert [(o.name, o.value) for o in record.observed] == [("input left untouched", False)]


def test_a_huge_integer_is_a_wrong_value_not_interference():
    for digits in (401, 4300):
        value = decode_value(probe.encode(10 ** (digits - 1)))
        assert compare(value, 0.25, "critical_lr", {}) == f"critical_lr: expected 0.25, got 1e+{digits - 1}."
    beyond = decode_value({"t": "int", "v": "9" * 5000})
    assert compare(beyond, 0.25, "critical_lr", {}) == ("critical_lr should be a number, got an integer of more than "
                                                        "4300 digits.")


ONE = assignment_named("01_gradient_descent")


def _graded(answers: dict[str, str]):
    from grader.judge.grading import grade_notebook, plain_kernel_factory, reference_records

    nb, _ = rebuild(reference_submission(ONE), nbformat.read(ONE.release, as_version=4))
    for grade_id, source in answers.items():
        at = next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)
        nb.cells[at].source = source
    return grade_notebook(nb, ONE, plain_kernel_factory(), 60, reference_records(ONE, plain_kernel_factory(), 120))


@pytest.mark.integration  # grades notebook 01 in a kernel
def test_graded_the_pool_attack_and_a_huge_integer_get_honest_verdicts():
    from grader.judge.grading import run_notes

    pool = ("import concurrent.futures\n_pool = concurrent.futures.ThreadPoolExecutor(2)\n_pool.submit(int).result()\n\n"
            "def mse_grad(w, X, y):\n    def work():\n        v = w.detach().clone().requires_grad_(True)\n"
            "        ((X @ v - y) ** 2).mean().backward()\n        return v.grad\n    return _pool.submit(work).result()\n")
    graded = _graded({"mse_grad_answer": pool, "critical_lr_answer": "def critical_lr(X):\n    return 10 ** 400\n"})
    assert not graded.verdicts["mse_grad"].passed and "autograd" in graded.verdicts["mse_grad"].message
    assert graded.verdicts["critical_lr"].message.endswith("got 1e+400."), graded.verdicts["critical_lr"].message
    assert not [n for n in run_notes(graded) if "interference" in n.text]
    assert graded.verdicts["numerical_grad"].passed and graded.verdicts["gradient_descent"].passed


@pytest.mark.integration  # grades notebook 01 in a kernel
def test_graded_a_float32_answer_for_float64_inputs_fails_as_the_visible_test_does():
    float32 = ("def mse_grad(w, X, y):\n    X, w, y = X.float(), w.float(), y.float()\n"
               "    return (2.0 / X.shape[0]) * X.T @ (X @ w - y)\n")
    graded = _graded({"mse_grad_answer": float32})
    assert "should return a float64 tensor" in graded.verdicts["mse_grad"].message


@pytest.mark.integration  # grades notebook 01 in a kernel
def test_graded_a_compiled_answer_runs_eagerly_in_the_hidden_tests_and_keeps_its_points():
    from grader.judge.grading import run_notes

    compiled = ("import torch\n\n@torch.compile\ndef mse_grad(w, X, y):\n"
                "    return (2.0 / X.shape[0]) * X.T @ (X @ w - y)\n")
    graded = _graded({"mse_grad_answer": compiled})
    assert graded.verdicts["mse_grad"].passed, graded.verdicts["mse_grad"].message
    assert not [n for n in run_notes(graded) if "timeout" in n.text]


class _ReadLater(torch.Tensor):
    """Deferred work: the answer is computed (with autograd) when someone reads it, after the watch ended."""

    ran: list = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.ran.append(func)
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


class _FakeFloat:
    ran: list = []

    @property
    def __class__(self):
        self.ran.append("__class__")
        return float

    def __float__(self):
        self.ran.append("__float__")
        return 0.25


def test_encoding_an_observed_value_never_runs_the_students_code():
    ran: list[str] = []

    class F(float):
        def __float__(self):
            ran.append("float")
            return 0.0

        def __repr__(self):
            ran.append("repr")
            return "0.0"

    class Big(int):
        def __int__(self):
            ran.append("int")
            return 0

    class L(list):
        def __iter__(self):
            ran.append("iter")
            return iter(())

        def __len__(self):
            ran.append("len")
            return 0

    class D(dict):
        def items(self):
            ran.append("items")
            return []

    later = torch.Tensor._make_subclass(_ReadLater, torch.arange(3.0))
    _ReadLater.ran.clear()
    encoded = [probe.encode(v) for v in (F(2.5), Big(7), L([1, 2]), D(a=1), _FakeFloat(), later)]
    assert ran == [] and _ReadLater.ran == [] and _FakeFloat.ran == []
    decoded = [decode_value(e) for e in encoded]
    assert decoded[:4] == [2.5, 7, [1, 2], {"a": 1}]
    assert str(decoded[4]) == "an object of another type" or "another type" in repr(decoded[4])
    assert torch.equal(decoded[5], torch.arange(3.0))


@pytest.mark.parametrize(("value", "says"), [
    (lambda: torch.tensor([2.0]).to(torch.uint16), "a tensor of dtype uint16"),
    (lambda: torch.zeros(2).to(torch.float8_e4m3fn), "a tensor of dtype float8_e4m3fn"),
    (lambda: torch.empty((), device="meta"), "a tensor on the meta device"),
    (lambda: 10 ** 5000, "an integer of more than 4300 digits"),
])
def test_odd_values_get_plain_verdicts_not_interference(value, says):
    got = compare(decode_value(probe.encode(value())), 0.25, "critical_lr", {})
    assert got == f"critical_lr should be a number, got {says}."


def mse_grad_forward_mode_through_partials(w, X, y):
    """The attack: forward-mode AD with the C built-ins reached through functools.partial (C calls from C)."""
    level = functools.partial(torch._C._enter_dual_level)()
    try:
        out = []
        for i in range(w.shape[0]):
            d = functools.partial(torch._make_dual)(w, torch.eye(w.shape[0], dtype=w.dtype)[i], level=level)
            out.append(functools.partial(torch._unpack_dual)(((X @ d - y) ** 2).mean(), level=level)[1])
        return torch.stack(out)
    finally:
        functools.partial(torch._C._exit_dual_level)(level=level)


def test_forward_mode_ad_through_partials_is_counted_and_still_works():
    with autograd_guard() as guard:
        got = mse_grad_forward_mode_through_partials(w, X, y)
    assert guard.calls > 0 and torch.allclose(got, 2 / 6 * X.T @ (X @ w - y))
    assert torch.func.jvp(lambda v: (v ** 2).sum(), (w,), (w,))[1].item() == pytest.approx(2 * (w @ w).item())


class DynamicLossScalerFunctional(DynamicLossScalerOnTheOp):
    def update(self, found_inf):
        self.scale_t, self.tracker = torch.ops.aten._amp_update_scale(
            self.scale_t, self.tracker, torch.full((), float(found_inf)), 2.0, 0.5, 2000)
        return found_inf


@pytest.mark.parametrize("route", ["functional", "inference mode", "below autograd"])
def test_the_amp_update_op_is_counted_through_its_twin_and_below_autograd(route):
    ops = (torch.ops.aten._amp_update_scale_, torch.ops.aten._amp_foreach_non_finite_check_and_unscale_)
    scaler = DynamicLossScalerFunctional() if route == "functional" else DynamicLossScalerOnTheOp()
    mode = {"inference mode": torch.inference_mode, "below autograd": torch._C._AutoDispatchBelowAutograd}.get(
        route, contextlib.nullcontext)
    with watch_calls(*ops) as seen, mode():
        scaler.update(True)
    assert seen.calls > 0 and scaler.scale_t.item() == 32768.0


def smallest_subnormal_through_torch_c(dtype):
    """The attack: torch.finfo's own class reached as torch._C.finfo."""
    info = torch._C.finfo(dtype)
    return float(info.tiny * info.eps)


class _Gone:
    pass


def test_finfo_reached_through_torch_c_is_counted_and_dead_proxies_are_passed_over():
    import weakref

    gone = _Gone()
    DEAD["proxy"] = weakref.proxy(gone)
    del gone
    with watch_calls(torch.finfo) as seen:
        smallest_subnormal_through_torch_c(torch.float32)
    assert seen.calls == 1 and torch._C.finfo is torch.finfo


DEAD: dict = {}


def test_distributed_samplers_iter_bound_at_import_is_counted():
    from torch.utils.data.distributed import DistributedSampler

    sampler_iter = DistributedSampler.__iter__  # bound at import, as the attack did

    def shard_indices(n, rank, world_size):
        return list(sampler_iter(DistributedSampler(range(n), num_replicas=world_size, rank=rank, shuffle=False)))

    with watch_calls(DistributedSampler.__iter__) as seen:  # what 07's hidden test watches
        got = shard_indices(5, 1, 2)
    assert seen.calls == 1 and got == [1, 3, 0]


def test_numpys_own_finfo_calls_while_printing_are_not_the_students():
    import numpy

    def smallest_subnormal(dtype):
        print(numpy.array([0.5, 1e-40]))  # numpy's array printing asks numpy.finfo itself
        return 2.0 ** -149

    with watch_calls(torch.finfo, numpy.finfo) as seen:
        smallest_subnormal(torch.float32)
    assert seen.calls == 0
    with watch_calls(torch.finfo, numpy.finfo) as seen:
        numpy.finfo(numpy.float32)
    assert seen.calls == 1


@pytest.mark.parametrize("event", ["os.fork", "subprocess.Popen", "os.posix_spawn"])
def test_a_process_started_during_the_call_is_counted_and_none_after(event):
    import sys

    def mse_grad_elsewhere(w, X, y):
        sys.audit(event, None)  # what os.fork(), subprocess.Popen and os.posix_spawn raise before they start one
        return 2 / 6 * X.T @ (X @ w - y)

    with autograd_guard() as guard:
        mse_grad_elsewhere(w, X, y)
    assert guard.calls > 0
    sys.audit(event, None)  # no watch open: the hook does nothing
    with autograd_guard() as guard:
        2 / 6 * X.T @ (X @ w - y)
    assert guard.calls == 0


@pytest.mark.integration  # starts a process
def test_a_real_fork_during_the_call_is_counted():
    import os

    with autograd_guard() as guard:
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
    assert guard.calls > 0


class _OwnDispatch(torch.Tensor):
    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise AssertionError("ran the student's __torch_dispatch__")


def test_a_tensor_subclass_with_its_own_dispatch_is_another_type():
    value = torch.Tensor._make_wrapper_subclass(_OwnDispatch, (2,))
    got = compare(decode_value(probe.encode(value)), 0.25, "critical_lr", {})
    assert got == "critical_lr should be a number, got an object of another type."
