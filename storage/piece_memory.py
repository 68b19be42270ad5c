"""Checkpoint pieces kept in memory within a byte budget: what a node serves its peers'
piece requests from (shard-level state transfer, `phalanx.runtime.piece_transfer`) before
its pack files, so a wiped peer's recovery reads this node's memory, not its disk.

Owns: `PieceMemory` (the bounded map from SHA-256 to piece bytes and its counters).
Must not import: `phalanx.consensus`, `os`, trio (the store fills it from its saving and
loading threads; the serving thread reads it).

Filled by `phalanx.storage.checkpoint.FileCheckpointStore`: every piece a save writes, every
piece a load reads and checks, and (marked used) every piece a save finds already stored; so
within the budget it holds the newest checkpoint's pieces, the least recently stored or used
leaving first. The store drops what it no longer holds (`keep_only`), so memory never serves
a piece the store would answer "not held" for.

Invariants: at most `budget` bytes of piece data are held (a piece larger than the budget
never is); a held piece's bytes are the ones the store wrote or read and checked under that
digest; thread-safe (one lock, held only for dictionary work, never for I/O or hashing).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Container

__all__ = ["PieceMemory"]


class PieceMemory:
    """Piece bytes by SHA-256, least recently stored or used evicted first (module
    docstring). `budget` 0 holds nothing."""

    __slots__ = ("_budget", "_lock", "_pieces", "_size", "hit_bytes", "hits", "misses")

    def __init__(self, budget: int) -> None:
        if budget < 0:
            raise ValueError(f"piece memory budget must be >= 0, got {budget}")
        self._budget = budget
        self._lock = threading.Lock()
        self._pieces: OrderedDict[bytes, bytes] = OrderedDict()
        self._size = 0
        self.hits = 0
        self.hit_bytes = 0
        self.misses = 0

    @property
    def budget(self) -> int:
        return self._budget

    @property
    def size(self) -> int:
        """Bytes of piece data held."""
        return self._size

    def __len__(self) -> int:
        return len(self._pieces)

    def __contains__(self, digest: object) -> bool:
        return digest in self._pieces

    def put(self, digest: bytes, raw: bytes) -> None:
        """Hold `raw` (the piece named `digest`), evicting the least recent beyond the
        budget; a piece larger than the whole budget is not held."""
        if len(raw) > self._budget:
            return
        with self._lock:
            old = self._pieces.pop(digest, None)
            if old is not None:
                self._size -= len(old)
            self._pieces[digest] = raw
            self._size += len(raw)
            while self._size > self._budget:
                _, gone = self._pieces.popitem(last=False)
                self._size -= len(gone)

    def touch(self, digest: bytes) -> None:
        """Mark a held piece as just used (a save reused it: it is in the newest checkpoint)."""
        with self._lock:
            if digest in self._pieces:
                self._pieces.move_to_end(digest)

    def get(self, digest: bytes) -> bytes | None:
        """The held piece's bytes, or None (counted as a hit or a miss)."""
        with self._lock:
            raw = self._pieces.get(digest)
            if raw is None:
                self.misses += 1
                return None
            self._pieces.move_to_end(digest)
            self.hits += 1
            return raw

    def count_served(self, n: int) -> None:
        """`n` bytes of a hit were served (a range of the piece)."""
        self.hit_bytes += n

    def keep_only(self, digests: Container[bytes]) -> None:
        """Drop every piece not in `digests` (the store no longer holds it)."""
        with self._lock:
            for digest in [d for d in self._pieces if d not in digests]:
                self._size -= len(self._pieces.pop(digest))
