"""The replay fast paths give exactly the live results: KV command decoding shortcuts agree
with the generic codec on any bytes, and a replica rebuilt by WAL replay has the live state
and the live session table (cached replies included)."""

from __future__ import annotations

import msgpack  # type: ignore[import-untyped]
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.apps import kv_wire
from phalanx.apps.kv import KvStateMachine
from phalanx.apps.kv_types import (
    CasResult,
    CompareAndSet,
    Delete,
    Done,
    Get,
    KvCommand,
    KvError,
    KvErrorCode,
    Put,
)
from phalanx.apps.replica import CheckpointPolicy, Replica
from phalanx.consensus.types import ClientRequest, Configuration, Entry, EntryKind, NodeId
from phalanx.net import wire
from phalanx.net.codec import DecodeError
from phalanx.storage.memory import MemoryDisk

CONFIG = Configuration(voters=(NodeId("n1"),))


def decode_entry(data: bytes) -> Entry:
    return wire.decode(data, expected=Entry)


def generic_decode_command(data: bytes) -> KvCommand | KvError:
    """`kv_wire.decode_command` without its shortcut: the registry alone."""
    try:
        obj = kv_wire.REGISTRY.decode(data)
    except DecodeError as exc:
        return KvError(code=KvErrorCode.MALFORMED, message=f"undecodable KV command: {exc}")
    if not isinstance(obj, Put | Get | Delete | CompareAndSet):
        return KvError(
            code=KvErrorCode.MALFORMED, message=f"{type(obj).__name__} is not a KV command"
        )
    return obj


put_frames = st.builds(Put, key=st.text(max_size=8), value=st.binary(max_size=8)).map(
    kv_wire.encode_command
)
# Near-misses of a Put frame: other type ids, wrong field types, extra/missing fields, maps.
near_misses = st.lists(
    st.one_of(st.integers(398, 402), st.text(max_size=3), st.binary(max_size=3), st.none(),
              st.booleans(), st.dictionaries(st.text(max_size=2), st.integers(-9, 9), max_size=1)),
    max_size=4,
).map(lambda items: msgpack.packb(items, use_bin_type=True))


@settings(max_examples=300, deadline=None)
@given(st.one_of(put_frames, near_misses, st.binary(max_size=12),
                 put_frames.map(lambda b: b + b"\x00"), put_frames.map(lambda b: b[:-1])))
def test_put_shortcut_agrees_with_the_codec(data: bytes) -> None:
    assert kv_wire.decode_command(data) == generic_decode_command(data)


def test_done_shortcut_is_the_canonical_encoding() -> None:
    encoded = kv_wire.encode_result(Done())
    assert encoded == kv_wire.REGISTRY.encode(Done())
    assert kv_wire.decode_result(encoded) == Done()
    other = CasResult(succeeded=False, current=b"x")
    assert kv_wire.decode_result(kv_wire.encode_result(other)) == other


clients = st.sampled_from(["c1", "c2", "c3", "c4"])
keys = st.sampled_from(["a", "b", "c"])
vals = st.sampled_from([b"", b"1", b"2"])
commands = st.one_of(
    st.builds(Put, key=keys, value=vals),
    st.builds(Delete, key=keys),
    st.builds(CompareAndSet, key=keys, expected=st.none() | vals, new=vals),
    st.builds(Get, key=keys),
)
# (client, command, how): 0 new request, 1 retry of the last, 2 stale retry (older number),
# 3 read-only query.
requests = st.tuples(clients, commands, st.integers(0, 3))
scripts = st.lists(st.lists(requests, min_size=1, max_size=3), min_size=1, max_size=40)


def build(script: list[list[tuple[str, KvCommand, int]]]) -> list[Entry]:
    sent: dict[str, list[ClientRequest]] = {}
    entries: list[Entry] = []
    for index, batch in enumerate(script, start=1):
        out: list[ClientRequest] = []
        for client, cmd, how in batch:
            history = sent.setdefault(client, [])
            if how == 3:
                out.append(ClientRequest(client_id=client, request_no=0, read_only=True,
                                         command=kv_wire.encode_command(cmd)))
            elif how in (1, 2) and history:
                out.append(history[-1] if how == 1 else history[0])
            else:
                request = ClientRequest(client_id=client, request_no=len(history) + 1,
                                        command=kv_wire.encode_command(cmd))
                history.append(request)
                out.append(request)
        entries.append(Entry(index=index, term=1, kind=EntryKind.COMMAND, requests=tuple(out)))
    return entries


@settings(max_examples=80, deadline=None)
@given(scripts, st.integers(min_value=0, max_value=45))
def test_replayed_replica_equals_the_live_one(
    script: list[list[tuple[str, KvCommand, int]]], checkpoint_at: int
) -> None:
    entries = build(script)
    disk = MemoryDisk("n1")
    storage = disk.open()
    policy = CheckpointPolicy(every_entries=0, every_bytes=0)
    live = Replica(KvStateMachine(), checkpoints=storage.checkpoints, wal=storage.wal,
                   decode_entry=decode_entry, policy=policy, config=CONFIG)
    for entry in entries:
        storage.wal.append(entry.index, wire.encode(entry))
        live.apply(entry)
        if entry.index == checkpoint_at:
            assert live.checkpoint_now()
            live.poll()
    storage.wal.sync()

    reopened = disk.open()
    replayed = Replica(KvStateMachine(), checkpoints=reopened.checkpoints, wal=reopened.wal,
                       decode_entry=decode_entry, policy=policy, config=CONFIG)
    report = replayed.restore_latest()
    assert report.applied_index == live.applied_index == len(entries)
    assert report.replayed == len(entries) - report.checkpoint_index
    live_kv, replayed_kv = live.machine, replayed.machine
    assert isinstance(live_kv, KvStateMachine)
    assert isinstance(replayed_kv, KvStateMachine)
    assert b"".join(replayed_kv.snapshot().chunks()) == b"".join(live_kv.snapshot().chunks())
    assert replayed.status().sessions == live.status().sessions
    for client in ("c1", "c2", "c3", "c4"):
        assert replayed.session(client) == live.session(client)  # cached replies included
    # The same retries after recovery get the same answers as on the live replica.
    retries = tuple(
        r for e in entries for r in e.requests if not r.read_only
    )
    if retries:
        nxt = Entry(index=len(entries) + 1, term=1, kind=EntryKind.COMMAND, requests=retries)
        assert replayed.apply(nxt) == live.apply(nxt)
