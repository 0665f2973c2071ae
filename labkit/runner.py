"""Run a notebook with nbclient, without its occasional stall after a widget cell.

nbclient waits for a cell's reply with one long poll of the kernel's socket; now and then (nbclient issue
#312, seen here after ipywidgets cells) that poll misses the reply and sleeps until the cell's whole
timeout runs out — minutes with no error. `NotebookRunner` polls in short slices instead, so a missed
wake-up costs a fraction of a second.
"""

from __future__ import annotations

import inspect
import time
from queue import Empty
from typing import Any

from nbclient import NotebookClient

SLICE_S = 0.5


def _sliced(get_msg: Any) -> Any:
    async def get_msg_in_slices(timeout: float | None = None) -> dict[str, Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = SLICE_S if deadline is None else max(0.0, min(SLICE_S, deadline - time.monotonic()))
            try:
                reply = get_msg(timeout=left)  # a blocking client answers at once; an async one is awaited
                return await reply if inspect.isawaitable(reply) else reply
            except Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    raise

    return get_msg_in_slices


class NotebookRunner(NotebookClient):
    """nbclient's NotebookClient, with the shell and iopub channels polled in slices of SLICE_S (notebook 00)."""

    async def async_start_new_kernel_client(self) -> Any:
        client = await super().async_start_new_kernel_client()
        for channel in (client.shell_channel, client.iopub_channel):
            channel.get_msg = _sliced(channel.get_msg)
        return client
