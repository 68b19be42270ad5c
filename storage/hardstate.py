"""Durable hard state (term, vote, view, commit — as opaque bytes) over a `Directory`.

Owns: `FileHardStateStore` (implements `HardStateStore`) and its one-file format.
Must not import: `phalanx.consensus` (the caller encodes `HardState`), `os`, clocks.

Format of `hardstate`: `b"PHXHS001" | u32 length | u32 crc32(magic, length, value) | value`.
Save protocol: write `hardstate.tmp`, fsync it, rename over `hardstate`, fsync the directory.
A crash at any point leaves either the old or the new value, never a mix; a stray
`hardstate.tmp` is an interrupted save and is ignored.
Load protocol: the first `load` of a store (under a durable policy) fsyncs `hardstate` and
the directory before returning the value. A previous process may have died after the rename
and before the directory fsync: the new value is readable but not durable, and a power loss
after this process acted on it (granted the same vote again, say) would bring back the old
term and vote, so the node could vote twice in one term.

Invariant: `load` never returns bytes that fail the checksum; it raises `CorruptionError`
(CTRL: a voter with corrupt term/vote must not vote until repaired).
"""

from __future__ import annotations

import struct
import zlib

from phalanx.storage.directory import Directory
from phalanx.storage.interface import CorruptionError, StorageError, SyncPolicy

HARD_STATE_NAME = "hardstate"
_TMP = "hardstate.tmp"
_MAGIC = b"PHXHS001"
_HEAD = struct.Struct("<8sII")
MAX_HARD_STATE_BYTES = 1 << 20


def encode_hard_state(value: bytes) -> bytes:
    head = _MAGIC + len(value).to_bytes(4, "little")
    crc = zlib.crc32(value, zlib.crc32(head))
    return head + crc.to_bytes(4, "little") + value


def decode_hard_state(data: bytes, *, path: str) -> bytes:
    """The value in a hard-state file's bytes. Raises `CorruptionError`."""
    if len(data) < _HEAD.size:
        raise CorruptionError(f"hard state has {len(data)} bytes, too short", path=path,
                              offset=0)
    magic, length, crc = _HEAD.unpack_from(data)
    if magic != _MAGIC:
        raise CorruptionError("hard state has a bad magic number", path=path, offset=0)
    value = data[_HEAD.size:]
    if length != len(value) or zlib.crc32(value, zlib.crc32(data[:12])) != crc:
        raise CorruptionError("hard state fails its checksum", path=path, offset=0)
    return value


class FileHardStateStore:
    """A `HardStateStore` in one atomically replaced file of a `Directory`.

    With `SyncPolicy.OFF` the replacement is still atomic but not durable.
    """

    __slots__ = ("_dir", "_settled", "_sync")

    def __init__(self, directory: Directory, *, sync: SyncPolicy = SyncPolicy.GROUP) -> None:
        self._dir = directory
        self._sync = sync
        self._settled = sync is SyncPolicy.OFF  # whether what `load` reads is known durable

    def load(self) -> bytes | None:
        """The saved value, or None if none was ever saved. The first call makes what it
        reads durable (module docstring, load protocol).

        Raises:
            CorruptionError: the file fails its checksum.
            StorageError: making it durable failed.
        """
        if HARD_STATE_NAME not in self._dir.list():
            return None
        value = decode_hard_state(self._dir.read(HARD_STATE_NAME),
                                  path=self._dir.path(HARD_STATE_NAME))
        if not self._settled:
            try:
                self._dir.fsync(HARD_STATE_NAME)
                self._dir.release(HARD_STATE_NAME)
                self._dir.fsync_dir()
            except OSError as e:
                raise StorageError(f"making the hard state durable failed: {e}") from e
            self._settled = True
        return value

    def save(self, value: bytes) -> None:
        """Replace the value durably and atomically.

        Raises:
            StorageError: the value is larger than `MAX_HARD_STATE_BYTES`, or I/O failed
                (the previous value is then still the one `load` returns).
        """
        if len(value) > MAX_HARD_STATE_BYTES:
            raise StorageError(f"hard state of {len(value)} bytes is too large")
        durable = self._sync is not SyncPolicy.OFF
        try:
            self._dir.create(_TMP)
            self._dir.append(_TMP, encode_hard_state(value))
            if durable:
                self._dir.fsync(_TMP)
            self._dir.rename(_TMP, HARD_STATE_NAME)
            if durable:
                self._dir.fsync_dir()
                self._settled = True
        except OSError as e:
            raise StorageError(f"saving hard state failed: {e}") from e
