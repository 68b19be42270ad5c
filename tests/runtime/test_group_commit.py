"""Group commit against Ready-by-Ready persistence: whatever way a sequence of Readys is cut
into batches, `GroupCommitter` leaves the same log and (once its deferred commit is flushed)
the same hard state as `ReadyPersister.persist` applied to each Ready, with at most one sync
per batch, and only in batches that asked for one."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.consensus.core import Ready
from phalanx.consensus.types import Entry, EntryKind, HardState, NodeId
from phalanx.net import wire
from phalanx.runtime.group_commit import GroupCommitter
from phalanx.runtime.persistence import ReadyPersister
from phalanx.storage.memory import MemoryDisk


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
