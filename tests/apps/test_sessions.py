"""Sessions expire deterministically (replicated state): past `max_sessions` live sessions the
least recently written (by applied index, then client id) becomes a tombstone at apply time;
an old request of an expired session is refused, never applied twice; the table survives
checkpoints (envelope version 2) and a version-1 checkpoint still loads. (The attack: ~190k
sessions cost +60 MB on every replica and were never freed.)"""

from __future__ import annotations

import immutables
import msgpack  # type: ignore[import-untyped]
from hypothesis import given, settings
from hypothesis import strategies as st
from test_replica import CONFIG, command, decode_entry, req

from phalanx.apps.envelope import Session, parse_envelope
from phalanx.apps.kv import KvStateMachine
from phalanx.apps.kv_types import Put
from phalanx.apps.replica import ApplyStatus, CheckpointPolicy, Replica
from phalanx.apps.sessions import SessionTable
from phalanx.net import wire
from phalanx.storage.memory import MemoryDisk


def replica(disk: MemoryDisk, max_sessions: int) -> Replica:
    storage = disk.open()
    return Replica(KvStateMachine(), checkpoints=storage.checkpoints, wal=storage.wal,
                   decode_entry=decode_entry, config=CONFIG, max_sessions=max_sessions,
                   policy=CheckpointPolicy(every_entries=0, every_bytes=0))


def put(client: str, n: int) -> object:
    return req(client, n, Put(key=client, value=str(n).encode()))


def test_the_least_recently_written_session_expires_and_its_old_requests_are_refused() -> None:
    r = replica(MemoryDisk("n1"), max_sessions=2)
    r.apply(command(1, put("a", 1)))  # type: ignore[arg-type]
    r.apply(command(2, put("b", 1)))  # type: ignore[arg-type]
    r.apply(command(3, put("a", 2)))  # type: ignore[arg-type]  # a is now newer than b
    r.apply(command(4, put("c", 1)))  # type: ignore[arg-type]  # b expires
    assert r.session("b") is None
    assert r.session("a") is not None
    assert r.status().sessions == 2
    assert r.status().expired_sessions == 1
    # b's retry must not run again: refused as SESSION_EXPIRED, state unchanged.
    (retry,) = r.apply(command(5, put("b", 1)))  # type: ignore[arg-type]
    assert retry.status is ApplyStatus.SESSION_EXPIRED
    # A NEW request of b runs and revives its session.
    (fresh,) = r.apply(command(6, put("b", 2)))  # type: ignore[arg-type]
    assert fresh.status is ApplyStatus.APPLIED
    assert r.session("b") is not None


def test_ties_within_one_entry_expire_by_client_id() -> None:
    r = replica(MemoryDisk("n1"), max_sessions=2)
    r.apply(command(1, put("z", 1), put("y", 1), put("x", 1)))  # type: ignore[arg-type]
    assert r.session("x") is None  # (1, "x") is the smallest
    assert r.session("y") is not None
    assert r.session("z") is not None


def test_a_version_1_checkpoint_still_loads() -> None:
    header = msgpack.packb(["phalanx.replica", 1, 7, 2])
    records = msgpack.packb(["a", 3, b"ra", "b", 1, b"rb"])
    kv = b"".join(KvStateMachine().snapshot().chunks())
    parsed = parse_envelope(header + records + kv)
    assert parsed.index == 7
    assert parsed.sessions["a"] == Session(request_no=3, result=b"ra", last_index=0)
    assert len(parsed.tombstones) == 0
    assert parsed.app_data == kv


ops = st.lists(st.lists(st.tuples(st.sampled_from("abcdefg"), st.integers(1, 6)),
                        min_size=1, max_size=3), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(ops, st.integers(1, 4), st.data())
def test_expiry_is_the_same_live_after_replay_and_after_a_checkpoint(
        entries: list[list[tuple[str, int]]], max_sessions: int, data: st.DataObject) -> None:
    """A replica that applied everything live, one that restarted from a checkpoint taken at
    a random index and replayed the rest from its WAL: equal sessions, tombstones and expiry
    order, and the table never above its bound."""
    disk = MemoryDisk("n1")
    storage = disk.open()
    live = Replica(KvStateMachine(), checkpoints=storage.checkpoints, wal=storage.wal,
                   decode_entry=decode_entry, config=CONFIG, max_sessions=max_sessions,
                   policy=CheckpointPolicy(every_entries=0, every_bytes=0))
    cut = data.draw(st.integers(0, len(entries)))
    for index, requests in enumerate(entries, 1):
        entry = command(index, *(put(c, n) for c, n in requests))  # type: ignore[arg-type]
        storage.wal.append(index, wire.encode(entry))
        live.apply(entry)
        assert live.status().sessions <= max_sessions
        if index == cut:
            live.checkpoint_now()
    restored = Replica(KvStateMachine(), checkpoints=storage.checkpoints, wal=storage.wal,
                       decode_entry=decode_entry, config=CONFIG, max_sessions=max_sessions)
    restored.restore_latest()
    assert restored.applied_index == live.applied_index
    table_live: SessionTable = live._table
    table_restored: SessionTable = restored._table
    assert table_restored.sessions == table_live.sessions
    assert table_restored.tombstones == table_live.tombstones
    assert list(table_restored._order) == list(table_live._order)
    assert isinstance(table_live.sessions, immutables.Map)
