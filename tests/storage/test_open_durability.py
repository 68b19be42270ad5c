"""Recovery returns only durable state (issue 15 item 5).

A process that dies between a write and its fsync (or a rename and the directory fsync)
leaves bytes and names the page cache still holds: the next process reads them. Each test
here plays that out on `MemoryDirectory` without a power loss (the process died, the machine
did not), lets the new process read the state (and so treat it as durable), then cuts the
power (`MemoryDirectory.crash`, over many seeds: it keeps a random part of what is not
durable) and checks that what the new process read is still there. Before the fix each of
them lost state for some seed: the WAL's unsynced tail (or a gap behind a new segment),
the `wal.lost` marker, a renamed hard state, a checkpoint, a core-state journal record.
"""

from __future__ import annotations

import random

import pytest

from phalanx.runtime.persistence import JOURNAL_NAME, StateJournal
from phalanx.storage.checkpoint import FileCheckpointStore
from phalanx.storage.hardstate import FileHardStateStore
from phalanx.storage.interface import StoredCheckpoint, SyncPolicy
from phalanx.storage.memory import MemoryDirectory
from phalanx.storage.records import HEADER_SIZE
from phalanx.storage.wal import LOST_NAME, Wal, write_lost

SEEDS = range(24)


class DyingDirectory(MemoryDirectory):
    """A `MemoryDirectory` whose process dies before its fsyncs: while `skip_fsync` (or
    `skip_dir_fsync`) is set, `fsync` (or `fsync_dir`) does nothing, as if the process had
    been killed right before the call and everything up to it stayed in the page cache."""

    def __init__(self) -> None:
        super().__init__("dying")
        self.skip_fsync = False
        self.skip_dir_fsync = False

    def fsync(self, name: str) -> None:
        if not self.skip_fsync:
            super().fsync(name)

    def fsync_dir(self) -> None:
        if not self.skip_dir_fsync:
            super().fsync_dir()

    def restart(self) -> None:
        """The process died; a new one starts (the machine kept running)."""
        self.skip_fsync = self.skip_dir_fsync = False


def _payload(i: int) -> bytes:
    return b"record%02d" % i


def _wal_with_unsynced_tail(segment_bytes: int) -> DyingDirectory:
    d = DyingDirectory()
    wal = Wal.open(d, segment_bytes=segment_bytes)
    wal.append_many([(i, _payload(i)) for i in range(1, 4)])
    wal.sync()
    wal.append_many([(i, _payload(i)) for i in range(4, 9)])  # written, never fsynced
    d.restart()
    return d


@pytest.mark.parametrize("segment_bytes", [1 << 20, 64])
def test_wal_open_makes_the_tail_it_read_durable(segment_bytes: int) -> None:
    """The restarted process reads 1..8 (the tail 4..8 only in the page cache; with small
    segments, in segments whose names are not durable either): after a power loss they are
    all still there."""
    for seed in SEEDS:
        d = _wal_with_unsynced_tail(segment_bytes)
        wal = Wal.open(d, segment_bytes=segment_bytes)
        assert wal.last_index() == 8  # the new process holds (and may acknowledge) 1..8
        d.crash(random.Random(seed))
        again = Wal.open(d, segment_bytes=segment_bytes)
        assert again.last_index() == 8, f"seed {seed}: lost records the node acted on"
        assert again.read(1, 9) == [_payload(i) for i in range(1, 9)]


def test_wal_no_gap_behind_a_segment_created_after_restart() -> None:
    """The restarted process appends 9 into a new segment and syncs it: the recovered final
    segment (never written by this process) must be durable first, or a power loss leaves
    a gap between the two (`CorruptionError` on the next open)."""
    segment_bytes = 8 * (HEADER_SIZE + len(_payload(1)))  # 1..8 fill the first segment
    for seed in SEEDS:
        d = _wal_with_unsynced_tail(segment_bytes)
        wal = Wal.open(d, segment_bytes=segment_bytes)
        assert len(wal.segment_names()) == 1
        wal.append(9, _payload(9))
        wal.sync()
        assert len(wal.segment_names()) == 2
        d.crash(random.Random(seed))
        again = Wal.open(d, segment_bytes=segment_bytes)  # raised CorruptionError (a gap)
        assert again.read(1, 10) == [_payload(i) for i in range(1, 10)], f"seed {seed}"


