"""The single-file checkpoint formats v1 and v2 (before content-addressed pieces, v3).

Owns: their layouts (below), `encode_header` (v1, for tests), `encode_header2` (v2, which
`FileCheckpointStore(layout=2)` still writes) and `decode_checkpoint` (reads both).
Must not import: `phalanx.consensus`, `phalanx.apps`, `os`.

Layouts (integers little-endian), in `checkpoint-<index, 20 digits>.ckpt`:
- v1: b"PHXCKP01" | u64 index | u32 meta_len | u64 data_len | u32 crc32(all but this field) |
      meta | data
- v2 (the data may arrive in steps and is never held whole, so its length and checksum
  trail; the `Directory` is append-only, nothing is patched afterwards):
      b"PHXCKP02" | u64 index | u32 meta_len | u32 crc32(the fields before it + meta) | meta |
      data | u64 data_len | u32 crc32(data) | b"PHXEND02"
"""

from __future__ import annotations

import struct
import zlib

from phalanx.storage.interface import StoredCheckpoint

MAGIC1 = b"PHXCKP01"
_HEAD = struct.Struct("<8sQIQ")  # magic, index, meta_len, data_len; then u32 crc
HEADER_SIZE = _HEAD.size + 4
MAGIC2 = b"PHXCKP02"
_HEAD2 = struct.Struct("<8sQI")  # magic, index, meta_len; then u32 crc (with meta)
_HEADER2_SIZE = _HEAD2.size + 4
END2 = b"PHXEND02"
TRAIL2 = struct.Struct("<QI8s")  # data_len, crc32(data), end magic


def encode_header(checkpoint: StoredCheckpoint) -> bytes:
    """The v1 header of `checkpoint` (its data's length and checksum lead)."""
    head = _HEAD.pack(MAGIC1, checkpoint.index, len(checkpoint.meta), len(checkpoint.data))
    crc = zlib.crc32(checkpoint.data, zlib.crc32(checkpoint.meta, zlib.crc32(head)))
    return head + crc.to_bytes(4, "little")


def encode_header2(index: int, meta: bytes) -> bytes:
    """The v2 header and metadata (the data's length and checksum go in the trailer)."""
    head = _HEAD2.pack(MAGIC2, index, len(meta))
    crc = zlib.crc32(meta, zlib.crc32(head))
    return head + crc.to_bytes(4, "little") + meta


def data_range(raw: bytes | memoryview, size: int) -> tuple[int, int, int, int] | str:
    """(index, meta start, data start, data length) from a file's header (and, for v2, its
    `size`), or why it is invalid. The v2 trailer is checked by the caller."""
    if len(raw) < 8:
        return f"only {size} bytes"
    magic = bytes(raw[:8])
    if magic == MAGIC1:
        if len(raw) < HEADER_SIZE:
            return f"only {size} bytes"
        _, index, meta_len, data_len = _HEAD.unpack_from(raw)
        if HEADER_SIZE + meta_len + data_len != size:
            return f"lengths ({meta_len} + {data_len}) do not match the file size {size}"
        return index, HEADER_SIZE, HEADER_SIZE + meta_len, data_len
    if magic == MAGIC2:
        if len(raw) < _HEADER2_SIZE:
            return f"only {size} bytes"
        _, index, meta_len = _HEAD2.unpack_from(raw)
        data_len = size - _HEADER2_SIZE - meta_len - TRAIL2.size
        if data_len < 0:
            return f"metadata length {meta_len} does not fit the file size {size}"
        return index, _HEADER2_SIZE, _HEADER2_SIZE + meta_len, data_len
    return "bad magic number"


def decode_checkpoint(raw: bytes) -> StoredCheckpoint | str:
    """The checkpoint in a file's bytes (either layout), or why it is invalid."""
    found = data_range(raw, len(raw))
    if isinstance(found, str):
        return found
    index, meta_at, data_at, data_len = found
    body = memoryview(raw)
    if raw[:8] == MAGIC1:
        crc = int.from_bytes(raw[_HEAD.size:HEADER_SIZE], "little")
        if zlib.crc32(body[HEADER_SIZE:], zlib.crc32(raw[:_HEAD.size])) != crc:
            return "checksum mismatch"
    else:
        crc = int.from_bytes(raw[_HEAD2.size:_HEADER2_SIZE], "little")
        if zlib.crc32(body[meta_at:data_at], zlib.crc32(raw[:_HEAD2.size])) != crc:
            return "header checksum mismatch"
        stored_len, data_crc, end = TRAIL2.unpack_from(raw, data_at + data_len)
        if end != END2:
            return "no end marker (the file was cut short)"
        if stored_len != data_len:
            return f"trailer says {stored_len} data bytes, the file holds {data_len}"
        if zlib.crc32(body[data_at:data_at + data_len]) != data_crc:
            return "checksum mismatch"
    return StoredCheckpoint(index=index, data=bytes(body[data_at:data_at + data_len]),
                      meta=bytes(body[meta_at:data_at]))
