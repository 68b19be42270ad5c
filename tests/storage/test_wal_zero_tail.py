"""WAL recovery of zero-filled tails, on both backends: what a crash into (or a future
writer of) a preallocated segment leaves behind, and what the scanner must not cut.

Pins the rules of `phalanx.storage.records` that a preallocating WAL would lean on:
- zeros after the last whole record (a preallocated region, or a file system that extended
  the size before writing data) end the log: they are cut and reported, nothing is lost;
- a real `posix_fallocate`d region after the records (a segment written by a preallocating
  writer) opens with this code, and appends continue after the records;
- a whole header followed by zeros to the end of file is a torn record (cut);
- a record torn *inside* (part of its header, or part of its payload), followed by zeros,
  is refused as corruption, not cut: from its
  bytes alone it cannot be told from a bit flip in a synced record (see `records.py`);
- zeros after the records of a non-final segment are corruption (a segment is complete and
  fsynced before its successor exists), so a preallocating writer must trim a segment
  before it rolls over.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from phalanx.storage.directory import Directory, OsDirectory
from phalanx.storage.interface import CorruptionError
from phalanx.storage.memory import MemoryDirectory
from phalanx.storage.records import HEADER_SIZE, encode
from phalanx.storage.wal import Wal

SEG = 120
Factory = Callable[[], Directory]


@pytest.fixture(params=["memory", "files"])
def make_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Factory:
    if request.param == "memory":
        d = MemoryDirectory("z")
        return lambda: d
    return lambda: OsDirectory(str(tmp_path / "wal"))


def _filled(make: Factory, n: int, segment_bytes: int = SEG) -> tuple[list[bytes], str]:
    wal = Wal.open(make(), segment_bytes=segment_bytes)
    payloads = [f"v{i}".encode() * 4 for i in range(1, n + 1)]
    wal.append_many([(i, p) for i, p in enumerate(payloads, start=1)])
    wal.sync()
    wal.close()
    return payloads, wal.segment_names()[-1]


def _rewrite(make: Factory, name: str, data: bytes) -> None:
    d = make()
    d.create(name)
    d.append(name, data)
    d.fsync(name)


@pytest.mark.parametrize("zeros", [1, HEADER_SIZE - 1, HEADER_SIZE, 4096])
def test_zero_region_after_the_records_is_cut_and_reported(make_dir: Factory, zeros: int) -> None:
    payloads, last = _filled(make_dir, 6)
    _rewrite(make_dir, last, make_dir().read(last) + bytes(zeros))
    wal = Wal.open(make_dir(), segment_bytes=SEG)
    assert wal.recovery.torn_path == make_dir().path(last)
    assert wal.recovery.torn_bytes == zeros
    assert wal.recovery.torn_reason in ("zero-filled tail", f"partial header ({zeros} bytes)")
    assert wal.read(1, 7) == payloads
    wal.append(7, b"next")
    wal.sync()
    again = Wal.open(make_dir(), segment_bytes=SEG)
    assert again.recovery.torn_path is None
    assert again.read(1, 8) == [*payloads, b"next"]


def test_fallocated_segment_opens_and_continues(tmp_path: Path) -> None:
    """A segment as a preallocating writer leaves it: records, then a `posix_fallocate`d
    (unwritten, reads as zeros) region to the segment's size."""
    root = str(tmp_path / "wal")
    payloads, last = _filled(lambda: OsDirectory(root), 5, segment_bytes=1 << 20)
    path = os.path.join(root, last)
    used = os.path.getsize(path)
    fd = os.open(path, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, 1 << 20)
        os.fsync(fd)
    finally:
        os.close(fd)
    assert os.path.getsize(path) == 1 << 20
    wal = Wal.open(OsDirectory(root), segment_bytes=1 << 20)
    assert (wal.recovery.torn_bytes, wal.recovery.torn_reason) == (
        (1 << 20) - used,
        "zero-filled tail",
    )
    assert os.path.getsize(path) == used  # cut back to the records
    assert wal.read(1, 6) == payloads
    wal.append(6, b"after")
    wal.sync()
    assert Wal.open(OsDirectory(root), segment_bytes=1 << 20).read(5, 7) == [payloads[-1], b"after"]


def test_whole_header_then_zero_payload_is_cut(make_dir: Factory) -> None:
    """Record 7's header reached the disk, its payload (to the end of file) reads as zeros:
    a torn write, cut and reported."""
    payloads, last = _filled(make_dir, 6)
    before = make_dir().read(last)
    torn = encode(7, b"x" * 40)
    _rewrite(make_dir, last, before + torn[:HEADER_SIZE] + bytes(len(torn) - HEADER_SIZE + 64))
    wal = Wal.open(make_dir(), segment_bytes=SEG)
    assert (wal.recovery.torn_offset, wal.recovery.torn_reason) == (
        len(before),
        "zero-filled payload at the tail",
    )
    assert wal.read(1, 7) == payloads


@pytest.mark.parametrize("kept", [1, HEADER_SIZE // 2, HEADER_SIZE - 1, HEADER_SIZE + 3])
def test_record_torn_inside_then_zeros_is_refused_not_cut(make_dir: Factory, kept: int) -> None:
    """The first `kept` bytes of record 7 reached the disk, the rest reads as zeros (the
    file's size covers the whole record, as in a preallocated segment). The bytes alone
    cannot tell this from a flipped bit in a synced record, so recovery refuses, leaves
    the file as it is, and `repair_wal` is the explicit way on."""
    _payloads, last = _filled(make_dir, 6)
    before = make_dir().read(last)
    torn = encode(7, b"x" * 40)
    data = before + torn[:kept] + bytes(len(torn) - kept + 64)
    _rewrite(make_dir, last, data)
    with pytest.raises(CorruptionError) as info:
        Wal.open(make_dir(), segment_bytes=SEG)
    assert (info.value.path, info.value.offset) == (make_dir().path(last), len(before))
    assert make_dir().read(last) == data


def test_zeros_after_a_non_final_segment_are_corruption(make_dir: Factory) -> None:
    wal = Wal.open(make_dir(), segment_bytes=SEG)
    wal.append_many([(i, f"w{i}".encode() * 4) for i in range(1, 31)])
    wal.sync()
    names = wal.segment_names()
    assert len(names) >= 3
    first = make_dir().read(names[0])
    _rewrite(make_dir, names[0], first + bytes(64))
    with pytest.raises(CorruptionError) as info:
        Wal.open(make_dir(), segment_bytes=SEG)
    assert (info.value.path, info.value.offset) == (make_dir().path(names[0]), len(first))
