"""The names a test cell's hidden scenario uses, for a run of the solution notebook outside the grader.

At grading time the grader replaces `observe`, `expect` and `oracle` (grader/kernel/probe.py): `observe`
records what the student's code returned, `expect` gives the value it must have, and the comparison happens
outside the kernel. In an ordinary run of a solution notebook they record nothing, so the notebook runs top
to bottom in Jupyter. The behaviour checks (`GUARDS`: `watch_calls`, `autograd_guard`) are the same here and
at grading.

Behaviour checks run in the student's process and cost the test's points when they see the behaviour; they see
it however the call is reached and in whichever thread (docs/security.md, "Residual risks", lists what they see and
what not): code written to switch a watch off on purpose, or work done before the test, is not seen.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import importlib
import inspect
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

oracle = contextlib.nullcontext  # a block only the reference run executes
GUARDS = ("watch_calls", "autograd_guard", "__builtins__")  # what the grader hands to every scenario besides
# observe and expect: the checks, and the builtins as they were before any student code ran (at the end of this file)


def observe(name: str, value: object, **spec: Any) -> None:
    """Record `value` under `name` for the grader (a no-op outside grading) (notebook 01)."""


def expect(name: str, value: object) -> None:
    """Give the value `name` must have, computed inside `with oracle():` (a no-op outside grading) (notebook 01)."""


def uses_reference(*names: str) -> None:
    """Declare that this test calls other exercises' functions: the grader substitutes the reference ones (notebook 01)."""


