"""Piece manifests: what a Raft leader's core sends a lagging follower instead of the whole
checkpoint, when the node runs shard-level state transfer (`ProtocolSpec.piece_transfer`).

Owns: the manifest layout (below), `PieceManifest`, `ManifestData` (the `SnapshotData` a
core is handed: the manifest bytes, pinning the checkpoint's packs while it lives) and
`ManifestViews` (a checkpoint store whose `read_view` gives `ManifestData` for a
content-addressed checkpoint, so the writer and the restart path hand the core manifests).
Must not import: trio, sockets, consensus cores.

Layout (integers little-endian): b"PHXPMAN1" | u64 index | u64 data_len | u32 count |
count x (sha256 (32) | u32 length) | u32 crc32(all before). The checkpoint's data is the
concatenation of the pieces in order (`FileCheckpointStore.piece_list`); each piece is
checked against its SHA-256 when fetched (`phalanx.runtime.piece_transfer`).

Invariants: a core relays these bytes unread (Raft: InstallSnapshot chunks); only the
runtime encodes and decodes them. `decode` returns the reason for any malformed input, never
raises. A manifest names pieces its sender's store holds while the `ManifestData` lives.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from phalanx.storage.directory import ByteView
from phalanx.storage.interface import CheckpointStore, LoadedCheckpoint, Piece, StorageError
from phalanx.storage.interface import StoredCheckpoint as StoredCheckpoint

MAGIC = b"PHXPMAN1"
_HEAD = struct.Struct("<8sQQI")  # magic, index, data_len, count
_ENTRY = struct.Struct("<32sI")  # sha256, length
MAX_PIECES = 1 << 22
"""More pieces than any checkpoint has (4M; 1M keys are ~1,000 shards): a bound on input."""


@dataclass(frozen=True, slots=True)
class PieceManifest:
    """Checkpoint `index` (the state after applying it) is `pieces` concatenated, each
    (SHA-256, length), `data_len` bytes in all."""

    index: int
    data_len: int
    pieces: tuple[tuple[bytes, int], ...]


def encode(index: int, pieces: Sequence[tuple[bytes, int]]) -> bytes:
    body = b"".join([_HEAD.pack(MAGIC, index, sum(n for _, n in pieces), len(pieces)),
                     *(_ENTRY.pack(d, n) for d, n in pieces)])
    return body + zlib.crc32(body).to_bytes(4, "little")


def is_manifest(data: bytes) -> bool:
    """Whether `data` (a received snapshot's bytes) claims to be a manifest."""
    return data[:8] == MAGIC


def decode(raw: bytes) -> PieceManifest | str:
    """The manifest in `raw`, or why it is not one."""
    if len(raw) < _HEAD.size + 4 or raw[:8] != MAGIC:
        return "not a piece manifest"
    body = memoryview(raw)[:-4]
    if zlib.crc32(body) != int.from_bytes(raw[-4:], "little"):
        return "piece manifest checksum mismatch"
    _, index, data_len, count = _HEAD.unpack_from(raw)
    if count > MAX_PIECES or _HEAD.size + count * _ENTRY.size != len(body):
        return "piece manifest length does not match its count"
    pieces = tuple(_ENTRY.iter_unpack(body[_HEAD.size:]))
    if sum(n for _, n in pieces) != data_len:
        return "piece manifest lengths do not add up"
    return PieceManifest(index=index, data_len=data_len,
                         pieces=tuple((bytes(d), n) for d, n in pieces))


class ManifestData:
    """A checkpoint as a core relays it: the manifest's bytes (`len`, slicing), holding
    `pinned` (the store's view of the checkpoint) so its packs outlive a newer checkpoint
    while a follower may still fetch them."""

    __slots__ = ("pinned", "raw")

    def __init__(self, raw: bytes, pinned: object) -> None:
        self.raw = raw
        self.pinned = pinned

    def __len__(self) -> int:
        return len(self.raw)

    def __getitem__(self, key: slice, /) -> bytes:
        return self.raw[key]

    def __repr__(self) -> str:
        return f"ManifestData({len(self.raw)} bytes)"


@runtime_checkable
class PieceStore(Protocol):
    """A content-addressed checkpoint store's piece side (`FileCheckpointStore`)."""

    def piece_list(self, index: int) -> tuple[bytes, list[tuple[bytes, int]]]: ...

    def lacks(self, digests: Iterable[bytes]) -> list[bytes]: ...

    def read_piece(self, digest: bytes) -> bytes: ...

    def read_piece_range(self, digest: bytes, offset: int, length: int) -> bytes: ...


class ManifestViews:
    """`store`, except that `read_view` of a content-addressed checkpoint is its manifest
    (`ManifestData`, pinning the real view); other checkpoints (v1, v2) are their bytes'
    view as before, and are sent whole."""

    def __init__(self, store: CheckpointStore) -> None:
        self._store = store

    def save(self, checkpoint: StoredCheckpoint) -> None:
        self._store.save(checkpoint)

    def save_stream(self, index: int, meta: bytes, chunks: Iterable[bytes | Piece]) -> int:
        return self._store.save_stream(index, meta, chunks)

    def load_latest(self) -> LoadedCheckpoint:
        return self._store.load_latest()

    def indexes(self) -> list[int]:
        return self._store.indexes()

    def read_view(self, index: int) -> ByteView:
        view = self._store.read_view(index)
        if not isinstance(self._store, PieceStore):
            return view
        try:
            _, pieces = self._store.piece_list(index)
        except StorageError:  # not content-addressed (v1, v2): sent whole
            return view
        return ManifestData(encode(index, pieces), view)
