"""A repaired or checkpoint-damaged node restarts consistently: the WAL continues from the
newest valid checkpoint, and a loss of held entries is reported (`DurableState.lost_reason`).

The attack (real 3-node clusters): a bit flip mid-WAL, `repair_wal` cuts the log below the
checkpoint, and the node died on the first replicated entry on every restart
(``append of index 81, expected 50``). Here the same storage, persister and a Raft core.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from phalanx.consensus.core import Ready, Receive, Snapshot
from phalanx.consensus.raft.config import RaftConfig, RaftRestoredState
from phalanx.consensus.raft.core import RaftCore
from phalanx.consensus.raft.messages import AppendEntries, AppendEntriesResponse
from phalanx.consensus.types import (
    ClientRequest,
    Configuration,
    Entry,
    EntryKind,
    HardState,
    NodeId,
    SnapshotMeta,
)
from phalanx.net import wire
from phalanx.runtime.persistence import DurableState, LostStateError, ReadyPersister
from phalanx.storage.directory import OsDirectory
from phalanx.storage.files import Storage, open_file_storage
from phalanx.storage.interface import CorruptionError, StorageError, StoredCheckpoint
from phalanx.storage.records import scan
from phalanx.storage.repair import repair_wal
from phalanx.storage.wal import list_segments

VOTERS = (NodeId("n1"), NodeId("n2"), NodeId("n3"))


def _entry(index: int, term: int = 1) -> Entry:
    req = ClientRequest(client_id="c", request_no=index, command=b"cmd%d" % index)
    return Entry(index=index, term=term, kind=EntryKind.COMMAND, requests=(req,))


def _persister(st: Storage) -> ReadyPersister:
    return ReadyPersister(wal=st.wal, hard_state=st.hard_state, checkpoints=st.checkpoints,
                          codec=wire.default_registry())


def _checkpoint(st: Storage, index: int) -> None:
    meta = SnapshotMeta(index=index, term=1, config=Configuration(voters=VOTERS))
    st.checkpoints.save(
        StoredCheckpoint(index=index, data=b"state@%d" % index, meta=wire.encode(meta)))


def _node(root: Path, *, upto: int = 100, checkpoints: tuple[int, ...] = (80,),
          compact: int = 30) -> None:
    """A follower's disk: entries 1..upto durable, checkpoints, the WAL compacted."""
    st = open_file_storage(str(root))
    p = _persister(st)
    p.persist(Ready(number=1, entries=tuple(_entry(i) for i in range(1, upto + 1)),
                    hard_state=HardState(term=1, vote=NodeId("n2"), commit=upto),
                    must_sync=True))
    for index in checkpoints:
        _checkpoint(st, index)
    st.wal.compact_prefix(compact)
    st.close()


def _flip_record(root: Path, index: int) -> None:
    """Flip one payload bit of WAL record `index` (media damage)."""
    (first, name), = [s for s in list_segments(OsDirectory(str(root)))]
    path = root / name
    data = bytearray(path.read_bytes())
    offset = scan(bytes(data), first).offsets[index - first]
    data[offset + 24] ^= 0x10
    path.write_bytes(bytes(data))


def _follow(durable: DurableState, p: ReadyPersister) -> Ready:
    """A Raft core restored from `durable` receives the leader's next entries."""
    snap = (None if durable.snapshot is None
            else Snapshot(meta=durable.snapshot, data=durable.snapshot_bytes() or b""))
    core = RaftCore(RaftConfig(node_id=NodeId("n1"), voters=VOTERS, election_ticks=10,
                               heartbeat_ticks=1),
                    rng=random.Random(1),
                    restored=RaftRestoredState(hard_state=durable.hard_state or HardState(),
                                               snapshot=snap, entries=durable.entries))
    last = durable.entries[-1] if durable.entries else durable.snapshot
    prev, prev_term = (0, 0) if last is None else (last.index, last.term)
    ready = core.step(Receive(src=NodeId("n2"), message=AppendEntries(
        term=2, leader_id=NodeId("n2"), prev_log_index=prev, prev_log_term=prev_term,
        entries=(_entry(prev + 1, 2),), leader_commit=prev + 1)))
    p.persist(ready)  # raised "append of index 81, expected 50" before the fix
    return ready


