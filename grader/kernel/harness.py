"""Run a graded notebook's cells in a kernel, step by step, and collect what each step produced.

This is the trusted side's view of the student's kernel: it sends code, reads the messages that come
back (bounded in size), interrupts a step that runs past its limit and kills the kernel when the
interrupt does not help. When the kernel dies or is killed, a fresh one replays the cells that ran
before (setup and the student's own cells, never a hidden test) and grading goes on with the next
step, so one crash costs only the exercise it happened in.
"""

from __future__ import annotations

import ast
import inspect
import json
import shutil
import subprocess
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from queue import Empty

from jupyter_client import KernelManager

from grader.kernel import probe
from grader.kernel.outputs import as_output
from grader.kernel.places import MAX_COPIED_ITEMS, copy_plain
from labkit import cells

PROBE_SOURCE = Path(probe.__file__).read_text(encoding="utf-8")
MAX_OUTPUT_CHARS = 1_000_000  # per step, what a cell prints or displays
MAX_TOTAL_OUTPUT_CHARS = 8_000_000  # per notebook: what the grader keeps of all steps' output together
MAX_PAYLOAD_CHARS = 2 * 2**20  # per step, what a scenario sends back (the largest reference: under 1 MiB a notebook)
MAX_TOTAL_PAYLOAD_CHARS = 8 * 2**20  # per notebook: parsed, a message takes up to about 50 times its JSON
MAX_MESSAGE_BYTES = 16 * 2**20  # one message larger than this drops the connection (zmq MAXMSGSIZE)
RECEIVE_QUEUE = 32  # messages zmq holds unread per socket (RCVHWM); a publisher drops the rest
INTERRUPT_GRACE_S = 10.0
READY_PROBE_S = 0.2  # how long iopub may lag behind the shell reply to a kernel_info request while starting
MAX_RESTARTS = 3
BIND_POLL_S = 0.002  # how often a starting kernel's socket files are looked for



class Failure(str, Enum):
    """Why a step did not finish normally (StepRun.failure); NONE when it did."""

    NONE = ""
    TIMEOUT = "timeout"  # interrupted after the time limit; the kernel lived on
    KILLED = "killed"  # still running after the interrupt: the kernel was killed
    DIED = "died"  # the kernel died while the step ran
    OUTPUT_LIMIT = "output limit"  # more output than MAX_OUTPUT_CHARS: the rest was dropped
    NOT_RUN = "not run"  # no kernel could be started for it
    SKIPPED = "skipped"  # a cell of the student's own after their cells had used own_cells_budget


TIMEOUT, KILLED, DIED, OUTPUT_LIMIT, NOT_RUN, SKIPPED = (Failure.TIMEOUT, Failure.KILLED, Failure.DIED,
                                                          Failure.OUTPUT_LIMIT, Failure.NOT_RUN, Failure.SKIPPED)


SETUP_TIMEOUT_S = 120.0  # at least, for the steps before the student's first (see step_limits)


def step_limits(steps: list[Step], timeout: float) -> list[float]:
    """Seconds each of `steps` may run: at least SETUP_TIMEOUT_S for the course's set-up cells and the grader's
    own steps before the first step of the student's, whose time says how slow or busy the host is, never what a
    hand-in did (a slow host under a short --timeout must not fail them: every test would); the per-cell `timeout`
    from there on, for everything (student code can run inside a later step of the grader's, through builtins
    it patched, and must not get more time there than in its own cells)."""
    first = next((i for i, step in enumerate(steps) if step.by_student or step.test), len(steps))
    return [max(timeout, SETUP_TIMEOUT_S) if i < first else timeout for i in range(len(steps))]


def own_cells_budget(timeout: float) -> float:
    """Seconds the cells a student added may take together; after that they are skipped (answers, tests and
    cells that only define things still run: defines_only), so slow scratch cells cost nothing but themselves."""
    return max(120.0, 4 * timeout)


# Expressions that evaluate without calling anything or computing much: names, attributes, constants, and the
# subscripts, tuples, lists, negations and `X | Y` unions made of them (defaults, annotations, base classes).
_CHEAP = (ast.Name, ast.Attribute, ast.Constant, ast.Subscript, ast.Tuple, ast.List, ast.Load, ast.Store,
          ast.UnaryOp, ast.USub, ast.BinOp, ast.BitOr)


def _cheap(node: ast.AST | None) -> bool:
    return node is None or all(isinstance(n, _CHEAP) and (not isinstance(n, ast.BinOp) or isinstance(n.op, ast.BitOr))
                               for n in ast.walk(node))


