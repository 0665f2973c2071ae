"""Kernel side of grading: run one hidden-test scenario and send back plain data — never a verdict.

The trusted grader (grader/kernel/harness.py) sends this file's source into the student's kernel once, after
the student's cells (harness.probe_code), then makes one `_tml_probe.run(...)` call per test cell. A scenario
is the test's hidden code with its oracle blocks removed: it builds inputs, calls the student's functions and
records what came back with `observe(name, value, **spec)`. Each observation is encoded and sent at once, as
its own display message (`Message`, tensors as raw bytes with dtype and shape): what was sent cannot be
rewritten by anything the student's code does later. The grader decodes the messages without pickle and
compares them, outside this process, with what the reference solution recorded for the same scenario.

So nothing here needs to be trusted: a student who patches it can only change the values the grader
receives, and those earn points only when they equal the reference's. In the reference run the same
scenario also runs its `with oracle():` blocks, whose `expect(name, value)` calls give expected values
computed by torch itself (never sent to a student's kernel).

Every scenario runs after all of the student's cells (grader/judge/grading.py plans it so): it sees the
notebook's names as they were at its test cell's place (`STATE`), and torch's global switches as a
fresh kernel has them (`course_defaults`).

This file is executed in the kernel, not imported: at module level it uses only the standard library.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import sys
import types
from typing import Literal, TypedDict

MIME = "application/vnd.tml.observations+json"
# The module (in sys.modules, not among the notebook's names, which a `%reset -f` or `globals().clear()` below the
# tests would wipe) where the grader keeps what it remembers while the cells run: `setup_names`, a copy of the names
# the set-up cells made (harness.snapshot_code), and `positions`, per test, a copy of the notebook's names at that
# test cell's place (harness.position_code).
STATE = "_tml_state"
MAX_ELEMENTS = 2_000_000  # per tensor; a larger one is recorded by its type only
MAX_DEPTH = 6
MAX_ITEMS = 10_000  # per list, tuple or dict
SPEC_KEYS = ("rtol", "atol", "hint", "factor_hints", "message", "any_shape")


class Observed(TypedDict):
    """One `observe` (or, in the reference run, `expect`) call: a name, the encoded value, how to compare."""

    name: str
    value: dict  # encode()'s plain JSON
    spec: dict  # the SPEC_KEYS given (only the reference run's are ever used)


class Message(TypedDict, total=False):
    """One display message of the scenario payload MIME; a scenario sends `observed`/`expected` ones, then one `end`."""

    test: str
    seq: int  # 0, 1, 2, … in the order sent; the end message's seq counts the messages before it
    kind: Literal["observed", "expected", "end"]
    item: Observed  # observed and expected messages
    error: str | None  # end message: the class name of the exception that ended the scenario
    meddled: bool  # end message: something other than the scenario's code called observe or expect
    ran_out_of_time: bool  # end message: a launch of ranks inside the scenario was stopped at its time limit


# Tensor dtypes the judge reads; a tensor of another dtype (uint16, float8, complex32, …) is sent by its dtype only.
SENT_DTYPES = ("float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
               "complex64", "complex128")
MAX_INT_DIGITS = 4300  # an int with more digits is sent as a size marker (Python cannot read it back from text)


def encode(value, depth: int = 0) -> dict:
    """Plain JSON for `value`: numbers, strings, lists, dicts and tensors; anything else by its type name.

    Nothing here runs the student's code: a value is told apart by its real type (`type(value)`, which a faked
    `__class__` cannot change) and read through the built-in types' own C methods (`float.__repr__`,
    `list.__getitem__`, `dict.items`), so a subclass that overrides `__float__`, `__iter__` or `items` is read by
    what it stores; a Tensor subclass is read as a plain tensor with torch functions disabled, one that overrides
    `__torch_dispatch__` is "an object of another type"."""
    kind = type(value)
    if depth > MAX_DEPTH:
        return {"t": "other", "type": "nested too deeply"}
    if value is None:
        return {"t": "none"}
    if kind is bool:
        return {"t": "bool", "v": value is True}
    if issubclass(kind, int):
        if int.__ge__(int.__abs__(value), _TOO_LONG):
            return {"t": "int", "v": "1" + "0" * MAX_INT_DIGITS}  # the judge's "an integer of more than 4300 digits"
        return {"t": "int", "v": int.__repr__(value)}
    if issubclass(kind, float):
        return {"t": "float", "v": float.__repr__(value)}
    if issubclass(kind, str):
        return {"t": "str", "v": str.__getitem__(value, slice(0, 20_000)) + ""}
    torch = _torch()
    if torch is not None and issubclass(kind, torch.Tensor):
        return _encode_tensor(torch, value)
    if issubclass(kind, (list, tuple)):
        size = (list.__len__ if issubclass(kind, list) else tuple.__len__)(value)
        at = list.__getitem__ if issubclass(kind, list) else tuple.__getitem__
        return {"t": "tuple" if kind is tuple else "list",
                "v": [encode(at(value, i), depth + 1) for i in range(min(size, MAX_ITEMS))], "n": size}
    if issubclass(kind, dict):
        items: list[tuple] = []
        for pair in dict.items(value):
            if len(items) >= MAX_ITEMS:
                break
            items.append(pair)
        return {"t": "dict", "v": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in items]}
    return {"t": "other", "type": _TYPE_NAME(kind)}


_TOO_LONG = 10 ** MAX_INT_DIGITS
# type's own descriptors: what a class holds, read past any metaclass the student wrote
_TYPE_MRO, _TYPE_DICT, _TYPE_NAME = (type.__dict__[name].__get__ for name in ("__mro__", "__dict__", "__name__"))


def _encode_tensor(torch, value) -> dict:
    """A tensor's bytes, read with every torch function override off (a subclass's `__torch_function__` never
    runs); one whose subclass overrides `__torch_dispatch__` is sent by its type only."""
    for base in _TYPE_MRO(type(value)):  # the real class dicts, never the metaclass's attribute lookup
        if base is torch.Tensor:
            break
        if "__torch_dispatch__" in _TYPE_DICT(base):
            return {"t": "other", "type": _TYPE_NAME(type(value))}
    with torch._C.DisableTorchFunction():
        value = torch.Tensor.as_subclass(value, torch.Tensor)
        dtype = str(value.dtype).removeprefix("torch.")
        if value.layout != torch.strided or value.is_quantized or value.numel() > MAX_ELEMENTS:
            return {"t": "other", "type": f"Tensor ({value.layout}, {value.numel()} elements)"}
        if value.device.type == "meta":
            return {"t": "other", "type": "a tensor on the meta device"}
        if dtype not in SENT_DTYPES:
            return {"t": "other", "type": f"a tensor of dtype {dtype}"}
        flat = value.detach().to("cpu").contiguous().reshape(-1)
        raw = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
        return {"t": "tensor", "dtype": dtype, "shape": list(value.shape),
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


def publish(message: Message) -> None:
    from IPython.display import display

    display({MIME: message}, raw=True)


def _never_drop(shell) -> None:
    """Make the kernel's IOPub socket wait for the grader instead of dropping messages when it reads slowly.

    A scenario sends one message per observation (hundreds, for some tests); a publish socket drops what its
    reader has not taken beyond its high-water mark. Waiting costs only this kernel: the grader's side of the
    socket stays bounded (grader/kernel/harness.py)."""
    thread = getattr(getattr(shell, "kernel", None), "iopub_thread", None)
    if thread is None:
        return
    import zmq

    def lossless() -> None:
        with contextlib.suppress(Exception):  # not an XPUB socket: nothing to set
            thread.socket.setsockopt(zmq.XPUB_NODROP, 1)

    thread.schedule(lossless)  # in the IO thread, before any message this scenario sends


class Recorder:
    """Sends what one scenario observes, in order, each value as it is at the moment it is observed.

    Only the scenario's own code may observe: the code objects `compile` made (by identity: the student's code,
    compiled under the same file name or from the same text, is another object). A call from anywhere else (the
    student's code, having found `observe` through frames) is not sent, and the end message says the run was
    meddled with."""

    def __init__(self, test: str) -> None:
        self.test = test
        self.source = f"<hidden test {test}>"  # the file name the scenario's code is compiled under
        self.sent = 0
        self.meddled = False
        self._own: dict[int, types.CodeType] = {}  # id -> the scenario's code objects (held, so that no id is reused)

    def compile(self, code: str) -> types.CodeType:
        """The scenario's code, compiled; it and the functions, classes and comprehensions in it may observe."""
        compiled = compile(code, self.source, "exec")
        pending = [compiled]
        while pending:
            current = pending.pop()
            self._own[id(current)] = current
            pending += [const for const in current.co_consts if isinstance(const, types.CodeType)]
        return compiled

    def _send(self, kind: Literal["observed", "expected"], name, value, spec: dict) -> None:
        caller = sys._getframe(2).f_code
        if self._own.get(id(caller)) is not caller:
            self.meddled = True
            return
        # Encoded to text now: a later change to the value (or to this recorder) cannot reach what was sent.
        item = Observed(name=str(name), value=encode(value), spec=_spec(spec))
        publish(Message(test=self.test, seq=self.sent, kind=kind, item=json.loads(json.dumps(item))))
        self.sent += 1

    def observe(self, name, value, **spec) -> None:
        """Record a value the student's code produced; the grader compares it with the reference's."""
        self._send("observed", name, value, spec)

    def expect(self, name, value) -> None:
        """(Reference run only, inside `with oracle():`) the value `name` must have, computed by torch."""
        self._send("expected", name, value, {})

    def end(self, error: str | None, ran_out_of_time: bool = False) -> None:
        publish(Message(test=self.test, seq=self.sent, kind="end", error=error, meddled=self.meddled,
                        ran_out_of_time=ran_out_of_time))


# torch's global switches that change what a computation returns, as a fresh kernel has them:
# (what it is, how to read it, how to set it, the fresh kernel's value).
def _switches(torch) -> list[tuple]:
    threads = os.environ.get("OMP_NUM_THREADS", "")
    switches = [
        ("default dtype", torch.get_default_dtype, torch.set_default_dtype, torch.float32),
        ("grad mode", torch.is_grad_enabled, torch.set_grad_enabled, True),
        ("anomaly mode", lambda: (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()),
         lambda state: torch.set_anomaly_enabled(*state), (False, True)),
        ("flush denormal", lambda: _flushes_denormals(torch), torch.set_flush_denormal, False),
        ("float32 matmul precision", torch.get_float32_matmul_precision, torch.set_float32_matmul_precision, "highest"),
        ("deterministic algorithms", lambda: (torch.are_deterministic_algorithms_enabled(),
                                              torch.is_deterministic_algorithms_warn_only_enabled()),
         lambda state: torch.use_deterministic_algorithms(state[0], warn_only=state[1]), (False, False)),
        ("cpu autocast", lambda: (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")),
         lambda state: (torch.set_autocast_enabled("cpu", state[0]), torch.set_autocast_dtype("cpu", state[1])),
         (False, torch.bfloat16)),
        ("autocast cache", torch.is_autocast_cache_enabled, torch.set_autocast_cache_enabled, True),
        ("cuda tf32 matmul", lambda: torch.backends.cuda.matmul.allow_tf32,
         lambda on: setattr(torch.backends.cuda.matmul, "allow_tf32", on), False),
        ("cudnn tf32", lambda: torch.backends.cudnn.allow_tf32, lambda on: setattr(torch.backends.cudnn, "allow_tf32", on),
         True),
        ("cuda fp16 reduced-precision reductions",
         lambda: torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
         lambda on: setattr(torch.backends.cuda.matmul, "allow_fp16_reduced_precision_reduction", on), True),
        ("cuda bf16 reduced-precision reductions",
         lambda: torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
         lambda on: setattr(torch.backends.cuda.matmul, "allow_bf16_reduced_precision_reduction", on), True),
        ("global random state", torch.random.get_rng_state, torch.random.set_rng_state, None),
    ]
    if threads.isdigit() and int(threads) > 0:
        switches.append(("threads", torch.get_num_threads, torch.set_num_threads, int(threads)))
    if torch.cuda.is_initialized():  # never initialise CUDA here: a forked kernel could not use it afterwards
        switches.append(("cuda autocast", lambda: (torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")),
                         lambda state: (torch.set_autocast_enabled("cuda", state[0]),
                                        torch.set_autocast_dtype("cuda", state[1])), (False, torch.float16)))
    return switches


def _flushes_denormals(torch) -> bool:
    """Whether set_flush_denormal(True) is in effect (torch has no getter): a subnormal times 1 comes out 0."""
    one = torch.ones(1, dtype=torch.float32, device="cpu")
    return bool((torch.full((1,), 2.0 ** -140, dtype=torch.float32, device="cpu") * one).item() == 0.0)


@contextlib.contextmanager
def course_defaults():
    """torch's global settings as a fresh kernel has them, for the scenario's duration; the student's afterwards.

    A student may well have called `torch.set_default_dtype(torch.float64)`, `torch.set_flush_denormal(True)`
    or switched grad mode off in a scratch cell; the scenario must still compute what the reference run
    computed (a hidden test is never stricter than the contract), so every switch is reset and put back.
    The global random state starts from a fixed seed; inference mode and a default device are off.
    """
    import torch

    device = torch.get_default_device()
    torch.set_default_device(None)
    saved = []
    for _, read, write, fresh in _switches(torch):
        try:
            value = read()
            if fresh is None:  # the random state: always from the same seed
                saved.append((write, value))
                torch.manual_seed(0)
            elif value != fresh:  # only what was flipped: some setters are slow the first time (1.7 s here)
                saved.append((write, value))
                write(fresh)
        except Exception:  # a switch this build of torch lacks, or one that cannot change now
            continue
    try:
        with torch.inference_mode(False):
            yield
    finally:
        for write, value in reversed(saved):
            with contextlib.suppress(Exception):
                write(value)
        # cpu is what no default device means; setting it would leave a DeviceContext mode on every later cell
        torch.set_default_device(None if device == torch.device("cpu") else device)


def run(test_id: str, code: str, answers: tuple[str, ...], inject: str = "", inject_names: tuple[str, ...] = (),
        position: str = "") -> None:
    """Run one scenario, sending what it observes as it goes, then an end message.

    The scenario sees the exercises' answers (`answers`: the names the answer cells define) and nothing
    else of the notebook, so a scratch cell that rebinds `X` or `model` cannot change the test's inputs.
    While it runs, the notebook's names, working folder and environment variables are what they were at the
    test cell's place (`position`: the key of that copy in STATE's positions), so a cell below the test that redefines
    a helper or changes folder changes nothing; they are put back afterwards. `inject` is the reference
    definition of functions another exercise provides (one mistake, one penalty): it replaces the student's
    names while the scenario runs. It is defined among the names the set-up cells made (STATE's setup_names), so a
    student's `dist = 3` cannot break it.
    """
    from IPython import get_ipython

    shell = get_ipython()
    _never_drop(shell)
    user_ns = shell.user_ns
    positions = getattr(sys.modules.get(STATE), "positions", None)
    recorder = Recorder(test_id)
    error = None
    timeouts_before = _launches_timed_out()
    try:
        with _place(user_ns, positions.get(position) if position and isinstance(positions, dict) else None), \
                course_defaults():
            _scenario(user_ns, test_id, code, answers, inject, inject_names, recorder)
    except BaseException as exc:
        error = type(exc).__name__
    recorder.end(error, _launches_timed_out() > timeouts_before)


def _launches_timed_out() -> int:
    """labkit.launch's count of launches stopped at their time limit (0 before anything launched)."""
    return getattr(sys.modules.get("labkit.launch"), "launches_timed_out", 0)


@contextlib.contextmanager
def _place(user_ns: dict, there: object):
    """The notebook's names, working folder and environment variables as they were at the test cell's place
    (harness.position_code's triple), for the scenario's duration; what they are now afterwards."""
    names, cwd, environ = dict(user_ns), os.getcwd(), dict(os.environ)
    try:
        if isinstance(there, tuple) and len(there) == 3 and isinstance(there[0], dict):
            user_ns.clear()
            user_ns.update(there[0])
            with contextlib.suppress(Exception):
                os.chdir(there[1])
            with contextlib.suppress(Exception):
                os.environ.clear()
                os.environ.update(there[2])
        yield
    finally:
        user_ns.clear()
        user_ns.update(names)
        with contextlib.suppress(Exception):
            os.chdir(cwd)
        os.environ.clear()
        os.environ.update(environ)


def _scenario(user_ns: dict, test_id: str, code: str, answers: tuple[str, ...], inject: str,
              inject_names: tuple[str, ...], recorder: Recorder) -> None:
    """Execute the scenario's code with the answers, the injected reference functions and the recorder."""
    import labkit.scenario as guards

    if inject:
        setup = getattr(sys.modules.get(STATE), "setup_names", None)
        namespace = dict(setup if isinstance(setup, dict) else user_ns)
        exec(compile(inject, f"<reference for {test_id}>", "exec"), namespace)
        user_ns.update({name: namespace[name] for name in inject_names})
    scope = {name: user_ns[name] for name in answers if name in user_ns}
    scope.update({name: getattr(guards, name) for name in guards.GUARDS})
    scope.update(observe=recorder.observe, expect=recorder.expect, oracle=contextlib.nullcontext)
    exec(recorder.compile(code), scope)
