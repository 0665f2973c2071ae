"""SavedTensorMeter counts what graphs hold for backward, and lets it go when the graph is freed."""

import torch
import torch.nn as nn

from helpers.saved_memory import SavedTensorMeter


def test_counts_saved_storage_once_and_frees_after_backward():
    x = torch.randn(1000, requires_grad=True)
    with SavedTensorMeter() as meter:
        y = (x * x).sum()  # mul saves x twice: one storage
    assert meter.live_bytes() == 1000 * 4
    y.backward()
    assert meter.live_bytes() == 0
    assert torch.allclose(x.grad, 2 * x.detach())


def test_graph_freed_when_output_dropped():
    x = torch.randn(256, requires_grad=True)
    with SavedTensorMeter() as meter:
        kept = [x.exp().sum() for _ in range(3)]  # exp saves its output: a new storage each time
    assert meter.live_bytes() == 3 * 256 * 4
    del kept
    assert meter.live_bytes() == 0


def test_excludes_parameters_and_gradients_unchanged():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 2))
    X = torch.randn(4, 5)
    model(X).sum().backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    with SavedTensorMeter(exclude=list(model.parameters())) as meter:
        out = model(X).sum()
    assert meter.live_bytes() == (4 * 5 + 4 * 7) * 4  # input and the tanh output; weights left out
    out.backward()
    for p, g in zip(model.parameters(), expected):
        assert torch.equal(p.grad, g)


def test_custom_function_save_for_backward_is_counted():
    class Square(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 2 * x * g

    x = torch.randn(100, dtype=torch.float64, requires_grad=True)
    with SavedTensorMeter() as meter:
        out = Square.apply(x).sum()
    assert meter.live_bytes() == 800
    out.backward()
    assert meter.live_bytes() == 0
    assert torch.allclose(x.grad, 2 * x.detach())
