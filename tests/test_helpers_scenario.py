"""labkit.scenario's behaviour checks count what they watch however it is reached; closed-form code counts nothing.

The ordinary alternatives a student reaches for are all seen: a name bound at import, torch.func's transforms,
torch.autograd.functional, forward-mode AD, the engine itself; for `watch_calls`, a C type imported by name
(`from torch import finfo`) and torch's public helpers. Removing the watch on purpose is not (README: advisory).
"""

import sys
import threading

import pytest
import torch
import torch.autograd.forward_ad as forward_ad
from torch import finfo as imported_finfo
from torch.autograd import grad as imported_grad

from helpers.checks import autograd_grad
from labkit.scenario import autograd_guard, watch_calls

X = torch.randn(5, 2, dtype=torch.float64)
y = torch.randn(5, dtype=torch.float64)
w = torch.randn(2, dtype=torch.float64)


def loss(v):
    return ((X @ v - y) ** 2).mean()


def closed_form(w):
    return (2.0 / X.shape[0]) * X.T @ (X @ w - y)


def through_imported_name(w):
    w = w.detach().requires_grad_(True)
    return imported_grad(loss(w), w)[0]


def through_backward(w):
    w = w.detach().requires_grad_(True)
    loss(w).backward()
    return w.grad


def through_forward_mode(w):
    with forward_ad.dual_level():
        columns = [forward_ad.unpack_dual(loss(forward_ad.make_dual(w, e))).tangent for e in torch.eye(2, dtype=w.dtype)]
    return torch.stack(columns)


ROUTES = {
    "imported name": through_imported_name,
    "backward": through_backward,
    "a helper that calls it": lambda v: autograd_grad(loss, v),
    "torch.autograd.functional.jacobian": lambda v: torch.autograd.functional.jacobian(loss, v),
    "jacobian in forward mode": lambda v: torch.autograd.functional.jacobian(loss, v, vectorize=True, strategy="forward-mode"),
    "torch.func.jacfwd": lambda v: torch.func.jacfwd(loss)(v),
    "forward-mode AD": through_forward_mode,
}


def test_closed_form_and_vmap_use_no_autograd():
    with autograd_guard() as guard:
        closed_form(w)
        torch.func.vmap(lambda x, t: 2 * x * (x @ w - t))(X, y).mean(0)
    assert guard.calls == 0


@pytest.mark.parametrize("route", ROUTES, ids=list(ROUTES))
def test_every_route_into_autograd_is_counted(route):
    with autograd_guard() as guard:
        got = ROUTES[route](w)
    assert guard.calls > 0
    assert torch.allclose(got, closed_form(w))  # the code still ran


@pytest.mark.parametrize("transform", [torch.func.grad, torch.func.jacrev], ids=["grad", "jacrev"])
def test_torch_func_reverse_mode_is_counted_even_when_it_refuses_to_run(transform):
    with autograd_guard() as guard, pytest.raises(RuntimeError):  # torch.func refuses saved-tensor hooks
        transform(loss)(w)
    assert guard.calls > 0


def test_a_thread_started_inside_is_watched_too():
    with autograd_guard() as guard:
        worker = threading.Thread(target=through_imported_name, args=(w,))
        worker.start()
        worker.join()
    assert guard.calls > 0


def test_the_guard_restores_what_it_changed():
    profile = sys.getprofile()
    with autograd_guard():
        pass
    assert torch.autograd.grad is imported_grad and sys.getprofile() is profile
    with autograd_guard() as guard:
        pass
    assert guard.calls == 0


def smallest_subnormal_from_finfo(dtype):
    return imported_finfo(dtype).tiny * imported_finfo(dtype).eps  # a C type bound by name at import


def test_watch_calls_sees_a_c_type_bound_at_import_and_puts_it_back():
    with watch_calls(torch.finfo) as seen:
        smallest_subnormal_from_finfo(torch.float16)
        torch.finfo(torch.float32)
    assert seen.calls == 3
    assert torch.finfo is imported_finfo and globals()["imported_finfo"] is imported_finfo


def test_watch_calls_sees_torch_helpers_and_python_classes():
    grads = [torch.ones(3), torch.ones(2)]
    from torch.nn.utils import get_total_norm  # bound at import, in the student's own namespace

    with watch_calls(torch.nn.utils.get_total_norm, torch.amp.GradScaler) as seen:
        get_total_norm(grads)
        torch.amp.GradScaler("cpu", enabled=False)
    assert seen.calls >= 2
    with watch_calls(torch.nn.utils.get_total_norm) as seen:
        torch.linalg.vector_norm(torch.cat(grads))
    assert seen.calls == 0