def _decorator(node: ast.expr) -> bool:
    """A decorator such as `@staticmethod`, `@dataclass` or `@torch.no_grad()`: a name, or a call of one with
    arguments made of names and constants (what it runs is bounded by the definitions' extra --timeout)."""
    return _cheap(node) or (isinstance(node, ast.Call) and _cheap(node.func) and all(map(_cheap, node.args))
                            and all(_cheap(keyword.value) for keyword in node.keywords))


def _defines(statement: ast.stmt) -> bool:
    """Whether a statement only defines a name (what running it costs is next to nothing)."""
    if isinstance(statement, (ast.Import, ast.ImportFrom, ast.Pass)):
        return True
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
        args = statement.args
        evaluated = [*args.defaults, *args.kw_defaults, statement.returns,
                     *(a.annotation for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
                       if a is not None)]
        return all(map(_decorator, statement.decorator_list)) and all(map(_cheap, evaluated))
    if isinstance(statement, ast.ClassDef):
        return (all(map(_decorator, statement.decorator_list)) and not statement.keywords
                and all(map(_cheap, statement.bases))
                and all(map(_defines, statement.body)))
    if isinstance(statement, ast.Assign):
        return all(map(_cheap, [*statement.targets, statement.value]))
    if isinstance(statement, ast.AnnAssign):
        return _cheap(statement.target) and _cheap(statement.annotation) and _cheap(statement.value)
    return isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)  # a docstring


def _statements(source: str) -> list[ast.stmt] | None:
    """The top-level statements of a student's cell, or None when it does not parse or is too long to parse here."""
    if len(source) > cells.MAX_PARSED_CHARS:
        return None
    try:
        return ast.parse(source).body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def defines_only(source: str) -> bool:
    """Whether a cell only defines things: imports, functions and classes (decorated at most by a name or a call
    of one with plain arguments), names bound to constants (no other calls). Such a cell of the student's own still
    runs after own_cells_budget is spent (these cells then get one --timeout more together): an answer may use the
    helper it defines."""
    body = _statements(source)
    return body is not None and all(map(_defines, body))


@dataclass(frozen=True)
class Step:
    """One thing to run: a cell of the notebook, or a test cell's hidden scenario."""

    label: str  # grade id of the cell, or "cell N" for a cell the student added
    code: str
    by_student: bool
    test: str = ""  # the test id when this step is a scenario
    added: bool = False  # a cell the student added: it runs within own_cells_budget
    history: bool = True  # kept in the kernel's input history (`_i`, `In`); the grader's own steps are not


@dataclass
class StepRun:
    """What one step produced."""

    outputs: list[dict] = field(default_factory=list)  # nbformat outputs
    error: str | None = None  # the exception's class name when the step raised
    failure: Failure = Failure.NONE
    seconds: float = 0.0
    payloads: list[probe.Message] = field(default_factory=list)  # what a scenario sent (probe.MIME display data)
    payload_chars: int = 0  # the JSON size of what was sent as payloads, kept or not
    reason: str = ""  # DIED: why, when the sandbox knows (a limit it enforces); see Kernel.exit_reason


