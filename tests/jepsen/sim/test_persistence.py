"""`phalanx.runtime.persistence`: Ready persistence over the memory disk, and what survives a
crash."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.consensus.core import Ready, Snapshot
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
from phalanx.runtime.persistence import ReadyPersister
from phalanx.storage.interface import StoredCheckpoint
from phalanx.storage.memory import MemoryDisk

CONFIG = Configuration(voters=(NodeId("n1"), NodeId("n2"), NodeId("n3")))


def _entry(index: int, term: int) -> Entry:
    req = ClientRequest(client_id="c", request_no=index, command=b"cmd%d" % index)
    return Entry(index=index, term=term, kind=EntryKind.COMMAND, requests=(req,))


def _persister(disk: MemoryDisk) -> ReadyPersister:
    st_ = disk.open()
    return ReadyPersister(
        wal=st_.wal, hard_state=st_.hard_state, checkpoints=st_.checkpoints,
        codec=wire.default_registry(),
    )


def test_persist_truncate_and_reload() -> None:
    disk = MemoryDisk("n1")
    p = _persister(disk)
    p.persist(Ready(number=1, entries=tuple(_entry(i, 1) for i in range(1, 6)),
                    hard_state=HardState(term=1, vote=NodeId("n2")), must_sync=True))
    p.persist(Ready(number=2, truncate_from=4, entries=(_entry(4, 2),),
                    hard_state=HardState(term=2, vote=None, commit=3), must_sync=True))
    loaded = _persister(disk).load()
    assert loaded.hard_state == HardState(term=2, vote=None, commit=3)
    assert loaded.entries == (_entry(1, 1), _entry(2, 1), _entry(3, 1), _entry(4, 2))
    assert loaded.snapshot is None


def test_snapshot_resets_the_log() -> None:
    disk = MemoryDisk("n1")
    p = _persister(disk)
    p.persist(Ready(number=1, entries=tuple(_entry(i, 1) for i in range(1, 4)), must_sync=True))
    meta = SnapshotMeta(index=10, term=3, config=CONFIG)
    installed: list[int] = []

    def install(m: SnapshotMeta, data: bytes) -> None:
        installed.append(m.index)
        p.checkpoints.save(p_checkpoint(m, data))

    p.persist(Ready(number=2, snapshot=Snapshot(meta=meta, data=b"state"),
                    entries=(_entry(11, 3),), must_sync=True), install=install)
    assert installed == [10]
    loaded = _persister(disk).load()
    assert loaded.snapshot == meta
    assert loaded.snapshot_bytes() == b"state"  # the data may be a view over pack files
    assert loaded.entries == (_entry(11, 3),)


def p_checkpoint(meta: SnapshotMeta, data: bytes) -> StoredCheckpoint:
    return StoredCheckpoint(index=meta.index, data=data, meta=wire.encode(meta))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32), synced=st.integers(1, 8), extra=st.integers(0, 8))
def test_crash_keeps_synced_prefix(seed: int, synced: int, extra: int) -> None:
    """A crash loses at most the un-synced suffix: what reloads is a prefix of what was
    written, and contains everything written before the last sync."""
    disk = MemoryDisk("n1")
    p = _persister(disk)
    written = [_entry(i, 1) for i in range(1, synced + extra + 1)]
    p.persist(Ready(number=1, entries=tuple(written[:synced]), must_sync=True))
    if extra:
        p.persist(Ready(number=2, entries=tuple(written[synced:]), must_sync=False))
    disk.crash(random.Random(seed))
    loaded = _persister(disk).load()
    assert len(loaded.entries) >= synced
    assert list(loaded.entries) == written[: len(loaded.entries)]
