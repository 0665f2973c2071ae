"""What a test's place keeps of the notebook's names (harness.position_code sends `copy_plain`'s source into the
kernel and runs it there, at each test cell's place).
"""

from __future__ import annotations

MAX_COPIED_ITEMS = 10_000  # per test's place: the items of plain data position_code copies (see copy_plain)


def copy_plain(names: dict, budget: int = MAX_COPIED_ITEMS) -> dict:
    """`names` with each dict, list, set or tuple that holds only plain data (numbers, strings, bytes, None and such
    containers) copied, deep, while `budget` items last; everything else (tensors, models, functions, larger
    containers) is the same object. Runs in the kernel (position_code sends its source): a scratch cell below a test
    that changes such a dict in place then changes nothing for that test."""
    import copy

    plain = (str, bytes, int, float, complex, bool, type(None))
    containers = (dict, list, set, tuple)

    def items(value: object, left: int, depth: int) -> int:
        """How many items `value` holds, all plain and at most `left`; -1 when not."""
        if type(value) in plain:
            return 0
        if type(value) not in containers or depth > 8 or len(value) > left:  # type: ignore[arg-type]
            return -1
        inside = [*value.keys(), *value.values()] if type(value) is dict else list(value)  # type: ignore[call-overload]
        total = len(inside)
        for item in inside:
            count = items(item, left - total, depth + 1)
            if count < 0:
                return -1
            total += count
        return total if total <= left else -1

    memo: dict = {}  # shared: two names for one dict stay one dict
    copied = dict(names)
    for name, value in names.items():
        if type(value) in containers and (count := items(value, budget, 0)) >= 0:
            budget -= count
            copied[name] = copy.deepcopy(value, memo)
    return copied
