"""The log tail a checkpoint leaves behind: bounded by entries AND bytes (issue #4's RSS).

`RaftConfig.log_tail_after_compaction` keeps up to N entries before a checkpoint's index so
that slightly lagging followers get entries instead of a snapshot; `log_tail_max_bytes` also
bounds those entries' bytes, since after a bulk load each entry is a batch of many commands.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.consensus.core import CheckpointTaken, Tick
from phalanx.consensus.raft import RaftConfig, RaftCore, RaftRestoredState
from phalanx.consensus.raft.log import RaftLog, entry_size
from phalanx.consensus.types import (
    ClientRequest,
    Configuration,
    Entry,
    EntryKind,
    HardState,
    LocalProtocolError,
    NodeId,
)

N1, N2, N3 = NodeId("n1"), NodeId("n2"), NodeId("n3")


def _entry(index: int, payload: int, *, requests: int = 1) -> Entry:
    reqs = tuple(ClientRequest(client_id="c", request_no=index * 1000 + k,
                               command=b"x" * payload) for k in range(requests))
    return Entry(index=index, term=1, kind=EntryKind.COMMAND, requests=reqs)


def _follower(entries: list[Entry], **kw: int) -> RaftCore:
    """A follower that restarts with `entries` all committed, then applies them."""
    cfg = RaftConfig(node_id=N1, voters=(N1, N2, N3), **kw)  # type: ignore[arg-type]
    restored = RaftRestoredState(hard_state=HardState(term=1, commit=len(entries)),
                                 entries=tuple(entries))
    c = RaftCore(cfg, rng=random.Random(1), restored=restored)
    rd = c.step(Tick())
    assert [e.index for e in rd.committed] == [e.index for e in entries]
    return c


def test_default_bounds_are_100_entries_and_one_mib() -> None:
    cfg = RaftConfig(node_id=N1, voters=(N1,))
    assert (cfg.log_tail_after_compaction, cfg.log_tail_max_bytes) == (100, 1 << 20)


def test_small_entries_keep_the_entry_count() -> None:
    c = _follower([_entry(i, 10) for i in range(1, 301)])
    c.step(CheckpointTaken(index=250, data=b"s"))
    assert c.log.offset == 150  # 100 entries kept before the checkpoint's index
    assert c.log.last_index() == 300


def test_large_entries_are_bounded_by_bytes() -> None:
    # Each entry is a batch of 10 commands of ~11 KB: 100 of them would be ~11 MB.
    entries = [_entry(i, 11_000, requests=10) for i in range(1, 201)]
    size = entry_size(entries[0])
    c = _follower(entries, log_tail_max_bytes=3 * size + size // 2)
    c.step(CheckpointTaken(index=150, data=b"s"))
    assert c.log.offset == 147  # 148, 149 and 150 fit in 3.5 entries' worth of bytes
    kept = c.log.between(c.log.offset + 1, 151)
    assert sum(entry_size(e) for e in kept) <= c.cfg.log_tail_max_bytes
    assert c.status().snapshot_index == 150


def test_an_entry_larger_than_the_byte_bound_is_compacted_with_the_checkpoint() -> None:
    c = _follower([_entry(i, 5_000) for i in range(1, 11)], log_tail_max_bytes=1_000)
    c.step(CheckpointTaken(index=8, data=b"s"))
    assert c.log.offset == 8
    c = _follower([_entry(i, 5_000) for i in range(1, 11)], log_tail_max_bytes=0)
    c.step(CheckpointTaken(index=8, data=b"s"))
    assert c.log.offset == 8


def test_negative_bounds_are_refused() -> None:
    with pytest.raises(LocalProtocolError, match="log_tail_max_bytes"):
        RaftConfig(node_id=N1, voters=(N1,), log_tail_max_bytes=-1)
    with pytest.raises(LocalProtocolError, match="log_tail_after_compaction"):
        RaftConfig(node_id=N1, voters=(N1,), log_tail_after_compaction=-1)


def test_tail_start_refuses_an_index_outside_the_log() -> None:
    log = RaftLog(offset=5, offset_term=1, base_config=Configuration(voters=(N1,)))
    log.append([_entry(6, 1)])
    assert log.tail_start(5, max_entries=10, max_bytes=10) == 5  # the offset itself
    for index in (4, 7):
        with pytest.raises(LocalProtocolError):
            log.tail_start(index, max_entries=10, max_bytes=10)


@settings(max_examples=150, deadline=None)
@given(
    offset=st.integers(0, 20),
    sizes=st.lists(st.integers(0, 400), min_size=1, max_size=40),
    max_entries=st.integers(0, 45),
    max_bytes=st.integers(0, 4_000),
    data=st.data(),
)
def test_tail_start_keeps_the_longest_run_within_both_bounds(
    offset: int, sizes: list[int], max_entries: int, max_bytes: int, data: st.DataObject
) -> None:
    log = RaftLog(offset=offset, offset_term=1, base_config=Configuration(voters=(N1,)))
    log.append([_entry(offset + 1 + k, n) for k, n in enumerate(sizes)])
    index = data.draw(st.integers(offset, log.last_index()))
    start = log.tail_start(index, max_entries=max_entries, max_bytes=max_bytes)

    def fits(lo: int) -> bool:  # keeping entries lo+1..index respects both bounds
        kept = log.between(lo + 1, index + 1) if lo < index else ()
        return len(kept) <= max_entries and sum(entry_size(e) for e in kept) <= max_bytes

    assert offset <= start <= index
    assert fits(start)
    # Longest: keeping one more entry breaks a bound, or there is none left to keep.
    assert start == offset or not fits(start - 1)
