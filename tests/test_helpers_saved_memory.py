"""SavedTensorMeter counts memory that exists only because a graph saved it, and lets it go when the graph is freed."""

import torch
import torch.nn as nn

from helpers.saved_memory import SavedTensorMeter


def test_counts_a_new_storage_once_and_frees_after_backward():
    x = torch.randn(1000, requires_grad=True)
    with SavedTensorMeter() as meter:
        h = x.exp()  # exp saves its output: a new storage
        y = (h * h).sum()  # mul saves h twice: the same storage, counted once
    del h
    assert meter.live_bytes() == 1000 * 4
    y.backward()
    assert meter.live_bytes() == 0
    assert torch.allclose(x.grad, 2 * torch.exp(2 * x.detach()))


def test_storages_from_before_the_block_are_not_counted():
    x = torch.randn(1000, requires_grad=True)
    with SavedTensorMeter() as meter:
        y = (x * x).sum()  # saves only x, which the caller holds anyway
    assert meter.live_count() == 0 and meter.live_bytes() == 0
    y.backward()


def test_a_view_of_an_old_storage_is_not_counted_but_a_copy_is():
    base = torch.randn(55, dtype=torch.float64)
    w = torch.randn(10, dtype=torch.float64, requires_grad=True)
    with SavedTensorMeter() as meter:
        kept_view = base[:10] * w  # saves base[:10]: a view of base's storage
        kept_copy = base[:10].clone() * w  # saves a new 80-byte storage
    assert meter.live_bytes() == 80
    del kept_view, kept_copy
    assert meter.live_bytes() == 0


def test_graph_freed_when_output_dropped():
    x = torch.randn(256, requires_grad=True)
    with SavedTensorMeter() as meter:
        kept = [x.exp().sum() for _ in range(3)]  # exp saves its output: a new storage each time
    assert meter.live_bytes() == 3 * 256 * 4
    del kept
    assert meter.live_bytes() == 0


def test_parameters_and_inputs_left_out_and_gradients_unchanged():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 2))
    X = torch.randn(4, 5)
    model(X).sum().backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    with SavedTensorMeter() as meter:
        out = model(X).sum()
    assert meter.live_bytes() == 4 * 7 * 4  # only the tanh output; the input X and the weights existed before
    out.backward()
    for p, g in zip(model.parameters(), expected):
        assert torch.equal(p.grad, g)


def test_exclude_is_accepted_and_changes_nothing_for_old_storages():
    x = torch.randn(100, requires_grad=True)
    results = []
    for exclude in ([], [x]):  # notebook 04 passes the caller's tensor; it existed before, so it is left out anyway
        with SavedTensorMeter(exclude=exclude) as meter:
            h = 2 * x  # saves nothing
            out = h.exp().sum() + x.exp().sum()  # two exp outputs: new storages
        results.append(meter.live_bytes())
        out.backward()
    assert results == [2 * 100 * 4, 2 * 100 * 4]


def test_custom_function_save_for_backward_is_counted():
    class SquareSavesCopy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x.clone())  # created inside forward: only the graph keeps it
            return x * x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 2 * x * g

    x = torch.randn(100, dtype=torch.float64, requires_grad=True)
    with SavedTensorMeter() as meter:
        out = SquareSavesCopy.apply(x).sum()
    assert meter.live_bytes() == 800
    out.backward()
    assert meter.live_bytes() == 0
    assert torch.allclose(x.grad, 2 * x.detach())
