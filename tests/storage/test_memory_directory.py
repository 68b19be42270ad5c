"""The in-memory directory's crash model, and `OsDirectory` on real files."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from phalanx.storage.directory import OsDirectory
from phalanx.storage.memory import MemoryDirectory, MemoryDisk, SimulatedCrash


def test_crash_keeps_fsynced_and_a_prefix_of_the_rest() -> None:
    kept = set()
    for seed in range(40):
        d = MemoryDirectory()
        d.create("f")
        d.append("f", b"durable")
        d.fsync("f")
        d.fsync_dir()
        d.append("f", b"-pending")
        d.crash(random.Random(seed))
        data = d.read("f")
        assert (b"durable-pending").startswith(data)
        assert data.startswith(b"durable")
        kept.add(len(data))
    assert len(kept) > 5  # torn writes of many lengths happen


def test_unsynced_create_and_rename_may_be_lost_in_order() -> None:
    outcomes = set()
    for seed in range(40):
        d = MemoryDirectory()
        d.create("a")
        d.append("a", b"1")
        d.fsync("a")
        d.rename("a", "b")
        d.create("c")
        d.crash(random.Random(seed))
        outcomes.add(tuple(d.list()))
    assert outcomes == {(), ("a",), ("b",), ("b", "c")}


def test_unsynced_truncate_is_all_or_prefix() -> None:
    outcomes = set()
    for seed in range(40):
        d = MemoryDirectory()
        d.create("f")
        d.fsync_dir()
        d.append("f", b"abcdef")
        d.fsync("f")
        d.truncate("f", 2)
        d.append("f", b"XY")
        d.crash(random.Random(seed))
        outcomes.add(d.read("f"))
    assert outcomes == {b"abcdef", b"ab", b"abX", b"abXY"}


def test_flip_bit_changes_exactly_one_bit_durably() -> None:
    d = MemoryDirectory()
    d.create("f")
    d.append("f", bytes(16))
    d.fsync("f")
    d.fsync_dir()
    flip = d.flip_bit(random.Random(3))
    assert flip is not None
    d.crash(random.Random(0))
    data = d.read("f")
    assert sum(bin(b).count("1") for b in data) == 1
    assert data[flip.offset] == 1 << flip.bit


def test_crash_after_counts_mutating_operations() -> None:
    d = MemoryDirectory()
    d.crash_after(2)
    d.create("f")
    d.append("f", b"x")
    with pytest.raises(SimulatedCrash):
        d.fsync("f")
    assert d.durable_size("f") == 0


def test_tear_last_record() -> None:
    disk = MemoryDisk(segment_bytes=1000)
    wal = disk.wal()
    wal.append_many([(1, b"a" * 30), (2, b"b" * 30)])
    wal.sync()
    assert disk.tear_last_record(random.Random(0))
    again = disk.wal()
    assert again.last_index() == 1
    assert again.recovery.torn_path is not None


def test_os_directory_basics(tmp_path: Path) -> None:
    d = OsDirectory(str(tmp_path / "d"))
    d.create("f")
    d.append("f", b"hello world")
    d.fsync("f")
    d.truncate("f", 5)
    d.append("f", b"!")
    assert (d.read("f"), d.size("f"), d.read_at("f", 1, 3)) == (b"hello!", 6, b"ell")
    d.create("g")
    d.rename("g", "f")
    d.fsync_dir()
    assert (d.list(), d.read("f")) == (["f"], b"")
    d.remove("f")
    d.close()
    assert d.list() == []
    with pytest.raises(FileNotFoundError):
        d.read("f")