class Kernel:
    """One kernel, driven message by message."""

    def __init__(self, manager: KernelManager, startup_timeout: float = 120, scratch: str = "",
                 exit_reason: Callable[[], str] | None = None, stopped: Callable[[], None] | None = None,
                 stop_in: Callable[[Callable[[], None]], object] | None = None, **start: object) -> None:
        self.manager = manager
        self.scratch = scratch  # a folder of the kernel's own, removed when it stops
        self.stopped = stopped or (lambda: None)  # what cleans up after it once it stopped (its sandbox's folder)
        self.stop_in = stop_in  # where stopping it runs (a background thread's queue); None: in the caller
        # after the kernel died: which limit killed it ("memory limit: …"), or "" when nothing says
        self.exit_reason = exit_reason or (lambda: "")
        manager.start_kernel(**start)
        self.client = manager.client()
        try:
            _bound_sockets(self.client.context)  # before any socket of the client exists
            self._wait_until_bound(startup_timeout)
            # Only what grading reads: no stdin or heartbeat socket that a kernel could fill unread.
            self.client.start_channels(shell=True, iopub=True, stdin=False, hb=False, control=False)
            self._wait_until_ready(startup_timeout)
        except BaseException:
            # A kernel that died starting (e.g. at a memory limit) must not leave open sockets behind: the garbage
            # collector would later block forever terminating their context.
            self.stop()
            raise

    def _wait_until_bound(self, timeout: float) -> None:
        """Over ipc, wait until the kernel has bound its shell and iopub sockets before connecting to them.

        A connect that comes before the bind is retried only every 0.1 s (zmq's reconnect interval), and while
        iopub is not connected yet the status of the first kernel_info is lost: READY_PROBE_S more. The socket
        files appear in the socket folder the moment the kernel binds them (its own or the sandbox's).
        """
        if self.manager.transport != "ipc":
            return
        paths = [Path(f"{self.manager.ip}-{port}") for port in (self.manager.shell_port, self.manager.iopub_port)]
        deadline = time.monotonic() + timeout
        while not all(path.exists() for path in paths):
            if not self.alive():
                raise RuntimeError("Kernel died before binding its sockets")
            if time.monotonic() > deadline:
                raise RuntimeError(f"Kernel didn't bind its sockets in {timeout:.0f} seconds")
            time.sleep(BIND_POLL_S)

    def _wait_until_ready(self, timeout: float) -> None:
        """kernel_info until the kernel answers on shell and iopub carries that request's idle status.

        jupyter_client's wait_for_ready does this too, then waits READY_PROBE_S more for iopub to fall silent: a
        fifth of a second per kernel, of every hand-in. Grading needs no silence (run() keeps only messages of its
        own request). A reply may answer an earlier request, sent before the kernel listened: the idle looked
        for is that of the request the reply answers, not of the latest one sent.
        """
        deadline = time.monotonic() + timeout
        while True:
            self.client.kernel_info()
            try:
                reply = self.client.get_shell_msg(timeout=1)
            except Empty:
                reply = None
            if reply is not None and reply.get("msg_type") == "kernel_info_reply" and \
                    self._idle_follows(reply.get("parent_header", {}).get("msg_id")):
                return
            if not self.alive():
                raise RuntimeError("Kernel died before replying to kernel_info")
            if time.monotonic() > deadline:
                raise RuntimeError(f"Kernel didn't respond in {timeout:.0f} seconds")

    def _idle_follows(self, msg_id: str | None) -> bool:
        """Whether iopub brings the idle status of request `msg_id` within READY_PROBE_S (it proves the
        subscription is live: a publisher drops what no subscriber hears yet)."""
        until = time.monotonic() + READY_PROBE_S
        while (left := until - time.monotonic()) > 0:
            try:
                msg = self.client.get_iopub_msg(timeout=left)
            except Empty:
                return False
            if (msg.get("msg_type") == "status" and msg.get("parent_header", {}).get("msg_id") == msg_id
                    and msg.get("content", {}).get("execution_state") == "idle"):
                return True
        return False

    def alive(self) -> bool:
        return bool(self.manager.is_alive())

    def _kill(self) -> None:
        """Kill the kernel's process and reap it at once (jupyter_client looks for its end every 0.1 s), then let
        jupyter_client finish: its own kill (the process group too) and clean-up."""
        process = getattr(self.manager.provisioner, "process", None)  # jupyter_client's LocalProvisioner: a Popen
        if process is not None and process.poll() is None:
            process.kill()
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:  # stuck in the operating system: jupyter_client waits on
                pass
        self.manager.shutdown_kernel(now=True)

    def stop(self) -> None:
        if self.stop_in is not None:
            self.stop_in(self._stop)
        else:
            self._stop()

    def _stop(self) -> None:
        try:
            self.client.stop_channels()
            self.client.context.destroy(linger=0)
        finally:
            try:
                if self.manager.has_kernel:
                    self._kill()
                self.manager.cleanup_resources()
                if self.scratch:
                    shutil.rmtree(self.scratch, ignore_errors=True)
            finally:  # whatever failed above: what cleans up after the kernel (and hands its server back) runs
                self.stopped()

    def run(self, code: str, timeout: float, store_history: bool = True) -> StepRun:
        """Execute `code`; stop it after `timeout` seconds (interrupt, then kill)."""
        started = time.monotonic()
        result = StepRun()
        chars = payload_chars = 0
        msg_id = self.client.execute(code, store_history=store_history, allow_stdin=False, stop_on_error=False)
        deadline, interrupted = started + timeout, None
        while True:
            now = time.monotonic()
            if interrupted is None and now > deadline:
                result.failure = TIMEOUT
                self.manager.interrupt_kernel()
                interrupted = now
            elif interrupted is not None and now > interrupted + INTERRUPT_GRACE_S:
                result.failure = KILLED
                self._kill()
                break
            try:
                msg = self.client.get_iopub_msg(timeout=0.25)
            except Empty:
                if not self.alive():
                    result.failure = DIED
                    result.reason = self.exit_reason()
                    break
                continue
            except Exception:  # a message the kernel forged badly (bad signature, not JSON): dropped
                continue
            if not isinstance(msg.get("parent_header"), dict) or not isinstance(msg.get("content"), dict):
                continue
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "status" and content.get("execution_state") == "idle":
                break
            if kind == "clear_output":
                result.outputs.clear()
                continue
            data = content.get("data")
            payload = kind == "display_data" and isinstance(data, dict) and probe.MIME in data
            try:
                size = len(json.dumps(content, default=str))
                output = None if payload else as_output(kind, content)
            except RecursionError:  # nested deeper than the grader walks: dropped, as a malformed message is
                continue
            if payload:
                payload_chars += size
                result.payload_chars = payload_chars
                if payload_chars <= MAX_PAYLOAD_CHARS:
                    result.payloads.append(data[probe.MIME])  # whatever it is: judge.decode_messages checks it
                else:  # the rest is dropped: what came is cut short, and the status says why
                    result.failure = result.failure or OUTPUT_LIMIT
                continue
            if output is None:
                continue
            if output["output_type"] == "error":
                result.error = output["ename"][:200]
            chars += size
            if chars > MAX_OUTPUT_CHARS:
                result.failure = result.failure or OUTPUT_LIMIT
                continue
            result.outputs.append(output)
        result.seconds = time.monotonic() - started
        return result


