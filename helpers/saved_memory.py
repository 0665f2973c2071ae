"""Bytes of tensors saved for backward that are still alive, counted with saved_tensors_hooks (notebook 04)."""

from __future__ import annotations

import weakref
from types import TracebackType

import torch
from torch.autograd.graph import saved_tensors_hooks


class _Saved:
    """What the pack hook stores in the graph: a detached alias of the saved tensor (no reference cycle)."""

    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


class SavedTensorMeter:
    """Counts the tensors that graphs built inside the `with` block save for backward, while they live (notebook 04).

    Each saved tensor is wrapped in a small object that the graph owns; when the graph is freed (after
    `backward()`, or when the last reference to its output goes away) the wrapper goes with it. So
    `live_bytes()` answers "how much memory are autograd graphs holding right now?", on CPU or GPU, each
    storage counted once. Tensors in `exclude` (for example a model's parameters) are left out.
    """

    def __init__(self, exclude: object = ()) -> None:
        self._live: weakref.WeakSet[_Saved] = weakref.WeakSet()
        self._excluded = {t.untyped_storage().data_ptr() for t in exclude}  # type: ignore[attr-defined]
        self._hooks = saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, tensor: torch.Tensor) -> _Saved:
        saved = _Saved(tensor.detach())
        if tensor.untyped_storage().data_ptr() not in self._excluded:
            self._live.add(saved)
        return saved

    @staticmethod
    def _unpack(saved: _Saved) -> torch.Tensor:
        return saved.tensor

    def live_bytes(self) -> int:
        """Bytes of the distinct storages saved for backward that some graph still holds."""
        distinct = {s.data_ptr(): s.nbytes() for s in (saved.tensor.untyped_storage() for saved in list(self._live))}
        return sum(distinct.values())

    def live_count(self) -> int:
        """How many saved tensors (not storages) graphs still hold."""
        return len(self._live)

    def __enter__(self) -> SavedTensorMeter:
        self._hooks.__enter__()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._hooks.__exit__(exc_type, exc, tb)
