"""Demo cells that use a student's answer: say "finish exercise N first" instead of a traceback (notebook 01)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def needs_exercise(number: int, name: str) -> Iterator[None]:
    """Run the block; if it stops at an unfinished exercise (NotImplementedError), say which one and go on (notebook 01).

    Only a stub's NotImplementedError is caught: a mistake in a finished answer still shows its traceback.
    """
    try:
        yield
    except NotImplementedError:
        print(f"⏸ This cell uses `{name}`: finish exercise {number} first, then run it again.")