class watch_calls:
    """Count calls of `targets` (functions, methods, classes, built-ins, torch ops) while active, however they were
    reached and in whichever thread (notebook 01).

    A Python function is watched in every thread of the process, however started or whenever: its code is swapped
    for one that counts and then runs the original (so a name bound at import, an alias, a wrapper or torch's own
    helpers calling it all count), and a copy of its code run in this thread counts too (a profile hook). A torch op
    (`torch.ops.aten.name`, its overloads, the `torch.name` built-in of it, its functional or in-place twin) is
    watched in torch's dispatcher: every route to it counts, from any thread, inference mode included. Another
    built-in counts when this thread, or a thread started meanwhile, calls it. A class counts calls of any method it
    defines. A class written in C (torch.finfo) has no code to watch: every loaded module's attribute for it
    (torch.finfo, torch._C.finfo) and every reference to it in the student's namespaces — in their dicts, lists,
    sets, tuples, objects, closures and defaults, up to MAX_WALKED values — are swapped for a counting stand-in;
    numpy's and torch's own calls of a watched class do not count. A process started while the watch is open counts.
    """

    MAX_WALKED = 20_000  # values looked through for a C type's references (the student's namespaces, nested)

    def __init__(self, *targets: object) -> None:
        self.calls = 0
        self._codes: set[types.CodeType] = set()
        self._functions: list[types.FunctionType] = []
        self._builtins: set[int] = set()
        self._ops: list[str] = []
        self._undo: list[Callable[[], None]] = []
        self._c_types: list[type] = []
        self._class_codes: set[types.CodeType] = set()  # a watched class's methods: numpy's and torch's own calls pass
        for target in targets:
            self._add(target)

    def _add(self, target: object) -> None:
        function = inspect.unwrap(getattr(target, "__func__", target))  # type: ignore[arg-type]
        op = _aten_op_name(target)
        if op:
            self._ops.append(op)
        elif isinstance(function, types.FunctionType):
            self._codes.add(function.__code__)
            self._functions.append(function)
        elif isinstance(target, type):
            methods = [m for m in vars(target).values() if isinstance(getattr(m, "__func__", m), types.FunctionType)]
            for method in methods:
                self._add(method)
                self._class_codes.add(inspect.unwrap(getattr(method, "__func__", method)).__code__)
            if not methods:
                self._c_types.append(target)
        elif callable(target):
            self._builtins.add(id(target))

    def _profile(self, frame: types.FrameType, event: str, arg: object) -> None:
        if event == "call" and frame.f_code in self._codes:
            if frame.f_back is None or frame.f_back.f_code is not _run_watched.__code__:
                self.calls += 1  # a copy of a watched code object (a swapped function counts its own calls)
        elif event == "c_call" and id(arg) in self._builtins:
            self.calls += 1

    def _counting(self, original: type) -> Callable:
        def counted(*args: Any, **kwargs: Any) -> Any:
            if not _from_library(sys._getframe(1)):
                self.calls += 1
            return original(*args, **kwargs)

        return counted

    def _swap_code(self, function: types.FunctionType) -> None:
        """From now on, in every thread, a call of `function` counts and then runs its original code."""
        code, kwdefaults = function.__code__, function.__kwdefaults__
        original = types.FunctionType(code, function.__globals__, function.__name__, function.__defaults__,
                                      function.__closure__)
        original.__kwdefaults__ = kwdefaults
        function.__code__ = _trampoline(len(code.co_freevars))
        function.__kwdefaults__ = {**(kwdefaults or {}), _WATCH_ARG: functools.partial(_run_watched, self, original)}

        def undo() -> None:
            function.__code__, function.__kwdefaults__ = code, kwdefaults

        self._undo.append(undo)

    def _watch_ops(self) -> None:
        """Count every call of the watched torch ops in the dispatcher: every route to them, from every thread.

        Each op is watched with its twin (`_amp_update_scale_` and `_amp_update_scale`) and every overload. An op with
        a backend kernel counts at BackendSelect, a key that inference mode and `_AutoDispatchBelowAutograd` keep (the
        call then goes on to the backend); one made of other ops (CompositeImplicitAutograd: `_unpack_dual`) counts
        at its autograd keys and then runs its decomposition."""
        import torch

        library = torch.library.Library("aten", "IMPL")
        names = [twin for name in self._ops for twin in (name, name.removesuffix("_"), name.removesuffix("_") + "_")]
        for name in dict.fromkeys(names):
            packet = getattr(torch.ops.aten, name, None)
            for overload in packet.overloads() if packet is not None else ():
                op = getattr(packet, overload)
                qualified = name if overload == "default" else f"{name}.{overload}"
                if torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd"):
                    for key in ("AutogradCPU", "AutogradCUDA"):
                        library.impl(qualified, functools.partial(self._decomposed, op), key)
                elif not torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "BackendSelect"):
                    library.impl(qualified, functools.partial(self._counted_op, op), "BackendSelect", with_keyset=True)
                else:  # a factory op: counted above autograd
                    for key in ("AutogradCPU", "AutogradCUDA"):
                        library.impl(qualified, functools.partial(self._below_autograd, op), key)
        self._undo.append(library._destroy)

    def _counted_op(self, op: Any, keyset: Any, *args: Any, **kwargs: Any) -> Any:
        import torch

        self.calls += 1
        return op.redispatch(keyset.remove(torch._C.DispatchKey.BackendSelect), *args, **kwargs)

    def _decomposed(self, op: Any, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return op.decompose(*args, **kwargs)

    def _below_autograd(self, op: Any, *args: Any, **kwargs: Any) -> Any:
        import torch

        self.calls += 1
        with torch._C._AutoDispatchBelowAutograd():
            return op(*args, **kwargs)

    def _swap_aliases(self, caller: dict) -> None:
        """Put a counting stand-in wherever a watched C type is held: its module attribute, then breadth first the
        scenario's names, the namespaces of the functions and classes it holds (the student's answers), __main__,
        and everything those hold (containers, objects, closures, defaults)."""
        spaces = [caller]
        for value in list(caller.values()):
            for member in [value, *(vars(value).values() if isinstance(value, type) else ())]:
                space = getattr(getattr(member, "__func__", member), "__globals__", None)
                if isinstance(space, dict) and all(space is not s for s in spaces):
                    spaces.append(space)
        spaces.append(vars(sys.modules["__main__"]))
        stand_ins = {id(target): self._counting(target) for target in self._c_types}
        for module in list(sys.modules.values()):  # torch.finfo, torch._C.finfo, numpy.finfo, numpy.core.finfo …
            if not isinstance(module, types.ModuleType):
                continue
            space = object.__getattribute__(module, "__dict__")
            for name, value in list(space.items()) if isinstance(space, dict) else ():
                if id(value) in stand_ins and any(value is target for target in self._c_types):
                    space[name] = stand_ins[id(value)]
                    self._undo.append(functools.partial(space.__setitem__, name, value))
        _AliasWalk(stand_ins, self.MAX_WALKED, self._undo).walk(spaces)

    def __enter__(self) -> watch_calls:
        self._previous = (sys.getprofile(), threading.getprofile())
        try:
            for function in self._functions:
                self._swap_code(function)
            if self._ops:
                self._watch_ops()
            if self._c_types:
                caller = sys._getframe(1)
                while caller.f_back is not None and caller.f_globals is globals():  # a subclass's __enter__
                    caller = caller.f_back
                self._swap_aliases(caller.f_globals)
        except BaseException:
            self._restore()
            raise
        if self._codes or self._builtins:
            sys.setprofile(self._profile)
            threading.setprofile(self._profile)
        _watch_processes()
        _OPEN.append(self)
        return self

    def _restore(self) -> None:
        while self._undo:
            self._undo.pop()()

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(self._previous[0])
        threading.setprofile(self._previous[1])
        self._restore()
        with contextlib.suppress(ValueError):
            _OPEN.remove(self)


# A process started while a watch is open (os.fork, subprocess, posix_spawn, exec, os.system) counts as a call: what
# it does is out of every watch's sight. Seen through an audit hook, which cannot be removed once added: it is added
# at the first watch and does nothing while none is open.
_OPEN: list[watch_calls] = []
PROCESS_EVENTS = frozenset({"os.fork", "os.forkpty", "os.posix_spawn", "os.exec", "os.spawn", "os.system",
                            "subprocess.Popen", "os.startfile"})
_hooked: list[bool] = []


def _watch_processes() -> None:
    if not _hooked:
        sys.addaudithook(_audit)
        _hooked.append(True)


def _audit(event: str, args: tuple) -> None:
    if _OPEN and event in PROCESS_EVENTS:
        for watch in list(_OPEN):
            watch.calls += 1


_WATCH_ARG = "_labkit_watch_"  # the keyword-only default through which a swapped function reaches its watch


def _run_watched(watch: watch_calls, original: Callable, args: tuple, kwargs: dict) -> Any:
    if getattr(original, "__code__", None) not in watch._class_codes or not _from_library(sys._getframe(2)):
        watch.calls += 1
    return original(*args, **kwargs)


def _library_folders() -> tuple[str, ...]:
    """The folders of numpy and torch, whose own calls of a watched class (numpy's array printing asks np.finfo)
    are not the student's."""
    folders = []
    for name in ("numpy", "torch"):
        module = sys.modules.get(name)
        file = getattr(module, "__file__", None) if module is not None else None
        if isinstance(file, str):
            folders.append(file.rsplit("/", 1)[0] + "/")
    return tuple(folders)


def _from_library(frame: types.FrameType | None) -> bool:
    """Whether `frame` (the caller of a watched class) runs numpy's or torch's own code."""
    if frame is None:
        return False
    return frame.f_code.co_filename.startswith(_library_folders() or ("\0",))


def _trampoline(free: int) -> types.CodeType:
    """A code object that passes its arguments to the watch held in its keyword-only default, with `free` free
    variables (a function's code may only be swapped for one with as many as its closure holds cells)."""
    names = [f"free_{i}" for i in range(free)]
    source = (f"def outer():\n    {' = '.join([*names, 'None'])}\n" if names else "def outer():\n") + (
        f"    def counted(*args, {_WATCH_ARG}=None, **kwargs):\n"
        f"        {', '.join(names) or 'None'}\n"
        f"        return {_WATCH_ARG}(args, kwargs)\n"
        "    return counted\n")
    space: dict = {}
    exec(compile(source, "<labkit.scenario watch>", "exec"), space)
    return space["outer"]().__code__


def _aten_op_name(target: object) -> str:
    """The aten op `target` is (torch.ops.aten.name, one of its overloads, or the torch.name built-in), or ''."""
    torch = sys.modules.get("torch")
    if torch is None:
        return ""
    ops = getattr(torch, "_ops", None)
    if ops is not None and isinstance(target, ops.OpOverload):
        target = target.overloadpacket
    if ops is not None and isinstance(target, ops.OpOverloadPacket):
        return target.__name__ if getattr(target, "_qualified_op_name", "").startswith("aten::") else ""
    name = getattr(target, "__name__", "")
    if isinstance(target, types.BuiltinFunctionType) and name and getattr(torch, name, None) is target:
        return name if hasattr(torch.ops.aten, name) else ""
    return ""


def _swap_back(held: set, new: object, old: object) -> None:
    """Put `old` back in the set `held` in place of its stand-in `new`."""
    held.discard(new)
    held.add(old)


class _AliasWalk:
    """Replace every reference to a watched C type inside mutable containers, objects, closures and defaults,
    breadth first from the namespaces given, undoably; a tuple or frozenset that holds one is rebuilt and put back
    where it was found."""

    def __init__(self, stand_ins: dict[int, Callable], budget: int, undo: list[Callable[[], None]]) -> None:
        self.stand_ins, self.budget, self.undo = stand_ins, budget, undo
        self.seen = {id(stand_in) for stand_in in stand_ins.values()}  # never look inside a stand-in
        self.queue: collections.deque = collections.deque()

    def walk(self, spaces: list[dict]) -> None:
        self.queue.extend(spaces)
        while self.queue and self.budget > 0:
            try:
                self._inside(self.queue.popleft())
            except Exception:  # a value that cannot be looked into (a dead weakref.proxy raises ReferenceError)
                continue

    def _new(self, value: object, depth: int = 0) -> object:
        """What takes `value`'s place: a stand-in, a rebuilt tuple, or `value` itself (then queued to look inside)."""
        if id(value) in self.stand_ins:
            return self.stand_ins[id(value)]
        if type(value) in (tuple, frozenset) and depth < 4:
            self.budget -= len(value)  # type: ignore[arg-type]
            items = [self._new(item, depth + 1) for item in value]  # type: ignore[attr-defined]
            return type(value)(items) if any(a is not b for a, b in zip(items, value)) else value  # type: ignore
        try:
            plain = isinstance(value, (str, bytes, int, float, type, types.ModuleType))
        except Exception:  # a dead weakref.proxy raises ReferenceError: nothing to look into
            return value
        if id(value) not in self.seen and not plain:
            self.seen.add(id(value))
            self.queue.append(value)
        return value

    def _inside(self, value: object) -> None:
        if isinstance(value, dict):
            self.budget -= len(value)
            for key, item in list(value.items()):
                if (new := self._new(item)) is not item:
                    value[key] = new
                    self.undo.append(functools.partial(value.__setitem__, key, item))
        elif isinstance(value, list):
            self.budget -= len(value)
            for index, item in enumerate(list(value)):
                if (new := self._new(item)) is not item:
                    value[index] = new
                    self.undo.append(functools.partial(value.__setitem__, index, item))
        elif isinstance(value, set):
            self.budget -= len(value)
            for item in list(value):
                if (new := self._new(item)) is not item:
                    value.discard(item)
                    value.add(new)
                    self.undo.append(functools.partial(_swap_back, value, new, item))
        elif isinstance(value, types.FunctionType):
            for cell in value.__closure__ or ():
                try:
                    item = cell.cell_contents
                except ValueError:  # an empty cell
                    continue
                if (new := self._new(item)) is not item:
                    cell.cell_contents = new
                    self.undo.append(functools.partial(setattr, cell, "cell_contents", item))
            for attribute in ("__defaults__", "__kwdefaults__"):
                held = getattr(value, attribute)
                if held is not None and (new := self._new(held)) is not held:
                    setattr(value, attribute, new)
                    self.undo.append(functools.partial(setattr, value, attribute, held))
        elif isinstance(getattr(value, "__dict__", None), dict):
            self._new(value.__dict__)


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
    # Read in the dispatcher, however reached (functools.partial(torch._unpack_dual) is a C call from C, which the
    # profile hook never sees): a forward-mode tangent can only be read through _unpack_dual.
    DISPATCHED = ("_unpack_dual",)
    ENGINE = ("run_backward", "_make_dual", "_enter_dual_level", "_grad_increment_nesting", "_jvp_increment_nesting")

    def __init__(self) -> None:
        import torch

        targets: list[object] = []
        for owner_name, attr in self.ENTRY_POINTS:
            owner = torch.Tensor if owner_name == "torch.Tensor" else importlib.import_module(owner_name)
            targets.append(getattr(owner, attr))
        super().__init__(*targets, *(getattr(torch.ops.aten, name) for name in self.DISPATCHED))
        self._engine = set(self.ENGINE)

    def _profile(self, frame: types.FrameType, event: str, arg: object) -> None:
        if event == "c_call" and getattr(arg, "__name__", "") in self._engine:
            self.calls += 1
        else:
            super()._profile(frame, event, arg)

    def __enter__(self) -> autograd_guard:
        import torch
        import torch.fx.traceback as fx_traceback

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            self.calls += 1
            return tensor

        def recorded(*args: Any, **kwargs: Any) -> list:
            self.calls += 1  # a node of a graph was recorded, in whichever thread
            return []

        # Every thread's graph: anomaly mode is process-wide, and with it on torch asks
        # torch.fx.traceback.format_stack for the stack of each node it records.
        self._anomaly = (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled(), fx_traceback.format_stack)
        fx_traceback.format_stack = recorded
        torch.set_anomaly_enabled(True, False)
        self._saved_hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor)
        self._saved_hooks.__enter__()
        super().__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        import torch
        import torch.fx.traceback as fx_traceback

        super().__exit__(*exc)
        self._saved_hooks.__exit__(*exc)
        enabled, check_nan, fx_traceback.format_stack = self._anomaly
        torch.set_anomaly_enabled(enabled, check_nan)


# The builtins a scenario runs with (GUARDS hands them to it): a copy taken when this module was imported — before
# any student code in a graded kernel, which imports labkit before it forks — so a student's code that rebinds
# `builtins.all` while a test runs cannot steer the test's own checks.
__builtins__ = dict(vars(importlib.import_module("builtins")))  # type: ignore[assignment]  # a dict is what CPython takes
