"""The storage interfaces: a write-ahead log of indexed records, durable hard state, and a
checkpoint store. Two backends implement them: files (`wal.py`, `hardstate.py`,
`checkpoint.py`) and memory with fault injection (`memory.py`, for the simulator).

Rules:
- Payloads are opaque bytes; encoding entries is the caller's job (`phalanx.net.codec`).
- Durability is explicit: nothing is durable until `sync()` returns (or the fsync policy did
  it). A crash may lose any un-synced suffix of the log, never a synced record.
- Recovery returns only durable state: what a previous process wrote but never fsynced (it
  died between the write and the fsync; the page cache still holds it) is made durable
  before it is returned (opening the WAL, the first hard-state load, the first checkpoint
  load), so no later power loss takes back what the restarted node acted on.
- Recovery never returns a corrupt record. A torn tail (a crash during the last append) is
  cut off silently; corruption followed by valid records is an error naming the file and
  offset (`CorruptionError`), and repair is an explicit, separate action.
- Log indexes are contiguous: `append` takes `last_index() + 1` (or any index right after a
  compaction point when the log is empty).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from phalanx.storage.directory import ByteView


class StorageError(Exception):
    """Base of every storage error."""


class CorruptionError(StorageError):
    """Persisted data failed its checksum where a crash cannot explain it.

    Attributes:
        path: the file (or memory object name) holding the bad record.
        offset: byte offset of the bad record in that file.
    """

    def __init__(self, message: str, *, path: str, offset: int) -> None:
        super().__init__(f"{message} (file {path}, offset {offset})")
        self.path = path
        self.offset = offset


class SyncPolicy(enum.Enum):
    """When the WAL fsyncs."""

    EVERY_WRITE = "every-write"
    """fsync inside every `append`: simplest, slowest."""
    GROUP = "group"
    """The caller batches appends and calls `sync()` once per batch (group commit)."""
    OFF = "off"
    """Never fsync (tests, benchmarks of the rest of the stack). Not crash-safe."""


class WriteAheadLog(Protocol):
    """An append-only sequence of (index, payload) records with suffix truncation and prefix
    compaction."""

    def first_index(self) -> int:
        """The lowest index still held, or `last_index() + 1` when the log is empty."""
        ...

    def last_index(self) -> int:
        """The highest index appended (and not truncated); the compaction point when empty."""
        ...

    def append(self, index: int, payload: bytes) -> None:
        """Append one record. Raises `StorageError` unless `index == last_index() + 1`."""
        ...

    def append_many(self, records: Sequence[tuple[int, bytes]]) -> None:
        """Append contiguous records (one write where the backend can)."""
        ...

    def read(self, lo: int, hi: int) -> list[bytes]:
        """Payloads of indexes lo..hi-1; raises `StorageError` outside the held range."""
        ...

    def truncate_suffix(self, from_index: int) -> None:
        """Drop every record with index >= from_index (a log conflict). Durable at next sync."""
        ...

    def compact_prefix(self, upto_index: int) -> None:
        """Drop every record with index <= upto_index (after a durable checkpoint).

        Compacting past `last_index()` empties the log and moves its start to upto_index + 1.
        """
        ...

    def sync(self) -> None:
        """Make everything written so far durable."""
        ...

    def rewind(self) -> None:
        """After an I/O error: cut the log back to its last durable record and make it
        usable again (raises `StorageError` if that fails too)."""
        ...

    def reset(self, compacted: int, *, lost: str | None = None) -> None:
        """Drop every record; the log restarts empty after `compacted` (even one below the
        current compaction point), durably. `lost`: record first that the log lost records."""
        ...

    def lost(self) -> str | None:
        """Why the log lost records it once held (repair, or a reset with `lost`), or None."""
        ...

    def clear_lost(self) -> None:
        """Forget that the log lost records (the node recovered them from its peers)."""
        ...

    def close(self) -> None: ...


class Piece(Protocol):
    """A piece of a checkpoint stream known by its SHA-256 before its bytes are made (an app's
    content-defined shard). A content-addressed store that already holds `digest` never calls
    `data`; `data()` must return bytes whose SHA-256 is `digest` (the producer's promise)."""

    @property
    def digest(self) -> bytes: ...

    def data(self) -> bytes: ...


@dataclass(frozen=True, slots=True)
class StoredCheckpoint:
    """A stored checkpoint: the state after applying `index`, and opaque metadata bytes the
    caller chose to keep beside it (e.g. the encoded `SnapshotMeta`)."""

    index: int
    data: bytes
    meta: bytes = b""


@dataclass(frozen=True, slots=True)
class LoadedCheckpoint:
    """The result of loading: the newest *valid* checkpoint, and the problems met on the way.

    `problems` is non-empty when a newer checkpoint was found corrupt and skipped; callers
    must report it (log it, expose it in status), never hide it.
    """

    checkpoint: StoredCheckpoint | None
    problems: tuple[str, ...] = ()


class CheckpointStore(Protocol):
    """Checksummed checkpoints written atomically; keeps the newest `keep` of them."""

    def save(self, checkpoint: StoredCheckpoint) -> None:
        """Write durably and atomically (temp file, fsync, rename, fsync directory)."""
        ...

    def save_stream(self, index: int, meta: bytes, chunks: Iterable[bytes | Piece]) -> int:
        """As `save`, for data that arrives in steps (never held whole): the concatenation
        of the chunks, a `Piece` standing for its `data()`; returns the data's length."""
        ...

    def load_latest(self) -> LoadedCheckpoint: ...

    def read_view(self, index: int) -> ByteView:
        """The data of stored checkpoint `index` as a read-only view that may read the disk
        on demand instead of holding the bytes (`phalanx.storage.directory.ByteView`); it
        stays valid after the checkpoint is removed. Raises `StorageError` if it is absent."""
        ...

    def indexes(self) -> list[int]:
        """Indexes of the stored checkpoints, ascending (valid or not)."""
        ...


class HardStateStore(Protocol):
    """One small record (encoded hard state), replaced atomically and durably."""

    def load(self) -> bytes | None:
        """The last saved value, or None if none was ever saved. Raises `CorruptionError` when
        the stored value fails its checksum (a voter with corrupt term/vote must not vote)."""
        ...

    def save(self, value: bytes) -> None: ...
