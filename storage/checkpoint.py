"""Checkpoints stored as checksummed files written atomically, over a `Directory`.

Owns: `FileCheckpointStore` (implements `CheckpointStore`) and the checkpoint file formats.
Must not import: `phalanx.consensus`, `phalanx.apps` (checkpoints are opaque bytes), `os`.

File `checkpoint-<index, 20 digits>.ckpt`, in one of two layouts (integers little-endian):
- v1, written by earlier versions (still read; `encode_header` builds one, for tests):
      b"PHXCKP01" | u64 index | u32 meta_len | u64 data_len | u32 crc32(all but this field) |
      meta | data
- v2, written by `save` and `save_stream` (the data may arrive in steps and is never held
  whole, so its length and checksum trail; the `Directory` is append-only, nothing is patched
  afterwards):
      b"PHXCKP02" | u64 index | u32 meta_len | u32 crc32(the fields before it + meta) | meta |
      data | u64 data_len | u32 crc32(data) | b"PHXEND02"
Both are read by `load_latest` and `read_view`.
Save protocol: write `<name>.tmp`, fsync, rename to `<name>`, fsync the directory, then
remove the oldest beyond `keep`. A crash leaves the previous set plus, at most, a stray temp
file (ignored, and removed by the next save).

Invariant: `load_latest` returns only a checkpoint whose checksums, lengths and index match;
every newer checkpoint it skipped is named in `problems` (reported, never hidden).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Iterable

from phalanx.storage.directory import ByteView, Directory
from phalanx.storage.interface import LoadedCheckpoint, StorageError, StoredCheckpoint, SyncPolicy

CHECKPOINT_PREFIX = "checkpoint-"
CHECKPOINT_SUFFIX = ".ckpt"
_TMP_SUFFIX = ".tmp"
_MAGIC = b"PHXCKP01"
_HEAD = struct.Struct("<8sQIQ")  # magic, index, meta_len, data_len; then u32 crc
_HEADER_SIZE = _HEAD.size + 4
_MAGIC2 = b"PHXCKP02"
_HEAD2 = struct.Struct("<8sQI")  # magic, index, meta_len; then u32 crc (with meta)
_HEADER2_SIZE = _HEAD2.size + 4
_END2 = b"PHXEND02"
_TRAIL2 = struct.Struct("<QI8s")  # data_len, crc32(data), end magic
STREAM_WRITE_BYTES = 1 << 20
"""`save_stream` gathers steps into appends of about this many bytes (one syscall each)."""


def checkpoint_name(index: int) -> str:
    return f"{CHECKPOINT_PREFIX}{index:020d}{CHECKPOINT_SUFFIX}"


def _parse_name(name: str) -> int | None:
    if not (name.startswith(CHECKPOINT_PREFIX) and name.endswith(CHECKPOINT_SUFFIX)):
        return None
    digits = name[len(CHECKPOINT_PREFIX):-len(CHECKPOINT_SUFFIX)]
    return int(digits) if len(digits) == 20 and digits.isdigit() else None


def encode_header(checkpoint: StoredCheckpoint) -> bytes:
    """The v1 header of `checkpoint` (its data's length and checksum lead)."""
    head = _HEAD.pack(_MAGIC, checkpoint.index, len(checkpoint.meta), len(checkpoint.data))
    crc = zlib.crc32(checkpoint.data, zlib.crc32(checkpoint.meta, zlib.crc32(head)))
    return head + crc.to_bytes(4, "little")


def encode_header2(index: int, meta: bytes) -> bytes:
    """The v2 header and metadata (the data's length and checksum go in the trailer)."""
    head = _HEAD2.pack(_MAGIC2, index, len(meta))
    crc = zlib.crc32(meta, zlib.crc32(head))
    return head + crc.to_bytes(4, "little") + meta


def _data_range(raw: bytes | memoryview, size: int) -> tuple[int, int, int, int] | str:
    """(index, meta start, data start, data length) from a file's header (and, for v2, its
    `size`), or why it is invalid. The v2 trailer is checked by the caller."""
    if len(raw) < 8:
        return f"only {size} bytes"
    magic = bytes(raw[:8])
    if magic == _MAGIC:
        if len(raw) < _HEADER_SIZE:
            return f"only {size} bytes"
        _, index, meta_len, data_len = _HEAD.unpack_from(raw)
        if _HEADER_SIZE + meta_len + data_len != size:
            return f"lengths ({meta_len} + {data_len}) do not match the file size {size}"
        return index, _HEADER_SIZE, _HEADER_SIZE + meta_len, data_len
    if magic == _MAGIC2:
        if len(raw) < _HEADER2_SIZE:
            return f"only {size} bytes"
        _, index, meta_len = _HEAD2.unpack_from(raw)
        data_len = size - _HEADER2_SIZE - meta_len - _TRAIL2.size
        if data_len < 0:
            return f"metadata length {meta_len} does not fit the file size {size}"
        return index, _HEADER2_SIZE, _HEADER2_SIZE + meta_len, data_len
    return "bad magic number"


def decode_checkpoint(raw: bytes) -> StoredCheckpoint | str:
    """The checkpoint in a file's bytes (either layout), or why it is invalid."""
    found = _data_range(raw, len(raw))
    if isinstance(found, str):
        return found
    index, meta_at, data_at, data_len = found
    body = memoryview(raw)
    if raw[:8] == _MAGIC:
        crc = int.from_bytes(raw[_HEAD.size:_HEADER_SIZE], "little")
        if zlib.crc32(body[_HEADER_SIZE:], zlib.crc32(raw[:_HEAD.size])) != crc:
            return "checksum mismatch"
    else:
        crc = int.from_bytes(raw[_HEAD2.size:_HEADER2_SIZE], "little")
        if zlib.crc32(body[meta_at:data_at], zlib.crc32(raw[:_HEAD2.size])) != crc:
            return "header checksum mismatch"
        stored_len, data_crc, end = _TRAIL2.unpack_from(raw, data_at + data_len)
        if end != _END2:
            return "no end marker (the file was cut short)"
        if stored_len != data_len:
            return f"trailer says {stored_len} data bytes, the file holds {data_len}"
        if zlib.crc32(body[data_at:data_at + data_len]) != data_crc:
            return "checksum mismatch"
    return StoredCheckpoint(index=index, data=bytes(body[data_at:data_at + data_len]),
                      meta=bytes(body[meta_at:data_at]))


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

    def save(self, checkpoint: StoredCheckpoint) -> None:
        """Store `checkpoint` durably and atomically, replacing one with the same index
        (`save_stream` of its data in one piece).

        Raises:
            StorageError: I/O failed (the stored set is then unchanged, maybe plus a temp file).
        """
        self.save_stream(checkpoint.index, checkpoint.meta, (checkpoint.data,))

    def save_stream(self, index: int, meta: bytes, chunks: Iterable[bytes], *,
                    write_bytes: int = STREAM_WRITE_BYTES) -> int:
        """Store a checkpoint whose data is the concatenation of `chunks`, durably and
        atomically (v2 layout), without ever holding the whole data: the chunks are gathered
        into appends of about `write_bytes`. Returns the data's length.

        Raises:
            StorageError: I/O failed (as `save`). An exception from `chunks` propagates
            unchanged, with nothing stored but a stray temp file.
        """
        length = 0

        def write(tmp: str) -> None:
            nonlocal length
            self._dir.append(tmp, encode_header2(index, meta))
            crc = 0
            pending: list[bytes] = []
            size = 0
            # NB: the CRC runs over each gathered append, not over each chunk. zlib releases
            # the GIL for a buffer over 5 KiB, and a writer thread that let go of the GIL
            # after every chunk waited for it again each time (up to a switch interval, 5 ms,
            # behind a busy applying thread): a 1M-key checkpoint of ~1000 shard-sized
            # chunks took 4-5 s where its own work is ~0.1 s.
            for chunk in chunks:
                if not chunk:
                    continue
                pending.append(chunk)
                size += len(chunk)
                if size >= write_bytes:
                    joined = b"".join(pending)
                    crc = zlib.crc32(joined, crc)
                    self._dir.append(tmp, joined)
                    length += size
                    pending, size = [], 0
            length += size
            joined = b"".join(pending)
            crc = zlib.crc32(joined, crc)
            self._dir.append(tmp, joined + _TRAIL2.pack(length, crc, _END2))

        self._save(index, write)
        return length

    def _save(self, index: int, write: Callable[[str], None]) -> None:
        if index < 0:
            raise StorageError(f"checkpoint index {index} is negative")
        durable = self._sync is not SyncPolicy.OFF
        name = checkpoint_name(index)
        tmp = name + _TMP_SUFFIX
        try:
            for stray in self._dir.list():
                if stray.startswith(CHECKPOINT_PREFIX) and stray.endswith(_TMP_SUFFIX):
                    self._dir.remove(stray)
            self._dir.create(tmp)
            write(tmp)
            if durable:
                self._dir.fsync(tmp)
            self._dir.rename(tmp, name)
            if durable:
                self._dir.fsync_dir()
            for old in self.indexes()[:-self._keep]:
                self._dir.remove(checkpoint_name(old))
        except OSError as e:
            raise StorageError(f"saving checkpoint {index} failed: {e}") from e

    def read_view(self, index: int) -> ByteView:
        """The data of stored checkpoint `index` as a view that reads the file on demand
        (`Directory.view`): it stays valid after the checkpoint is superseded and removed.
        Checksums are not re-verified here (the caller saved or loaded this checkpoint).

        Raises:
            StorageError: no such checkpoint, or its header does not match the file.
        """
        name = checkpoint_name(index)
        try:
            size = self._dir.size(name)
            found = _data_range(self._dir.read_at(name, 0, _HEADER_SIZE), size)
            if isinstance(found, str):
                raise StorageError(f"{self._dir.path(name)}: {found}")
            stored, _, data_at, data_len = found
            if stored != index:
                raise StorageError(f"{self._dir.path(name)}: not checkpoint {index}")
            return self._dir.view(name, data_at, data_len)
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
            if isinstance(result, StoredCheckpoint) and result.index != index:
                result = f"holds index {result.index}, not {index}"
            if isinstance(result, StoredCheckpoint):
                return LoadedCheckpoint(checkpoint=result, problems=tuple(problems))
            problems.append(f"{self._dir.path(name)}: {result}")
        return LoadedCheckpoint(checkpoint=None, problems=tuple(problems))
