"""WAL behaviour on both backends: appends, rotation, truncation, compaction, recovery,
corruption reporting, repair, sync policies and I/O-error poisoning."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest

from phalanx.storage.directory import Directory, OsDirectory
from phalanx.storage.interface import CorruptionError, StorageError, SyncPolicy
from phalanx.storage.memory import MemoryDirectory, MemoryDisk
from phalanx.storage.records import HEADER_SIZE, encode
from phalanx.storage.repair import repair_wal
from phalanx.storage.wal import META_NAME, Wal

SEG = 120
Factory = Callable[[], Directory]


@pytest.fixture(params=["memory", "files"])
def make_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Factory:
    if request.param == "memory":
        d = MemoryDirectory("t")
        return lambda: d
    return lambda: OsDirectory(str(tmp_path / "wal"))


def _open(make: Factory, **kw: object) -> Wal:
    return Wal.open(make(), segment_bytes=SEG, **kw)  # type: ignore[arg-type]


def _fill(wal: Wal, n: int, start: int = 1) -> list[bytes]:
    payloads = [f"p{i}".encode() * 3 for i in range(start, start + n)]
    wal.append_many([(start + k, p) for k, p in enumerate(payloads)])
    wal.sync()
    return payloads


def test_empty_log(make_dir: Factory) -> None:
    wal = _open(make_dir)
    assert (wal.first_index(), wal.last_index(), wal.read(1, 1)) == (1, 0, [])
    with pytest.raises(StorageError):
        wal.append(2, b"x")
    with pytest.raises(StorageError):
        wal.read(1, 2)


def test_append_rotate_reopen(make_dir: Factory) -> None:
    wal = _open(make_dir)
    payloads = _fill(wal, 30)
    assert len(wal.segment_names()) > 3
    assert wal.read(1, 31) == payloads
    wal.close()
    with pytest.raises(StorageError):
        wal.read(1, 2)
    again = _open(make_dir)
    assert (again.first_index(), again.last_index()) == (1, 30)
    assert again.read(7, 23) == payloads[6:22]
    again.append(31, b"next")
    assert again.read(30, 32) == [payloads[-1], b"next"]


def test_append_checks_contiguity_and_size(make_dir: Factory) -> None:
    wal = _open(make_dir, max_record_bytes=10)
    with pytest.raises(StorageError):
        wal.append_many([(1, b"a"), (3, b"c")])
    with pytest.raises(StorageError):
        wal.append(1, b"x" * 11)
    assert wal.last_index() == 0  # nothing written by a rejected call


def test_truncate_suffix_across_segments(make_dir: Factory) -> None:
    wal = _open(make_dir)
    payloads = _fill(wal, 30)
    wal.truncate_suffix(12)
    assert wal.last_index() == 11
    wal.append_many([(12, b"new12"), (13, b"new13")])
    wal.sync()
    again = _open(make_dir)
    assert again.read(1, 14) == [*payloads[:11], b"new12", b"new13"]
    again.truncate_suffix(1)
    assert (again.first_index(), again.last_index()) == (1, 0)
    again.truncate_suffix(5)  # past the end: nothing to do
    assert again.last_index() == 0


def test_compaction_point_survives_restart(make_dir: Factory) -> None:
    wal = _open(make_dir)
    payloads = _fill(wal, 30)
    names = wal.segment_names()
    wal.compact_prefix(9)  # mid-segment
    assert wal.segment_names() != names
    again = _open(make_dir)
    assert (again.first_index(), again.last_index()) == (10, 30)
    assert again.read(10, 31) == payloads[9:]
    with pytest.raises(StorageError):
        again.read(9, 10)
    with pytest.raises(StorageError):
        again.truncate_suffix(9)


def test_compaction_past_the_end_moves_the_start(make_dir: Factory) -> None:
    wal = _open(make_dir)
    _fill(wal, 5)
    wal.compact_prefix(100)
    assert (wal.first_index(), wal.last_index(), wal.segment_names()) == (101, 100, [])
    with pytest.raises(StorageError):
        wal.append(6, b"x")
    wal.append(101, b"x")
    wal.sync()
    again = _open(make_dir)
    assert (again.first_index(), again.last_index(), again.read(101, 102)) == (101, 101, [b"x"])


def _segment_bytes(make: Factory, name: str) -> bytes:
    return make().read(name)


def _rewrite(make: Factory, name: str, data: bytes) -> None:
    d = make()
    d.create(name)
    d.append(name, data)
    d.fsync(name)
    d.close()


def test_torn_tail_is_cut_and_reported(make_dir: Factory) -> None:
    wal = _open(make_dir)
    payloads = _fill(wal, 8)
    last = wal.segment_names()[-1]
    data = _segment_bytes(make_dir, last)
    _rewrite(make_dir, last, data + encode(9, b"lost")[: HEADER_SIZE + 2])  # a torn append
    again = _open(make_dir)
    assert again.recovery.torn_path == make_dir().path(last)
    assert again.recovery.torn_bytes == HEADER_SIZE + 2
    assert again.read(1, 9) == payloads
    again.append(9, b"after")
    again.sync()
    assert _open(make_dir).read(8, 10) == [payloads[-1], b"after"]


@pytest.mark.parametrize("where", ["final", "earlier"])
def test_corruption_is_refused_then_repaired(make_dir: Factory, where: str) -> None:
    wal = _open(make_dir)
    payloads = _fill(wal, 30)
    names = wal.segment_names()
    victim = names[-1] if where == "final" else names[1]
    data = bytearray(_segment_bytes(make_dir, victim))
    data[HEADER_SIZE + 1] ^= 0x10  # payload of the segment's first record
    _rewrite(make_dir, victim, bytes(data))
    before = {n: _segment_bytes(make_dir, n) for n in names}
    with pytest.raises(CorruptionError) as info:
        _open(make_dir)
    assert (info.value.path, info.value.offset) == (make_dir().path(victim), 0)
    assert {n: _segment_bytes(make_dir, n) for n in names} == before  # refusal changes nothing
    report = repair_wal(make_dir())
    first_lost = int(victim[4:24])
    assert report.lost_from_index == first_lost
    assert report.offset == 0
    again = _open(make_dir)
    assert again.last_index() == first_lost - 1
    assert again.read(1, first_lost) == payloads[: first_lost - 1]
    assert not repair_wal(make_dir()).changed


def test_gap_between_segments_is_corruption(make_dir: Factory) -> None:
    wal = _open(make_dir)
    _fill(wal, 30)
    middle = wal.segment_names()[1]
    d = make_dir()
    d.remove(middle)
    d.close()
    with pytest.raises(CorruptionError, match="gap"):
        _open(make_dir)
    assert repair_wal(make_dir()).changed
    assert _open(make_dir).last_index() == int(middle[4:24]) - 1


def test_corrupt_meta_is_refused_and_reset_by_repair(make_dir: Factory) -> None:
    wal = _open(make_dir)
    _fill(wal, 30)
    wal.compact_prefix(20)
    first_kept = int(wal.segment_names()[0][4:24])
    data = bytearray(_segment_bytes(make_dir, META_NAME))
    data[9] ^= 1
    _rewrite(make_dir, META_NAME, bytes(data))
    with pytest.raises(CorruptionError) as info:
        _open(make_dir)
    assert info.value.path == make_dir().path(META_NAME)
    assert repair_wal(make_dir()).meta_reset == first_kept - 1
    assert _open(make_dir).first_index() == first_kept


def test_rot_after_open_is_detected_on_read(make_dir: Factory) -> None:
    wal = _open(make_dir)
    _fill(wal, 3)
    name = wal.segment_names()[0]
    data = bytearray(_segment_bytes(make_dir, name))
    data[-1] ^= 1
    _rewrite(make_dir, name, bytes(data))
    assert wal.read(1, 3) == [b"p1p1p1", b"p2p2p2"]
    with pytest.raises(CorruptionError):
        wal.read(1, 4)


def test_every_write_policy_survives_crash_without_sync() -> None:
    disk = MemoryDisk(sync=SyncPolicy.EVERY_WRITE, segment_bytes=SEG)
    wal = disk.wal()
    for i in range(1, 20):
        wal.append(i, b"r%d" % i)
    for seed in range(5):
        disk.crash(random.Random(seed))
        assert disk.wal().read(1, 20) == [b"r%d" % i for i in range(1, 20)]


def test_group_policy_keeps_synced_and_maybe_more() -> None:
    lasts = set()
    for seed in range(30):
        disk = MemoryDisk(segment_bytes=SEG)
        wal = disk.wal()
        payloads = _fill(wal, 10)
        wal.append_many([(11, b"u11"), (12, b"u12")])
        disk.crash(random.Random(seed))
        again = disk.wal()
        lasts.add(again.last_index())
        assert again.read(1, 11) == payloads
        assert again.read(11, again.last_index() + 1) == [b"u11", b"u12"][: again.last_index() - 10]
    assert lasts <= {10, 11, 12}
    assert len(lasts) > 1  # the crash model did lose un-synced records for some seeds


def test_off_policy_never_fsyncs() -> None:
    calls: list[str] = []

    class Counting(MemoryDirectory):
        def fsync(self, name: str) -> None:
            calls.append(name)
            super().fsync(name)

        def fsync_dir(self) -> None:
            calls.append("<dir>")
            super().fsync_dir()

    wal = Wal.open(Counting(), sync=SyncPolicy.OFF, segment_bytes=SEG)
    _fill(wal, 30)
    wal.truncate_suffix(10)
    wal.compact_prefix(5)
    assert calls == []


def test_io_error_poisons_the_log() -> None:
    class Failing(MemoryDirectory):
        fail = False

        def fsync(self, name: str) -> None:
            if self.fail:
                raise OSError(5, "EIO")
            super().fsync(name)

    d = Failing()
    wal = Wal.open(d, segment_bytes=SEG)
    _fill(wal, 2)
    d.fail = True
    wal.append(3, b"x")
    with pytest.raises(StorageError, match="EIO"):
        wal.sync()
    d.fail = False
    with pytest.raises(StorageError, match="reopen"):
        wal.append(4, b"y")
    assert Wal.open(d, segment_bytes=SEG).last_index() >= 2
