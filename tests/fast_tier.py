"""The fast tier's promise (`./course test --fast`: neither slow nor integration): it starts no process but graphviz's
renderer. Hooks, not a fixture, so that fixtures of every scope a fast test sets up are held to it too (a
module-scoped fixture is set up before any function-scoped one). tests/conftest.py imports the hooks.

Nothing here is a test.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator

import pytest

FAST_TIER_MAY_START = {"dot"}


@contextlib.contextmanager
def _starts_no_process(item: pytest.Item) -> Iterator[None]:
    """Fail a test of the fast tier that starts a kernel, a Python process or nbgrader: it belongs in `integration`."""
    if item.get_closest_marker("slow") or item.get_closest_marker("integration"):
        yield
        return
    popen_init, fork = subprocess.Popen.__init__, os.fork

    def refuse(what: str) -> None:
        # pytest.fail raises a BaseException: no `except Exception` in the code under test swallows it
        pytest.fail(f"{item.nodeid} starts {what}: mark it @pytest.mark.integration (or slow)", pytrace=False)

    def checked_popen(self, args, *rest, **kwargs):
        argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
        program = os.path.basename(os.fsdecode(argv[0]).split()[0]) if argv else ""
        if program not in FAST_TIER_MAY_START:
            refuse(f"a process ({program})")
        popen_init(self, args, *rest, **kwargs)

    def checked_fork():
        refuse("a process (os.fork)")
        return fork()

    subprocess.Popen.__init__, os.fork = checked_popen, checked_fork  # type: ignore[method-assign]
    try:
        yield
    finally:
        subprocess.Popen.__init__, os.fork = popen_init, fork  # type: ignore[method-assign]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    with _starts_no_process(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    with _starts_no_process(item):
        return (yield)
