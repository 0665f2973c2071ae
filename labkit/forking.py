"""Forking a child that runs one function and exits with its status, never returning into the parent's code.

Used wherever a warm process forks a worker: the grader's fork server for each stage of a submission's
sandbox (grader/kernel/), and notebook 07's rank server (labkit/rank_server.py) for each rank. Standard
library only: it runs inside the student's kernel too.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable


def exit_code(exc: SystemExit) -> int:
    """The status `sys.exit(value)` asks for: an int as is, None as 0, anything else (a message) as 1."""
    return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)


def fork_child(become: Callable[[], int | None],
               on_error: Callable[[BaseException], None] = lambda exc: traceback.print_exc()) -> int:
    """Fork; the child runs `become()` and exits with what it returns (None: 0), its `SystemExit`'s status
    (a message is printed, as by the interpreter), or 1 after `on_error(exception)` (by default the
    traceback on stderr). Returns the child's pid to the parent.

    The child leaves through `os._exit`, so no `finally` or `atexit` of the parent's code runs twice.
    """
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        result = become()
        code = 0 if result is None else result
    except SystemExit as exc:
        code = exit_code(exc)
        if not isinstance(exc.code, int) and exc.code is not None:
            print(exc.code, file=sys.stderr)  # as the interpreter does for sys.exit("message")
    except BaseException as exc:
        on_error(exc)
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass
        os._exit(code)
