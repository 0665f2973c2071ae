"""labkit.runner: replies are looked for in short slices, and a timeout still ends in Empty."""

import asyncio
import time
from queue import Empty

import pytest

from labkit import runner


def test_a_reply_that_a_slice_missed_is_found_by_the_next(monkeypatch):
    monkeypatch.setattr(runner, "SLICE_S", 0.01)
    calls = []

    async def get_msg(timeout=None):
        calls.append(timeout)
        if len(calls) < 3:
            raise Empty
        return {"msg_type": "execute_reply"}

    reply = asyncio.run(runner._sliced(get_msg)(timeout=300))
    assert reply == {"msg_type": "execute_reply"} and len(calls) == 3 and max(calls) <= 0.01


def test_the_whole_timeout_still_ends_in_empty(monkeypatch):
    monkeypatch.setattr(runner, "SLICE_S", 0.01)

    async def never(timeout=None):
        await asyncio.sleep(timeout or 0)
        raise Empty

    began = time.monotonic()
    with pytest.raises(Empty):
        asyncio.run(runner._sliced(never)(timeout=0.05))
    assert time.monotonic() - began < 1


def test_a_blocking_client_is_polled_the_same_way(monkeypatch):
    monkeypatch.setattr(runner, "SLICE_S", 0.01)
    replies = iter([Empty, Empty, {"msg_type": "kernel_info_reply"}])

    def get_msg(timeout=None):  # what a BlockingKernelClient's channel does
        reply = next(replies)
        if reply is Empty:
            raise Empty
        return reply

    assert asyncio.run(runner._sliced(get_msg)(timeout=5)) == {"msg_type": "kernel_info_reply"}
