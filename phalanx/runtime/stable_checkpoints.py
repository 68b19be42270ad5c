"""A node's newest durable checkpoint as (index, SHA-256 of its bytes), for node services.

Owns: `StableCheckpoints`, the `ServiceContext.checkpoint` callable `open_node` hands the
services host (the announce service announces what it returns to linked clusters).

Invariants: reads only checkpoints the replica layer made durable (`ReplicaStatus.
checkpoint_index`); hashes each index's stored bytes once (cached by index), in 1 MiB
slices of the file view, on the caller's task (a service tick). A checkpoint the store
already removed or cannot read gives None (the next newer one is tried on the next call).
"""

from __future__ import annotations

import hashlib
from typing import Protocol

from phalanx.storage.directory import ByteView

_SLICE = 1 << 20


class _Store(Protocol):
    def read_view(self, index: int) -> ByteView: ...


class _Status(Protocol):
    @property
    def checkpoint_index(self) -> int: ...


class _Replica(Protocol):
    def status(self) -> _Status: ...


class StableCheckpoints:
    """``checkpoints()`` -> (index, SHA-256 of checkpoint `index`'s data) or None."""

    def __init__(self, store: _Store, replica: _Replica) -> None:
        self._store = store
        self._replica = replica
        self._cached: tuple[int, bytes] | None = None

    def __call__(self) -> tuple[int, bytes] | None:
        index = self._replica.status().checkpoint_index
        if index <= 0:
            return None
        if self._cached is not None and self._cached[0] == index:
            return self._cached
        try:
            view = self._store.read_view(index)
            h = hashlib.sha256()
            for at in range(0, len(view), _SLICE):
                h.update(view[at:at + _SLICE])
        except Exception:  # removed under us, an I/O error: try again on the next call
            return None
        self._cached = (index, h.digest())
        return self._cached


__all__ = ["StableCheckpoints"]
