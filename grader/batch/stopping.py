"""Stopping a batch for good: every process it started, however deep, and the temporary folders they leave.

Ctrl-C and SIGTERM (what a cluster scheduler sends) both stop `autograde` within seconds. Workers run in
sessions of their own (so a terminal's Ctrl-C reaches only the parent, which decides), and kernels in
sessions and namespaces of their own; none of them is reached by a signal to a process group. So the
parent takes the tree of its descendants from /proc, stops each process (SIGSTOP: no more forks), then kills
them all; a worker whose parent died does the same to its own tree.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path


def _children_of() -> dict[int, list[int]]:
    """Every process's children, from each process's parent in /proc (where no task lists its children)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            children.setdefault(int(stat.rsplit(")", 1)[1].split()[1]), []).append(int(entry))
    return children


def descendants(pid: int) -> list[int]:
    """Every live process below `pid`, parents before their children."""
    listed = Path(f"/proc/{pid}/task/{pid}/children").exists()  # CONFIG_PROC_CHILDREN
    table = {} if listed else _children_of()
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        children = table.get(parent, [])
        for task in Path(f"/proc/{parent}/task").glob("*") if listed else ():
            try:
                children += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
        found += children
        todo += children
    return found


def kill_tree(pid: int, *, include_self: bool = False) -> int:
    """Stop and kill every process below `pid` (and `pid` itself); how many were killed."""
    victims: list[int] = []
    for _ in range(3):  # a process forked while the tree was read is caught by the next reading
        fresh = [p for p in descendants(pid) if p not in victims]
        if not fresh:
            break
        for victim in fresh:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(victim, signal.SIGSTOP)
        victims += fresh
    if include_self:
        victims.append(pid)
    for victim in victims:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(victim, signal.SIGKILL)
    return len(victims)


class Interrupted(Exception):
    """The batch was stopped (Ctrl-C or SIGTERM); what was graded before stays in the cache."""

    def __init__(self, how: str, kept: int) -> None:
        super().__init__(f"{how}: stopped; {kept} hand-in(s) graded in this run are kept, the ones in progress "
                         "are not recorded; run the same command again to continue")
        self.how, self.kept = how, kept


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While inside, SIGTERM raises KeyboardInterrupt in the main thread, as Ctrl-C does."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def deferred_interrupts() -> Iterator[list[int]]:
    """While inside, Ctrl-C and SIGTERM are noted (in the list it yields), not raised: the clean-up that stops a
    batch is not itself stopped half-way by a second Ctrl-C, leaving processes or folders behind."""
    if threading.current_thread() is not threading.main_thread():
        yield []
        return
    caught: list[int] = []

    def note(signum: int, frame: object) -> None:
        caught.append(signum)

    previous = {sig: signal.signal(sig, note) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield caught
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def die_with_parent(poll_s: float = 0.5) -> None:
    """In a worker: when its parent dies (even by SIGKILL), kill this process and everything below it."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        kill_tree(os.getpid(), include_self=True)

    threading.Thread(target=watch, name="die-with-parent", daemon=True).start()
