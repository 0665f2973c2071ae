"""Memory that exists only because autograd graphs saved it, counted with saved_tensors_hooks (notebook 04).

A tool for leak hunting, not a byte count of what a function saves: the meter leaves out every storage
that existed before its block started (inputs, parameters, the caller's data) — those stay alive
whether a graph holds them or not — and counts the new storages that some graph still holds now.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from types import TracebackType

import torch
from torch.autograd.graph import saved_tensors_hooks
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


def _storage_ptr(tensor: object) -> int | None:
    """The data pointer of a strided tensor's storage; None for anything else (sparse, meta, not a tensor)."""
    if not isinstance(tensor, torch.Tensor) or tensor.layout != torch.strided or tensor.device.type == "meta":
        return None
    try:
        return tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None


class _NewStorages(TorchDispatchMode):
    """Records the storages that operations allocate while active: outputs that alias no input."""

    def __init__(self) -> None:
        super().__init__()
        self.created: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = {_storage_ptr(t) for t in tree_leaves((args, kwargs))}
        for t in tree_leaves(out):
            ptr = _storage_ptr(t)
            if ptr and ptr not in inputs:  # a view, an in-place result or a detach() shares an input's storage
                self.created.add(ptr)
        return out


class _Saved:
    """What the pack hook stores in the graph: a detached alias of the saved tensor (no reference cycle)."""

    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


class SavedTensorMeter:
    """Bytes that graphs built inside the `with` block hold for backward in storages the block created (notebook 04).

    Each saved tensor is wrapped in a small object that the graph owns; when the graph is freed (after
    `backward()`, or when the last reference to its output goes away) the wrapper goes with it. So
    `live_bytes()` answers "how much memory is alive right now only because a graph saved it?", on CPU or
    GPU, each storage counted once. A storage that existed before the block (an input, a parameter, a
    buffer, any tensor the caller already had) is never counted: it lives on without the graph. Tensors in
    `exclude` are left out as well (kept for callers that name them; such tensors existed before the block).
    """

    def __init__(self, exclude: Iterable[torch.Tensor] = ()) -> None:
        self._live: weakref.WeakSet[_Saved] = weakref.WeakSet()
        self._excluded = {t.untyped_storage().data_ptr() for t in exclude}
        self._hooks = saved_tensors_hooks(self._pack, self._unpack)
        self._new = _NewStorages()

    def _pack(self, tensor: torch.Tensor) -> _Saved:
        saved = _Saved(tensor.detach())
        self._live.add(saved)
        return saved

    @staticmethod
    def _unpack(saved: _Saved) -> torch.Tensor:
        return saved.tensor

    def _counted(self) -> dict[int, int]:
        storages = (saved.tensor.untyped_storage() for saved in list(self._live))
        return {s.data_ptr(): s.nbytes() for s in storages
                if s.data_ptr() in self._new.created and s.data_ptr() not in self._excluded}

    def live_bytes(self) -> int:
        """Bytes of the distinct storages, created inside the block, that some graph still holds for backward."""
        return sum(self._counted().values())

    def live_count(self) -> int:
        """How many saved tensors (not storages) graphs still hold in storages created inside the block."""
        counted = self._counted()
        return sum(saved.tensor.untyped_storage().data_ptr() in counted for saved in list(self._live))

    def __enter__(self) -> SavedTensorMeter:
        self._new.__enter__()
        self._hooks.__enter__()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._hooks.__exit__(exc_type, exc, tb)
        self._new.__exit__(exc_type, exc, tb)
