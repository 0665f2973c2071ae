"""The names a test cell's hidden scenario uses, for a run of the solution notebook outside the grader.

At grading time the grader replaces them (grader/kernel/probe.py): `observe` records what the student's code
returned, `expect` gives the value it must have, and the comparison happens outside the kernel. In an
ordinary run of a solution notebook they record nothing, so the notebook runs top to bottom in Jupyter.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable
from typing import Any

oracle = contextlib.nullcontext  # a block only the reference run executes


def observe(name: str, value: object, **spec: Any) -> None:
    """Record `value` under `name` for the grader (a no-op outside grading) (notebook 01)."""


def expect(name: str, value: object) -> None:
    """Give the value `name` must have, computed inside `with oracle():` (a no-op outside grading) (notebook 01)."""


def uses_reference(*names: str) -> None:
    """Declare that this test calls other exercises' functions: the grader substitutes the reference ones (notebook 01)."""


class autograd_guard:
    """Count uses of autograd while active — API calls and graphs recorded; the code keeps running (notebook 01).

    A graph that saves tensors for backward (`(X @ w - y) ** 2` with `w.requires_grad`) is counted however
    the backward is then called, also through a name imported before the guard started.
    """

    ENTRY_POINTS = (("torch.autograd", "grad"), ("torch.autograd", "backward"), ("torch.Tensor", "backward"),
                    ("torch.func", "grad"), ("torch.func", "grad_and_value"), ("torch.func", "vjp"),
                    ("torch.func", "jacrev"), ("torch.func", "jacfwd"), ("torch.func", "hessian"),
                    ("torch.autograd.functional", "jacobian"), ("torch.autograd.functional", "hessian"),
                    ("torch.autograd.functional", "vjp"))

    def __init__(self) -> None:
        self.calls = 0
        self._saved: list[tuple[object, str, Callable]] = []

    def __enter__(self) -> autograd_guard:
        import torch

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            self.calls += 1
            return tensor

        self._saved_hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor)
        self._saved_hooks.__enter__()
        for owner_name, attr in self.ENTRY_POINTS:
            owner = torch.Tensor if owner_name == "torch.Tensor" else importlib.import_module(owner_name)
            original = getattr(owner, attr)
            self._saved.append((owner, attr, original))
            setattr(owner, attr, self._counting(original))
        return self

    def _counting(self, original: Callable) -> Callable:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return original(*args, **kwargs)

        return counted

    def __exit__(self, *exc: object) -> None:
        for owner, attr, original in reversed(self._saved):
            setattr(owner, attr, original)
        self._saved.clear()
        self._saved_hooks.__exit__(*exc)
