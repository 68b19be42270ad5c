"""The WAL record format and the pure scanner that tells a torn tail from corruption.

Owns: encoding records, and classifying the bytes of one segment file as
"valid records, then (maybe) a torn tail" or "corrupt at offset X".
Must not import: anything doing I/O (this module works on `bytes` only), `phalanx.consensus`.

Record format (little endian, 20-byte header then payload):

    u32 length | u64 index | u32 payload_crc | u32 header_crc | payload[length]

`payload_crc = zlib.crc32(payload)` and `header_crc = zlib.crc32(first 16 header bytes)`.
The header has its own checksum so that a corrupt `length` is *detected* rather than trusted:
a flipped length can neither make us allocate gigabytes nor make a synced record look like a
torn write.

Torn tail vs corruption (the CTRL rule: a crash may explain damage only at the end):
- A crash leaves a *prefix* of what was appended after the last fsync, possibly followed by
  zeros (file systems that extend the size before writing data). So, at the first bad spot,
  the damage is a **torn tail** iff the file ends inside the record's header, or the header is
  valid and the file ends inside its payload, or every byte from the bad spot (the record
  start for a bad header, the payload start for a bad payload) to the end of file is zero.
- Anything else is **corruption**: a complete record whose checksum fails, a bad header
  followed by non-zero bytes, a valid record with the wrong index. A single flipped bit in a
  complete record is therefore always reported, never silently cut off.
- Only the final segment may have a torn tail; the WAL fsyncs a segment before creating the
  next one, so damage in an earlier segment is always corruption (decided by the caller).

Invariant: `scan` never returns the payload of a record whose checksums failed.
"""

from __future__ import annotations

import struct
import zlib
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

HEADER = struct.Struct("<IQII")
"""length, index, payload_crc, header_crc."""
_HEAD16 = struct.Struct("<IQI")
_U32 = struct.Struct("<I")
HEADER_SIZE = HEADER.size

DEFAULT_MAX_RECORD_BYTES = 64 * 1024 * 1024
"""Upper bound on one payload; a (checksummed) length above it is corruption."""


def encode(index: int, payload: bytes) -> bytes:
    """One record's bytes."""
    head = _HEAD16.pack(len(payload), index, zlib.crc32(payload))
    return head + _U32.pack(zlib.crc32(head)) + payload


def encode_into(records: Sequence[tuple[int, bytes]], first: int, out: bytearray,
                offsets: array[int], pos: int, room: int) -> tuple[int, int]:
    """Append the bytes of `records[first:]` to `out` while they fit in `room` bytes (the
    first one always goes), and the file offset of each (the first at `pos`) to `offsets`.

    Returns (the next record not encoded, the offset just past the last one encoded). The
    WAL's append path: one buffer, one write per segment.
    """
    pack16 = _HEAD16.pack
    pack32 = _U32.pack
    crc = zlib.crc32
    n = len(records)
    i = first
    while i < n:
        index, payload = records[i]
        step = HEADER_SIZE + len(payload)
        if out and len(out) + step > room:
            break
        head = pack16(len(payload), index, crc(payload))
        out += head
        out += pack32(crc(head))
        out += payload
        offsets.append(pos)
        pos += step
        i += 1
    return i, pos


@dataclass(frozen=True, slots=True, kw_only=True)
class ScanResult:
    """What `scan` found in one segment.

    Attributes:
        offsets: file offset of each valid record, in order; record `i` has index
            `first_index + i`.
        valid_end: the byte just past the last valid record.
        torn: True when bytes after `valid_end` are a torn tail a crash explains.
        corrupt_offset: offset of the first record that is corrupt (not explainable by a
            crash), or None. When set, `torn` is False and `reason` says why.
        reason: human-readable cause of the torn tail or corruption ("" when clean).
    """

    offsets: array[int]
    valid_end: int
    torn: bool
    corrupt_offset: int | None
    reason: str


def _all_zero(data: bytes | bytearray, start: int) -> bool:
    tail = data[start:]
    return tail.count(0) == len(tail)


def scan(data: bytes, first_index: int, *,
         max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> ScanResult:
    """Scan a segment's bytes from offset 0; see the module docstring for the rules."""
    offsets: array[int] = array("q")
    size = len(data)
    off = 0
    expected = first_index
    unpack = HEADER.unpack_from
    crc = zlib.crc32
    view = memoryview(data)
    while off < size:
        if size - off < HEADER_SIZE:
            return ScanResult(offsets=offsets, valid_end=off, torn=True, corrupt_offset=None,
                              reason=f"partial header ({size - off} bytes)")
        length, index, payload_crc, header_crc = unpack(data, off)
        if crc(view[off:off + 16]) != header_crc:
            if _all_zero(data, off):
                return ScanResult(offsets=offsets, valid_end=off, torn=True,
                                  corrupt_offset=None, reason="zero-filled tail")
            return _corrupt(offsets, off, "header checksum mismatch")
        if length > max_record_bytes:
            return _corrupt(offsets, off, f"record length {length} exceeds the bound")
        if index != expected:
            return _corrupt(offsets, off, f"record holds index {index}, expected {expected}")
        end = off + HEADER_SIZE + length
        if end > size:
            return ScanResult(offsets=offsets, valid_end=off, torn=True, corrupt_offset=None,
                              reason=f"partial payload ({size - off - HEADER_SIZE}/{length})")
        if crc(view[off + HEADER_SIZE:end]) != payload_crc:
            if _all_zero(data, off + HEADER_SIZE):
                return ScanResult(offsets=offsets, valid_end=off, torn=True,
                                  corrupt_offset=None, reason="zero-filled payload at the tail")
            return _corrupt(offsets, off, "payload checksum mismatch")
        offsets.append(off)
        off = end
        expected += 1
    return ScanResult(offsets=offsets, valid_end=off, torn=False, corrupt_offset=None, reason="")


def _corrupt(offsets: array[int], off: int, reason: str) -> ScanResult:
    return ScanResult(offsets=offsets, valid_end=off, torn=False, corrupt_offset=off,
                      reason=reason)


def decode_span(data: bytes, base: int, offsets: Iterable[int], first_index: int
                ) -> tuple[list[bytes], int | None, str]:
    """Decode records at `offsets` (file offsets; `data` starts at file offset `base`).

    Returns (payloads, bad_offset, reason): on the first record failing its checks the
    payloads read so far, that record's file offset and why; otherwise (all, None, "").
    Used by reads after recovery, which re-verify checksums (media can rot after start).
    """
    out: list[bytes] = []
    unpack = HEADER.unpack_from
    crc = zlib.crc32
    view = memoryview(data)
    expected = first_index
    for file_off in offsets:
        off = file_off - base
        if off < 0 or off + HEADER_SIZE > len(data):
            return out, file_off, "record outside the bytes read"
        length, index, payload_crc, header_crc = unpack(data, off)
        end = off + HEADER_SIZE + length
        if (crc(view[off:off + 16]) != header_crc or index != expected or end > len(data)
                or crc(view[off + HEADER_SIZE:end]) != payload_crc):
            return out, file_off, "checksum or index mismatch on read"
        out.append(bytes(view[off + HEADER_SIZE:end]))
        expected += 1
    return out, None, ""
