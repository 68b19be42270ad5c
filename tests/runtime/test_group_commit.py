"""Group commit against Ready-by-Ready persistence: whatever way a sequence of Readys is cut
into batches, `GroupCommitter` leaves the same log and (once its deferred commit is flushed)
the same hard state as `ReadyPersister.persist` applied to each Ready, with at most one sync
per batch, and only in batches that asked for one. With `overlap_wal_sync`, the WAL's fsync
runs on a helper thread beside the core-state journal's, and the batch is durable (and
fails) as a whole."""

from __future__ import annotations

import errno
import random
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.consensus.core import Ready
from phalanx.consensus.pbft import PBFT_MESSAGES, PbftDurableState
from phalanx.consensus.pbft.durable import PbftDeltaRules
from phalanx.consensus.types import Entry, EntryKind, HardState, NodeId
from phalanx.net import wire
from phalanx.runtime.group_commit import GroupCommitter
from phalanx.runtime.persistence import ReadyPersister, StateJournal
from phalanx.storage.interface import StorageError
from phalanx.storage.memory import MemoryDirectory, MemoryDisk


def _persister(name: str) -> ReadyPersister:
    storage = MemoryDisk(name).open()
    return ReadyPersister(wal=storage.wal, hard_state=storage.hard_state,
                          checkpoints=storage.checkpoints, codec=wire.default_registry())


@st.composite
def readys(draw: st.DrawFn) -> list[Ready]:
    """A plausible Raft sequence: appends, truncations of the tail, term/vote/commit moves."""
    out: list[Ready] = []
    last = 0
    term = 1
    commit = 0
    for number in range(1, draw(st.integers(1, 12)) + 1):
        truncate = None
        if last and draw(st.booleans()) and draw(st.booleans()):
            truncate = draw(st.integers(max(commit + 1, 1), last + 1))
            last = truncate - 1
        term += draw(st.integers(0, 1))
        count = draw(st.integers(0, 3))
        entries = tuple(Entry(index=last + i + 1, term=term, kind=EntryKind.NOOP)
                        for i in range(count))
        last += count
        hs = None
        if draw(st.booleans()):
            commit = draw(st.integers(commit, last))
            vote = draw(st.sampled_from([None, NodeId("n1"), NodeId("n2")]))
            hs = HardState(term=term, vote=vote, commit=commit)
        out.append(Ready(number=number, truncate_from=truncate, entries=entries,
                         hard_state=hs, must_sync=draw(st.booleans())))
    return out


def _log(persister: ReadyPersister) -> list[bytes]:
    wal = persister.wal
    if wal.last_index() < wal.first_index():
        return []
    return list(wal.read(wal.first_index(), wal.last_index() + 1))


@settings(max_examples=60, deadline=None)
@given(readys(), st.data())
def test_batches_persist_what_ready_by_ready_persistence_does(
        sequence: list[Ready], data: st.DataObject) -> None:
    one_by_one = _persister("a")
    for ready in sequence:
        one_by_one.persist(ready)

    grouped = _persister("b")
    committer = GroupCommitter(grouped, install=None, saved=None)
    cuts = sorted(data.draw(st.sets(st.integers(1, len(sequence) - 1)))) if len(sequence) > 1 \
        else []
    start = 0
    for end in [*cuts, len(sequence)]:
        batch = sequence[start:end]
        synced = committer.persist(batch)
        assert synced == any(r.must_sync for r in batch)
        start = end
    assert committer.syncs <= len(cuts) + 1

    assert _log(grouped) == _log(one_by_one)
    committer.flush_commit()
    assert grouped.hard_state.load() == one_by_one.hard_state.load()


# --------------------------------------------------------------------- overlapped WAL sync


class ThreadNoting(MemoryDirectory):
    """Records the thread of every fsync; fails them when `fail` is set."""

    def __init__(self, label: str) -> None:
        super().__init__(label)
        self.fsync_threads: list[str] = []
        self.fail = False

    def fsync(self, name: str) -> None:
        self.fsync_threads.append(threading.current_thread().name)
        if self.fail:
            raise OSError(errno.EIO, "Input/output error")
        super().fsync(name)


def _journaled(overlap: bool) -> tuple[GroupCommitter, MemoryDisk, ThreadNoting]:
    """A committer whose WAL is on `disk` and whose core state is a `StateJournal` in its
    own directory (as `phalanx.runtime.node` builds it)."""
    wire.register_all(PBFT_MESSAGES)
    disk = MemoryDisk("wal")
    disk.directory = ThreadNoting("wal")
    storage = disk.open()
    journal_dir = ThreadNoting("journal")
    journal = StateJournal(journal_dir, codec=wire.default_registry(), rules=PbftDeltaRules())
    persister = ReadyPersister(wal=storage.wal, hard_state=storage.hard_state,
                               checkpoints=storage.checkpoints, codec=wire.default_registry(),
                               core_state=journal)
    return (GroupCommitter(persister, install=None, saved=None, overlap_wal_sync=overlap),
            disk, journal_dir)


def _batch(index: int, view: int) -> list[Ready]:
    """Released entries (no sync of their own) and a record that must be durable."""
    entry = Entry(index=index, term=0, kind=EntryKind.NOOP)
    return [Ready(number=2 * index - 1, entries=(entry,)),
            Ready(number=2 * index, core_state=PbftDurableState(view=view), must_sync=True)]


def test_the_wal_is_fsynced_beside_the_journal_and_both_are_durable() -> None:
    committer, disk, journal_dir = _journaled(overlap=True)
    wal_dir = disk.directory
    assert isinstance(wal_dir, ThreadNoting)
    assert committer.persist(_batch(1, view=1))  # first record: a full journal rewrite
    assert committer.persist(_batch(2, view=2))  # a delta append
    assert committer.overlapped_syncs == 2
    me = threading.current_thread().name
    assert wal_dir.fsync_threads
    assert all(t.startswith("wal-sync") for t in wal_dir.fsync_threads)
    assert journal_dir.fsync_threads
    assert all(t == me for t in journal_dir.fsync_threads)
    assert not committer.wal_unsynced
    # A batch with no new log records has no WAL fsync to overlap: nothing on the helper.
    assert committer.persist([Ready(number=5, core_state=PbftDurableState(view=3),
                                    must_sync=True)])
    assert committer.overlapped_syncs == 2
    for seed in range(6):  # both survive any power loss
        disk.crash(random.Random(seed))
        journal_dir.crash(random.Random(seed))
        assert disk.open().wal.last_index() == 2, f"seed {seed}"
        journal = StateJournal(journal_dir, codec=wire.default_registry(),
                               rules=PbftDeltaRules())
        assert journal.load_state() == PbftDurableState(view=3), f"seed {seed}"


def test_without_overlap_the_wal_is_fsynced_on_the_calling_thread() -> None:
    committer, disk, _ = _journaled(overlap=False)
    committer.persist(_batch(1, view=1))
    wal_dir = disk.directory
    assert isinstance(wal_dir, ThreadNoting)
    assert wal_dir.fsync_threads == [threading.current_thread().name]
    assert committer.overlapped_syncs == 0


def test_a_failed_overlapped_wal_fsync_fails_the_batch() -> None:
    committer, disk, _ = _journaled(overlap=True)
    wal_dir = disk.directory
    assert isinstance(wal_dir, ThreadNoting)
    wal_dir.fail = True
    with pytest.raises(StorageError):
        committer.persist(_batch(1, view=1))
    assert committer.wal_unsynced  # nothing of it counts as durable
