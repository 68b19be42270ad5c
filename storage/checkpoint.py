"""Checkpoints stored as checksummed files written atomically, over a `Directory`.

Owns: `FileCheckpointStore` (implements `CheckpointStore`) and the checkpoint file format.
Must not import: `phalanx.consensus`, `phalanx.apps` (checkpoints are opaque bytes), `os`.

File `checkpoint-<index, 20 digits>.ckpt`:
    b"PHXCKP01" | u64 index | u32 meta_len | u64 data_len | u32 crc32(all but this field) |
    meta | data
Save protocol: write `<name>.tmp`, fsync, rename to `<name>`, fsync the directory, then
remove the oldest beyond `keep`. A crash leaves the previous set plus, at most, a stray temp
file (ignored, and removed by the next save).

Invariant: `load_latest` returns only a checkpoint whose checksum, lengths and index match;
every newer checkpoint it skipped is named in `problems` (reported, never hidden).
"""

from __future__ import annotations

import struct
import zlib

from phalanx.storage.directory import ByteView, Directory
from phalanx.storage.interface import Checkpoint, LoadedCheckpoint, StorageError, SyncPolicy

CHECKPOINT_PREFIX = "checkpoint-"
CHECKPOINT_SUFFIX = ".ckpt"
_TMP_SUFFIX = ".tmp"
_MAGIC = b"PHXCKP01"
_HEAD = struct.Struct("<8sQIQ")  # magic, index, meta_len, data_len; then u32 crc
_HEADER_SIZE = _HEAD.size + 4


def checkpoint_name(index: int) -> str:
    return f"{CHECKPOINT_PREFIX}{index:020d}{CHECKPOINT_SUFFIX}"


def _parse_name(name: str) -> int | None:
    if not (name.startswith(CHECKPOINT_PREFIX) and name.endswith(CHECKPOINT_SUFFIX)):
        return None
    digits = name[len(CHECKPOINT_PREFIX):-len(CHECKPOINT_SUFFIX)]
    return int(digits) if len(digits) == 20 and digits.isdigit() else None


def encode_header(checkpoint: Checkpoint) -> bytes:
    head = _HEAD.pack(_MAGIC, checkpoint.index, len(checkpoint.meta), len(checkpoint.data))
    crc = zlib.crc32(checkpoint.data, zlib.crc32(checkpoint.meta, zlib.crc32(head)))
    return head + crc.to_bytes(4, "little")


def decode_checkpoint(raw: bytes) -> Checkpoint | str:
    """The checkpoint in a file's bytes, or why it is invalid."""
    if len(raw) < _HEADER_SIZE:
        return f"only {len(raw)} bytes"
    magic, index, meta_len, data_len = _HEAD.unpack_from(raw)
    if magic != _MAGIC:
        return "bad magic number"
    if _HEADER_SIZE + meta_len + data_len != len(raw):
        return f"lengths ({meta_len} + {data_len}) do not match the file size {len(raw)}"
    crc = int.from_bytes(raw[_HEAD.size:_HEADER_SIZE], "little")
    body = memoryview(raw)[_HEADER_SIZE:]
    if zlib.crc32(body, zlib.crc32(raw[:_HEAD.size])) != crc:
        return "checksum mismatch"
    meta = bytes(body[:meta_len])
    return Checkpoint(index=index, data=bytes(body[meta_len:]), meta=meta)


class FileCheckpointStore:
    """A `CheckpointStore` keeping the newest `keep` checkpoints (by index) in a `Directory`."""

    __slots__ = ("_dir", "_keep", "_sync")

    def __init__(self, directory: Directory, *, keep: int = 3,
                 sync: SyncPolicy = SyncPolicy.GROUP) -> None:
        if keep < 1:
            raise ValueError("keep must be >= 1")
        self._dir = directory
        self._keep = keep
        self._sync = sync

    def indexes(self) -> list[int]:
        found = [_parse_name(n) for n in self._dir.list()]
        return sorted(i for i in found if i is not None)

    def save(self, checkpoint: Checkpoint) -> None:
        """Store `checkpoint` durably and atomically, replacing one with the same index.

        Raises:
            StorageError: I/O failed (the stored set is then unchanged, maybe plus a temp file).
        """
        if checkpoint.index < 0:
            raise StorageError(f"checkpoint index {checkpoint.index} is negative")
        durable = self._sync is not SyncPolicy.OFF
        name = checkpoint_name(checkpoint.index)
        tmp = name + _TMP_SUFFIX
        try:
            for stray in self._dir.list():
                if stray.startswith(CHECKPOINT_PREFIX) and stray.endswith(_TMP_SUFFIX):
                    self._dir.remove(stray)
            self._dir.create(tmp)
            self._dir.append(tmp, encode_header(checkpoint) + checkpoint.meta)
            self._dir.append(tmp, checkpoint.data)
            if durable:
                self._dir.fsync(tmp)
            self._dir.rename(tmp, name)
            if durable:
                self._dir.fsync_dir()
            for index in self.indexes()[:-self._keep]:
                self._dir.remove(checkpoint_name(index))
        except OSError as e:
            raise StorageError(f"saving checkpoint {checkpoint.index} failed: {e}") from e

    def read_view(self, index: int) -> ByteView:
        """The data of stored checkpoint `index` as a view that reads the file on demand
        (`Directory.view`): it stays valid after the checkpoint is superseded and removed.
        The checksum is not re-verified here (the caller saved or loaded this checkpoint).

        Raises:
            StorageError: no such checkpoint, or its header does not match the file.
        """
        name = checkpoint_name(index)
        try:
            head = self._dir.read_at(name, 0, _HEADER_SIZE)
            if len(head) < _HEADER_SIZE:
                raise StorageError(f"{self._dir.path(name)}: only {len(head)} bytes")
            magic, stored, meta_len, data_len = _HEAD.unpack_from(head)
            if magic != _MAGIC or stored != index:
                raise StorageError(f"{self._dir.path(name)}: not checkpoint {index}")
            return self._dir.view(name, _HEADER_SIZE + meta_len, data_len)
        except (OSError, ValueError) as e:
            raise StorageError(f"reading checkpoint {index} failed: {e}") from e

    def load_latest(self) -> LoadedCheckpoint:
        """The newest valid checkpoint, with a problem line for every newer invalid one."""
        problems: list[str] = []
        for index in reversed(self.indexes()):
            name = checkpoint_name(index)
            try:
                result = decode_checkpoint(self._dir.read(name))
            except OSError as e:
                result = f"unreadable: {e}"
            if isinstance(result, Checkpoint) and result.index != index:
                result = f"holds index {result.index}, not {index}"
            if isinstance(result, Checkpoint):
                return LoadedCheckpoint(checkpoint=result, problems=tuple(problems))
            problems.append(f"{self._dir.path(name)}: {result}")
        return LoadedCheckpoint(checkpoint=None, problems=tuple(problems))
