"""labkit.scenario.autograd_guard counts autograd however it is reached; closed-form code counts nothing."""

import torch
from torch.autograd import grad as imported_grad

from helpers.checks import autograd_grad
from labkit.scenario import autograd_guard

X = torch.randn(5, 2, dtype=torch.float64)
y = torch.randn(5, dtype=torch.float64)
w = torch.randn(2, dtype=torch.float64)


def closed_form(w):
    return (2.0 / X.shape[0]) * X.T @ (X @ w - y)


def through_imported_name(w):
    w = w.detach().requires_grad_(True)
    return imported_grad(((X @ w - y) ** 2).mean(), w)[0]


def through_backward(w):
    w = w.detach().requires_grad_(True)
    ((X @ w - y) ** 2).mean().backward()
    return w.grad


def test_closed_form_uses_no_autograd():
    with autograd_guard() as guard:
        closed_form(w)
    assert guard.calls == 0


def test_every_route_into_autograd_is_counted():
    for route in (through_imported_name, through_backward, lambda v: autograd_grad(lambda u: ((X @ u - y) ** 2).mean(), v)):
        with autograd_guard() as guard:
            got = route(w)
        assert guard.calls > 0, route
        assert torch.allclose(got, closed_form(w))  # the code still ran


def test_the_guard_restores_autograd():
    with autograd_guard():
        pass
    assert torch.autograd.grad is imported_grad
    with autograd_guard() as guard:
        pass
    assert guard.calls == 0