def _bound_sockets(context) -> None:
    """Every socket the client opens from now on drops a message over MAX_MESSAGE_BYTES and queues at most
    RECEIVE_QUEUE of them unread: whatever the kernel sends, the grader's memory stays bounded."""
    import zmq

    context.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
    context.setsockopt(zmq.RCVHWM, RECEIVE_QUEUE)


# A copy of the kernel's names that a student's `dict = {}` or `globals = 1` cannot break.
_COPY_NAMES = "__import__('builtins').dict(__import__('builtins').globals())"
# probe.STATE, made when first needed
_STATE = f"__import__('sys').modules.setdefault({probe.STATE!r}, __import__('types').ModuleType({probe.STATE!r}))"


def snapshot_code() -> str:
    """The step after a set-up cell: remember the names set-up made (injected reference code is defined among them),
    and import labkit.scenario, which copies the builtins the scenarios run with (a sandboxed kernel has it from
    its fork server already, before any student code)."""
    return f"__import__('labkit.scenario')\n{_STATE}.setup_names = {_COPY_NAMES}\n"


_COPY_PLAIN_SOURCE = textwrap.dedent(inspect.getsource(copy_plain))


def position_code(test: str) -> str:
    """The step at a test cell's place: remember the notebook's names (plain data among them copied: copy_plain),
    working folder and environment variables there (its scenario runs later, with them: probe._place)."""
    os_ = "__import__('os')"
    return (f"{_STATE}.MAX_COPIED_ITEMS = {MAX_COPIED_ITEMS}\nexec({_COPY_PLAIN_SOURCE!r}, {_STATE}.__dict__)\n"
            f"{_STATE}.__dict__.setdefault('positions', {{}})[{test!r}] = "
            f"({_STATE}.copy_plain({_COPY_NAMES}), {os_}.getcwd(), __import__('builtins').dict({os_}.environ))\n")


PROBE_MODULE = "_tml_probe"  # where probe_code puts grader/kernel/probe.py in the kernel: sys.modules, which no
# snapshot of the notebook's names (position_code) holds, so a scenario's _place cannot hide it


def probe_code() -> str:
    """The step before the first scenario: grader/kernel/probe.py, executed once into a module of the kernel.

    Once per kernel rather than inside every scenario's cell: a 17 KB cell costs the kernel about 7 ms more to
    take in (ipykernel hashes each cell in pure Python, then compiles it). Nothing the student wrote runs between
    this step and the scenarios but through them, and a kernel restarted after a crash replays it (it is no test),
    also after a crash in this step itself (run_steps replays the grader's own steps whatever happened in them)."""
    return (f"__import__('sys').modules[{PROBE_MODULE!r}] = __import__('types').ModuleType({PROBE_MODULE!r})\n"
            f"exec({PROBE_SOURCE!r}, __import__('sys').modules[{PROBE_MODULE!r}].__dict__)\n")


def scenario_code(test: str, code: str, answers: tuple[str, ...], inject: str = "", inject_names: tuple[str, ...] = (),
                  position: str = "") -> str:
    """The cell that runs one scenario through the probe that probe_code put into the kernel.

    `position`: the test whose place's names the scenario sees (position_code); '' for the names as they are now.
    """
    return (EAGER + f"__import__('sys').modules[{PROBE_MODULE!r}].run({test!r}, {code!r}, {tuple(answers)!r}, "
            f"{inject!r}, {tuple(inject_names)!r}, {position!r})\n")


