"""Kernel side of grading: run one hidden-test scenario and send back plain data — never a verdict.

The trusted grader (grader/kernel/harness.py) sends this file's source into the student's kernel once, then
one `_tml_probe.run(...)` call per test cell. A scenario is the test's hidden code with its oracle
blocks removed: it builds inputs, calls the student's functions and records what came back with
`observe(name, value, **spec)`. The recorded values leave the kernel as one JSON display message
(tensors as raw bytes with dtype and shape); the grader decodes them without pickle and compares
them, outside this process, with what the reference solution recorded for the same scenario.

So nothing here needs to be trusted: a student who patches it can only change the values the grader
receives, and those earn points only when they equal the reference's. In the reference run the same
scenario also runs its `with oracle():` blocks, whose `expect(name, value)` calls give expected values
computed by torch itself (never sent to a student's kernel).

This file is executed in the kernel, not imported: at module level it uses only the standard library.
"""

from __future__ import annotations

import base64
import contextlib
import json

MIME = "application/vnd.tml.observations+json"
# The kernel variable the grader sets after each set-up cell: a copy of the names set-up cells defined.
SETUP_NAMES = "_tml_setup_names"
MAX_ELEMENTS = 2_000_000  # per tensor; a larger one is recorded by its type only
MAX_DEPTH = 6
MAX_ITEMS = 10_000  # per list, tuple or dict
SPEC_KEYS = ("rtol", "atol", "hint", "factor_hints", "message", "any_shape")


def encode(value, depth: int = 0) -> dict:
    """Plain JSON for `value`: numbers, strings, lists, dicts and tensors; anything else by its type name."""
    if depth > MAX_DEPTH:
        return {"t": "other", "type": "nested too deeply"}
    if value is None:
        return {"t": "none"}
    if isinstance(value, bool):
        return {"t": "bool", "v": bool(value)}
    if isinstance(value, int):
        return {"t": "int", "v": str(int(value))}
    if isinstance(value, float):
        return {"t": "float", "v": repr(float(value))}
    if isinstance(value, str):
        return {"t": "str", "v": str(value)[:20_000]}
    torch = _torch()
    if torch is not None and isinstance(value, torch.Tensor):
        return _encode_tensor(torch, value)
    if isinstance(value, (list, tuple)):
        return {"t": type(value).__name__ if type(value) in (list, tuple) else "list",
                "v": [encode(v, depth + 1) for v in list(value)[:MAX_ITEMS]], "n": len(value)}
    if isinstance(value, dict):
        items = list(value.items())[:MAX_ITEMS]
        return {"t": "dict", "v": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in items]}
    return {"t": "other", "type": type(value).__name__}


def _encode_tensor(torch, value) -> dict:
    if value.layout != torch.strided or value.is_quantized or value.numel() > MAX_ELEMENTS:
        return {"t": "other", "type": f"Tensor ({value.layout}, {value.numel()} elements)"}
    flat = value.detach().to("cpu").contiguous().reshape(-1)
    raw = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
    return {"t": "tensor", "dtype": str(value.dtype).removeprefix("torch."), "shape": list(value.shape),
            "device": value.device.type, "requires_grad": bool(value.requires_grad),
            "data": base64.b64encode(raw).decode()}


def _torch():
    import sys

    return sys.modules.get("torch")


def _spec(spec: dict) -> dict:
    unknown = set(spec) - set(SPEC_KEYS)
    if unknown:
        raise TypeError(f"observe() got unknown options {sorted(unknown)}")
    plain = {k: v for k, v in spec.items() if k != "factor_hints"}
    if spec.get("factor_hints"):
        plain["factor_hints"] = [[float(k), str(v)] for k, v in spec["factor_hints"].items()]
    return json.loads(json.dumps(plain, default=str))


class Recorder:
    """Collects what one scenario observed, in order."""

    def __init__(self) -> None:
        self.observed: list[dict] = []
        self.expected: list[dict] = []

    def observe(self, name, value, **spec) -> None:
        """Record a value the student's code produced; the grader compares it with the reference's."""
        self.observed.append({"name": str(name), "value": encode(value), "spec": _spec(spec)})

    def expect(self, name, value) -> None:
        """(Reference run only, inside `with oracle():`) the value `name` must have, computed by torch."""
        self.expected.append({"name": str(name), "value": encode(value)})


def publish(payload: dict) -> None:
    from IPython.display import display

    display({MIME: payload}, raw=True)


@contextlib.contextmanager
def course_defaults():
    """torch's global settings as a fresh kernel has them, for the scenario's duration.

    A student may well have called `torch.set_default_dtype(torch.float64)` or switched grad mode off in a
    scratch cell; the scenario's inputs must still be the reference run's, so they are reset and then put back.
    """
    import torch

    saved = (torch.get_default_dtype(), torch.get_default_device(), torch.is_grad_enabled(), torch.is_anomaly_enabled())
    torch.set_default_dtype(torch.float32)
    torch.set_default_device(None)
    torch.set_grad_enabled(True)
    torch.set_anomaly_enabled(False)
    try:
        yield
    finally:
        torch.set_default_dtype(saved[0])
        # cpu is what no default device means; setting it would leave a DeviceContext mode on every later cell
        torch.set_default_device(None if saved[1] == torch.device("cpu") else saved[1])
        torch.set_grad_enabled(saved[2])
        torch.set_anomaly_enabled(saved[3])


def run(test_id: str, code: str, answers: tuple[str, ...], inject: str = "", inject_names: tuple[str, ...] = ()) -> None:
    """Run one scenario and publish what it observed.

    The scenario sees the exercises' answers (`answers`: the names the answer cells define) and nothing
    else of the notebook, so a scratch cell that rebinds `X` or `model` cannot change the test's inputs.
    `inject` is the reference definition of functions another exercise provides (one mistake, one
    penalty): it replaces the student's names while the scenario runs and is removed afterwards. It is
    defined among the names the set-up cells made (SETUP_NAMES), so a student's `dist = 3` cannot break it.
    """
    from IPython import get_ipython

    from labkit.scenario import autograd_guard

    user_ns = get_ipython().user_ns
    missing = object()
    saved = {name: user_ns.get(name, missing) for name in inject_names}
    recorder = Recorder()
    error = None
    try:
        if inject:
            setup = user_ns.get(SETUP_NAMES)
            namespace = dict(setup if isinstance(setup, dict) else user_ns)
            exec(compile(inject, f"<reference for {test_id}>", "exec"), namespace)
            user_ns.update({name: namespace[name] for name in inject_names})
        scope = {name: user_ns[name] for name in answers if name in user_ns}
        scope.update(observe=recorder.observe, expect=recorder.expect, oracle=contextlib.nullcontext,
                     autograd_guard=autograd_guard)
        with course_defaults():
            exec(compile(code, f"<hidden test {test_id}>", "exec"), scope)
    except BaseException as exc:
        error = type(exc).__name__
    finally:
        for name, value in saved.items():
            if value is missing:
                user_ns.pop(name, None)
            else:
                user_ns[name] = value
    publish({"test": test_id, "observed": recorder.observed, "expected": recorder.expected, "error": error})