def test_wal_lost_marker_read_on_open_survives_a_power_loss() -> None:
    """The marker says "do not trust this log until recovered from peers": a process that
    died after its rename and before the directory fsync must not leave a marker the next
    process reads and a power loss then drops."""
    for seed in SEEDS:
        d = DyingDirectory()
        Wal.open(d).close()
        d.skip_dir_fsync = True
        write_lost(d, "repair cut the log", durable=True)
        d.restart()
        assert Wal.open(d).lost() == "repair cut the log"
        d.crash(random.Random(seed))
        assert LOST_NAME in d.list(), f"seed {seed}: the lost marker vanished"
        assert Wal.open(d).lost() == "repair cut the log"


def test_off_policy_open_fsyncs_nothing() -> None:
    d = _wal_with_unsynced_tail(1 << 20)
    name = Wal.open(d, sync=SyncPolicy.OFF).segment_names()[-1]
    assert d.durable_size(name) < d.size(name)


def test_hard_state_read_after_a_lost_directory_fsync_survives() -> None:
    """Raft's term and vote: the new process reads the renamed value (and may grant that
    vote again); a power loss must not bring back the old one."""
    for seed in SEEDS:
        d = DyingDirectory()
        FileHardStateStore(d).save(b"term 1, voted a")
        d.skip_dir_fsync = True
        FileHardStateStore(d).save(b"term 2, voted b")
        d.restart()
        assert FileHardStateStore(d).load() == b"term 2, voted b"
        d.crash(random.Random(seed))
        assert FileHardStateStore(d).load() == b"term 2, voted b", f"seed {seed}"


def test_checkpoint_read_after_a_lost_directory_fsync_survives() -> None:
    for seed in SEEDS:
        d = DyingDirectory()
        FileCheckpointStore(d).save(StoredCheckpoint(index=5, data=b"five", meta=b"m"))
        d.skip_dir_fsync = True
        FileCheckpointStore(d).save(StoredCheckpoint(index=10, data=b"ten", meta=b"m"))
        d.restart()
        loaded = FileCheckpointStore(d).load_latest().checkpoint
        assert loaded is not None
        assert loaded.index == 10
        d.crash(random.Random(seed))
        again = FileCheckpointStore(d).load_latest()
        assert again.checkpoint is not None, f"seed {seed}: the checkpoint vanished"
        assert again.checkpoint.index == 10, f"seed {seed}"
        assert again.problems == ()


class _BytesCodec:
    def encode(self, obj: object) -> bytes:
        assert isinstance(obj, bytes)
        return obj

    def decode(self, data: bytes) -> object:
        return data


class _ReplaceRules:
    """A delta is the whole new record (enough to exercise the journal's files)."""

    def diff(self, old: object, new: object) -> object | None:
        return None if old == new else new

    def apply(self, state: object, delta: object) -> object:
        return delta


def _journal(d: MemoryDirectory, compact_bytes: int = 8 << 20) -> StateJournal:
    return StateJournal(d, codec=_BytesCodec(), rules=_ReplaceRules(),
                        compact_bytes=compact_bytes)


@pytest.mark.parametrize("died", ["before the append's fsync",
                                  "before a compaction's directory fsync"])
def test_journal_record_read_on_load_survives(died: str) -> None:
    """PBFT's and the leaderless core's signed votes: a record the new process loads (and
    may re-send) must not be lost to a later power loss, or the replica could sign a
    conflicting one."""
    compact = died != "before the append's fsync"
    for seed in SEEDS:
        d = DyingDirectory()
        j = _journal(d, compact_bytes=1 if compact else 8 << 20)
        j.load_state()
        j.save_state(b"vote 1")
        if compact:
            j.save_state(b"vote 2")  # small journal: appended
            d.skip_dir_fsync = True
            j.save_state(b"vote 3")  # rewritten (temp file, rename) as one full record
        else:
            d.skip_fsync = True
            j.save_state(b"vote 3")  # appended
        d.restart()
        assert _journal(d).load_state() == b"vote 3"
        d.crash(random.Random(seed))
        assert JOURNAL_NAME in d.list()
        assert _journal(d).load_state() == b"vote 3", f"seed {seed}"
