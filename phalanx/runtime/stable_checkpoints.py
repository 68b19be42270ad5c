"""A node's newest durable checkpoint as (index, SHA-256 of its bytes), for node services.

Owns: `StableCheckpoints`, the `ServiceContext.checkpoint` callable `open_node` hands the
services host (the announce service announces what it returns to linked clusters).

Invariants: reads only checkpoints the replica layer made durable (`ReplicaStatus.
checkpoint_index`); hashes each index's stored bytes once, in 1 MiB slices of the file view,
on one worker thread (hashlib releases the GIL: a large state never stalls the event loop),
and until that is done answers the previous result. A checkpoint the store already removed
or cannot read is skipped (the next newer one is tried on the next call).
"""

from __future__ import annotations

import hashlib
from concurrent.futures import Future, ThreadPoolExecutor
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
        self._pool: ThreadPoolExecutor | None = None
        self._job: Future[tuple[int, bytes] | None] | None = None

    def __call__(self) -> tuple[int, bytes] | None:
        job = self._job
        if job is not None:
            if not job.done():
                return self._cached
            self._job = None
            self._cached = job.result() or self._cached
        index = self._replica.status().checkpoint_index
        if index > 0 and (self._cached is None or self._cached[0] < index):
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="checkpoint-digest")
            self._job = self._pool.submit(self._digest, index)
        return self._cached

    def _digest(self, index: int) -> tuple[int, bytes] | None:
        try:
            view = self._store.read_view(index)
            h = hashlib.sha256()
            for at in range(0, len(view), _SLICE):
                h.update(view[at:at + _SLICE])
        except Exception:  # removed under us, an I/O error: try again on the next call
            return None
        return index, h.digest()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


__all__ = ["StableCheckpoints"]
