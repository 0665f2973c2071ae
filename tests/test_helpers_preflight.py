"""The pre-flight checklist passes a healthy model and names what is wrong with a broken one."""

import torch
import torch.nn as nn
from torch.autograd.graph import saved_tensors_hooks

from helpers.preflight import format_report, params_without_gradient, preflight


def norms(model):
    return {n: p.grad.norm().item() for n, p in model.named_parameters() if p.grad is not None}


def saved_bytes(fn, *inputs):
    params = {p.untyped_storage().data_ptr() for p in fn.parameters()}
    seen = {}

    def pack(t):
        if t.untyped_storage().data_ptr() not in params:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with saved_tensors_hooks(pack, lambda t: t):
        fn(*inputs)
    return sum(seen.values())


def first_bad(model, x):
    found = []
    handles = [m.register_forward_hook(lambda m, i, o, n=n: found.append(n) if not torch.isfinite(o).all() else None)
               for n, m in model.named_modules()]
    with torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    return found[0] if found else None


def batches(b):
    g = torch.Generator().manual_seed(b)
    return torch.randn(b, 6, generator=g), torch.randn(b, 1, generator=g)


FUNCS = dict(layer_grad_norms=norms, saved_activation_bytes=saved_bytes, first_nonfinite_module=first_bad)


def test_healthy_model_passes_and_grads_are_cleared():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))
    results = preflight(model, nn.MSELoss(), batches, **FUNCS)
    assert all(r.ok for r in results), format_report(results)
    assert all(p.grad is None for p in model.parameters())
    assert format_report(results).count("✓") == 4


class Broken(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(6, 16)
        self.unused = nn.Linear(16, 16)
        self.head = nn.Linear(16, 1)

    def forward(self, x):
        return self.head(torch.log(torch.relu(self.body(x))))


def test_broken_model_names_the_problems():
    torch.manual_seed(0)
    results = {r.name: r for r in preflight(Broken(), nn.MSELoss(), batches, **FUNCS)}
    assert not results["loss is finite"].ok
    assert "'head'" in results["loss is finite"].detail
    assert not results["a gradient reaches every trainable parameter"].ok
    assert "unused.weight" in results["a gradient reaches every trainable parameter"].detail


def test_params_without_gradient_ignores_frozen():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
    model[0].weight.requires_grad_(False)
    model(torch.ones(1, 2)).sum().backward()
    model[1].bias.grad.zero_()
    assert params_without_gradient(model) == ["1.bias"]