def test_repair_below_the_checkpoint_restarts_and_follows(tmp_path: Path) -> None:
    _node(tmp_path)
    _flip_record(tmp_path, 50)
    with pytest.raises(CorruptionError):
        open_file_storage(str(tmp_path))
    report = repair_wal(OsDirectory(str(tmp_path)))
    assert report.lost_from_index == 50
    for held in ((), (_entry(81, 2),)):  # every restart, not just the first
        st = open_file_storage(str(tmp_path))
        p = _persister(st)
        durable = p.load()
        assert durable.snapshot is not None
        assert durable.snapshot.index == 80
        assert durable.entries == held
        ready = _follow(durable, p)
        assert durable.log_lost
        assert durable.lost_reason is not None
        assert "index 50" in durable.lost_reason
        assert any(isinstance(m.message, AppendEntriesResponse) and m.message.success
                   for m in ready.messages)
        st.close()
    st = open_file_storage(str(tmp_path))
    assert _persister(st).load().entries == (_entry(81, 2), _entry(82, 2))
    st.close()


def test_repair_above_the_checkpoint_keeps_the_prefix_and_flags_the_loss(
        tmp_path: Path) -> None:
    _node(tmp_path)
    _flip_record(tmp_path, 90)
    repair_wal(OsDirectory(str(tmp_path)))
    st = open_file_storage(str(tmp_path))
    p = _persister(st)
    durable = p.load()
    assert [e.index for e in durable.entries] == list(range(81, 90))
    assert durable.log_lost
    _follow(durable, p)
    p.clear_log_lost()
    st.close()
    st = open_file_storage(str(tmp_path))
    assert not _persister(st).load().log_lost
    st.close()


def test_wal_ending_behind_a_snapshot_install_is_no_loss(tmp_path: Path) -> None:
    """A crash between installing a leader's snapshot and compacting the log."""
    _node(tmp_path, upto=20, checkpoints=(), compact=0)
    st = open_file_storage(str(tmp_path))
    _checkpoint(st, 80)
    st.close()
    st = open_file_storage(str(tmp_path))
    p = _persister(st)
    durable = p.load()
    assert durable.entries == ()
    assert not durable.log_lost
    _follow(durable, p)
    st.close()


def test_gap_after_corrupt_newest_checkpoint_drops_the_log_and_flags_it(
        tmp_path: Path) -> None:
    _node(tmp_path, checkpoints=(10, 80), compact=60)
    (tmp_path / "checkpoint-00000000000000000080.ckpt").write_bytes(b"garbage")
    st = open_file_storage(str(tmp_path))
    p = _persister(st)
    durable = p.load()  # raised "log starts at 61 but the newest checkpoint covers only up to 10"
    assert durable.snapshot is not None
    assert durable.snapshot.index == 10
    assert durable.entries == ()
    assert durable.lost_reason is not None
    assert "index 61" in durable.lost_reason
    _follow(durable, p)
    st.close()


def test_every_checkpoint_corrupt_starts_empty_or_refuses_in_one_line(tmp_path: Path) -> None:
    _node(tmp_path, checkpoints=(40, 80), compact=60)
    for ckpt in tmp_path.glob("checkpoint-*.ckpt"):
        ckpt.write_bytes(b"garbage")
    st = open_file_storage(str(tmp_path))
    with pytest.raises(LostStateError, match="no valid checkpoint; 2 corrupt checkpoint"):
        _persister(st).load(recover_lost=False)
    assert st.wal.first_index() == 61  # refusing touched nothing
    durable = _persister(st).load()
    assert durable.snapshot is None
    assert durable.entries == ()
    assert durable.log_lost
    _follow(durable, _persister(st))
    st.close()


def test_rewind_after_a_failed_write_keeps_only_what_was_synced(tmp_path: Path) -> None:
    """fsyncgate: after a failed write or fsync nothing written since the last successful
    fsync is trusted; `rewind` cuts back to it and the log is writable again."""
    st = open_file_storage(str(tmp_path), segment_bytes=4096)
    wal = st.wal
    wal.append_many([(i, b"x" * 100) for i in range(1, 11)])
    wal.sync()
    wal.append_many([(i, b"y" * 100) for i in range(11, 61)])  # rolls into new segments
    real_fsync = OsDirectory.fsync

    def failing(d: OsDirectory, name: str) -> None:
        raise OSError(28, "No space left on device")

    OsDirectory.fsync = failing  # type: ignore[method-assign]
    try:
        with pytest.raises(StorageError, match="No space left"):
            wal.sync()
        with pytest.raises(StorageError, match="failed earlier"):
            wal.append(61, b"z")
    finally:
        OsDirectory.fsync = real_fsync  # type: ignore[method-assign]
    wal.rewind()
    assert wal.last_index() >= 10
    assert wal.read(1, 11) == [b"x" * 100] * 10
    last = wal.last_index()
    wal.append_many([(i, b"w") for i in range(last + 1, 70)])
    wal.sync()
    st.close()
    reopened = open_file_storage(str(tmp_path), segment_bytes=4096)
    assert reopened.wal.last_index() == 69
    assert reopened.wal.read(last + 1, 70) == [b"w"] * (69 - last)
    reopened.close()
