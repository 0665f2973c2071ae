"""The names a test cell's hidden scenario uses, for a run of the solution notebook outside the grader.

At grading time the grader replaces `observe`, `expect` and `oracle` (grader/kernel/probe.py): `observe`
records what the student's code returned, `expect` gives the value it must have, and the comparison happens
outside the kernel. In an ordinary run of a solution notebook they record nothing, so the notebook runs top
to bottom in Jupyter. The behaviour checks (`GUARDS`: `watch_calls`, `autograd_guard`) are the same here and
at grading.

Behaviour checks run in the student's process, so they are advisory: they see the ordinary ways to reach a
function — its module attribute, a name bound at import (`from torch import finfo`), an alias, torch's public
helpers that call it — but a student who removes the watch on purpose (sys.setprofile(None), say) is not seen.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

oracle = contextlib.nullcontext  # a block only the reference run executes
GUARDS = ("watch_calls", "autograd_guard")  # what the grader hands to every scenario besides observe and expect


def observe(name: str, value: object, **spec: Any) -> None:
    """Record `value` under `name` for the grader (a no-op outside grading) (notebook 01)."""


def expect(name: str, value: object) -> None:
    """Give the value `name` must have, computed inside `with oracle():` (a no-op outside grading) (notebook 01)."""


def uses_reference(*names: str) -> None:
    """Declare that this test calls other exercises' functions: the grader substitutes the reference ones (notebook 01)."""


class watch_calls:
    """Count calls of `targets` (functions, methods, classes, built-ins) while active, however they were reached
    (notebook 01).

    A Python function is recognised by its code object and a built-in by identity (a profile hook, in this thread
    and in threads started meanwhile), so a name bound at import, an alias or torch's own helpers calling it all
    count; a class counts calls of any method it defines. A class written in C (torch.finfo) has no code to watch:
    its module attribute and every alias of it in the student's namespaces are swapped for a counting stand-in.
    """

    def __init__(self, *targets: object) -> None:
        self.calls = 0
        self._codes: set[types.CodeType] = set()
        self._builtins: set[int] = set()
        self._swapped: list[tuple[dict, str, object]] = []
        self._c_types: list[type] = []
        for target in targets:
            self._add(target)

    def _add(self, target: object) -> None:
        function = inspect.unwrap(getattr(target, "__func__", target))  # type: ignore[arg-type]
        if isinstance(function, types.FunctionType):
            self._codes.add(function.__code__)
        elif isinstance(target, type):
            methods = [m for m in vars(target).values() if isinstance(getattr(m, "__func__", m), types.FunctionType)]
            for method in methods:
                self._add(method)
            if not methods:
                self._c_types.append(target)
        elif callable(target):
            self._builtins.add(id(target))

    def _profile(self, frame: types.FrameType, event: str, arg: object) -> None:
        if (event == "call" and frame.f_code in self._codes) or (event == "c_call" and id(arg) in self._builtins):
            self.calls += 1

    def _counting(self, original: type) -> Callable:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return original(*args, **kwargs)

        return counted

    def _swap_aliases(self, caller: dict) -> None:
        """Put a counting stand-in wherever a watched C type is bound: its module, __main__, the scenario's names
        and the namespaces of the functions and classes the scenario holds (the student's answers)."""
        spaces = [caller, vars(sys.modules["__main__"])]
        for value in list(caller.values()):
            for member in [value, *(vars(value).values() if isinstance(value, type) else ())]:
                space = getattr(getattr(member, "__func__", member), "__globals__", None)
                if isinstance(space, dict) and all(space is not s for s in spaces):
                    spaces.append(space)
        for target in self._c_types:
            module = sys.modules.get(getattr(target, "__module__", ""))
            stand_in = self._counting(target)
            for space in [*([vars(module)] if module else []), *spaces]:
                for name, value in list(space.items()):
                    if value is target:
                        self._swapped.append((space, name, value))
                        space[name] = stand_in

    def __enter__(self) -> watch_calls:
        self._previous = (sys.getprofile(), threading.getprofile())
        if self._c_types:
            caller = sys._getframe(1)
            while caller.f_back is not None and caller.f_globals is globals():  # a subclass's __enter__
                caller = caller.f_back
            self._swap_aliases(caller.f_globals)
        if self._codes or self._builtins:
            sys.setprofile(self._profile)
            threading.setprofile(self._profile)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(self._previous[0])
        threading.setprofile(self._previous[1])
        for space, name, value in reversed(self._swapped):
            space[name] = value
        self._swapped.clear()


class autograd_guard(watch_calls):
    """Count uses of autograd while active — calls into it and graphs recorded; the code keeps running (notebook 01).

    Every way in is watched: torch.autograd.grad and backward (through any name, also bound at import),
    Tensor.backward, the autograd engine itself, torch.autograd.functional, forward-mode AD and torch.func's
    transforms (grad, vjp, jacrev, jacfwd, jvp, hessian, linearize). A graph that saves tensors for backward
    (`(X @ w - y) ** 2` with `w.requires_grad`) counts too, however the backward is then called.
    """

    ENTRY_POINTS = (("torch.autograd", "grad"), ("torch.autograd", "backward"), ("torch.Tensor", "backward"),
                    ("torch.autograd.graph", "_engine_run_backward"), ("torch.autograd.forward_ad", "make_dual"),
                    ("torch.autograd.forward_ad", "unpack_dual"),
                    *(("torch.autograd.functional", name) for name in ("jacobian", "hessian", "vjp", "jvp", "hvp", "vhp")),
                    *(("torch.func", name) for name in ("grad", "grad_and_value", "vjp", "jacrev", "jacfwd", "jvp",
                                                       "hessian", "linearize")),
                    *(("torch._functorch.eager_transforms", name) for name in ("grad_impl", "grad_and_value_impl",
                                                                               "vjp", "jacrev", "jacfwd", "jvp",
                                                                               "linearize")))
    ENGINE = ("run_backward", "_make_dual", "_enter_dual_level", "_grad_increment_nesting", "_jvp_increment_nesting")

    def __init__(self) -> None:
        import torch

        targets: list[object] = []
        for owner_name, attr in self.ENTRY_POINTS:
            owner = torch.Tensor if owner_name == "torch.Tensor" else importlib.import_module(owner_name)
            targets.append(getattr(owner, attr))
        super().__init__(*targets)
        self._engine = set(self.ENGINE)

    def _profile(self, frame: types.FrameType, event: str, arg: object) -> None:
        if event == "c_call" and getattr(arg, "__name__", "") in self._engine:
            self.calls += 1
        else:
            super()._profile(frame, event, arg)

    def __enter__(self) -> autograd_guard:
        import torch

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            self.calls += 1
            return tensor

        self._saved_hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor)
        self._saved_hooks.__enter__()
        super().__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        self._saved_hooks.__exit__(*exc)