# Before a scenario, when the notebook used torch.compile: compiled answers run eagerly in the hidden tests (the same
# values; torch.compile would compile again for each shape and dtype a test uses, 20-30 s each on a small CPU, inside
# the test's time — README). Nothing when torch._dynamo was never imported (it costs seconds to import).
EAGER = ("(lambda dynamo: dynamo is not None and hasattr(__import__('torch').compiler, 'set_stance') and "
         "__import__('torch').compiler.set_stance('force_eager'))(__import__('sys').modules.get('torch._dynamo'))\n")


def run_steps(steps: list[Step], new_kernel: Callable[[], Kernel], timeout: float,
              clock: dict[str, float] | None = None) -> list[StepRun]:
    """Run every step in order; after a crash, a new kernel replays the cells that ran and grading goes on.

    `clock`, when given, adds up the seconds spent starting kernels (with replays) and stopping them.
    """
    clock = {} if clock is None else clock

    def timed(key: str, began: float) -> None:
        clock[key] = clock.get(key, 0.0) + time.monotonic() - began

    runs: list[StepRun] = []
    kernel: Kernel | None = None
    replay: list[Step] = []  # never scenarios: the grader's steps, and the student's cells that ran and did not crash
    restarts = 0
    kept = 0  # output characters kept so far: a flood spread over many cells is still bounded
    sent = 0  # payload characters the scenarios sent so far: bounded for the notebook, as output is
    own_seconds, budget, grace = 0.0, own_cells_budget(timeout), 0.0
    try:
        for step, limit in zip(steps, step_limits(steps, timeout)):
            if kernel is None:
                began = time.monotonic()
                kernel, restarts = _fresh(new_kernel, replay, timeout, restarts, first=not runs)
                timed("kernel start", began)
            if kernel is None:
                run = StepRun(failure=NOT_RUN)
            elif step.added and own_seconds >= budget and (grace >= timeout or not defines_only(step.code)):
                run = StepRun(failure=SKIPPED)
            else:
                run = kernel.run(step.code, limit, store_history=step.history and not step.test)
                if step.added and own_seconds >= budget:
                    grace += run.seconds  # a definition past the budget: together at most about one --timeout
                if run.failure in (KILLED, DIED):
                    began = time.monotonic()
                    kernel.stop()
                    kernel = None
                    timed("kernel stop", began)
            if not step.test and (not step.by_student or run.failure not in (KILLED, DIED, NOT_RUN, SKIPPED)):
                # The grader's own steps (set-up, names, places, the probe) are replayed whatever happened to them:
                # later tests need what they define. _fresh drops one that takes the replaying kernel down too.
                replay.append(step)
            if step.added:
                own_seconds += run.seconds
            if not step.test:  # only a scenario's payloads are read: any other cell's are dropped at once
                run.payloads.clear()
            sent += run.payload_chars if step.test else 0
            if sent > MAX_TOTAL_PAYLOAD_CHARS and run.payloads:
                run.payloads.clear()
                run.failure = run.failure or OUTPUT_LIMIT
            kept += sum(len(json.dumps(out, default=str)) for out in run.outputs)
            if kept > MAX_TOTAL_OUTPUT_CHARS and run.outputs:
                run.outputs.clear()
                run.failure = run.failure or OUTPUT_LIMIT
            runs.append(run)
    finally:
        if kernel is not None:
            began = time.monotonic()
            kernel.stop()
            timed("kernel stop", began)
    return runs


def _fresh(new_kernel: Callable[[], Kernel], replay: list[Step], timeout: float, restarts: int,
           first: bool) -> tuple[Kernel | None, int]:
    """A started kernel with `replay` run in it, or None when the restarts are used up or it will not start.

    A step that takes the replaying kernel down is dropped from `replay`, and the next restart goes on without it:
    a step that kills every kernel costs the steps after it one restart, not every restart."""
    while True:
        if not first:
            if restarts >= MAX_RESTARTS:
                return None, restarts
            restarts += 1
        first = False
        try:
            kernel = new_kernel()
        except Exception:
            return None, restarts
        for index, (step, limit) in enumerate(zip(replay, step_limits(replay, timeout))):
            if kernel.run(step.code, limit, store_history=step.history).failure in (KILLED, DIED):
                kernel.stop()
                del replay[index]
                break
        else:
            return kernel, restarts
