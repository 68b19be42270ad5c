"""The replica layer: exactly-once, ordering, sessions, checkpoints, compaction, recovery."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.apps import kv_wire
from phalanx.apps.interface import SnapshotFormatError
from phalanx.apps.kv import KvStateMachine
from phalanx.apps.kv_types import CompareAndSet, Delete, Get, KvCommand, Put, Value
from phalanx.apps.replica import (
    Applied,
    ApplyStatus,
    CheckpointPolicy,
    RecoveryError,
    Replica,
)
from phalanx.apps.writer import ThreadedCheckpointWriter
from phalanx.consensus.types import (
    ClientRequest,
    Configuration,
    Entry,
    EntryKind,
    LocalProtocolError,
    NodeId,
    SnapshotMeta,
)
from phalanx.net import wire
from phalanx.storage.files import Storage
from phalanx.storage.memory import MemoryDisk, SimulatedCrash

CONFIG = Configuration(voters=(NodeId("n1"),))


def decode_entry(data: bytes) -> Entry:
    return wire.decode(data, expected=Entry)


def req(client: str, n: int, cmd: KvCommand, *, read_only: bool = False) -> ClientRequest:
    return ClientRequest(
        client_id=client, request_no=n, command=kv_wire.encode_command(cmd), read_only=read_only
    )


def command(index: int, *requests: ClientRequest, term: int = 1) -> Entry:
    return Entry(index=index, term=term, kind=EntryKind.COMMAND, requests=requests)


@dataclass
class Node:
    """A one-node driver: append + fsync the entry, then apply it (the `Ready` order)."""

    disk: MemoryDisk
    policy: CheckpointPolicy
    storage: Storage = field(init=False)
    replica: Replica = field(init=False)

    def __post_init__(self) -> None:
        self.open()

    def open(self) -> None:
        self.storage = self.disk.open()
        self.replica = Replica(
            KvStateMachine(),
            checkpoints=self.storage.checkpoints,
            wal=self.storage.wal,
            decode_entry=decode_entry,
            policy=self.policy,
            config=CONFIG,
        )

    @property
    def kv(self) -> KvStateMachine:
        machine = self.replica.machine
        assert isinstance(machine, KvStateMachine)
        return machine

    def commit(self, entry: Entry) -> tuple[Applied, ...]:
        self.storage.wal.append(entry.index, wire.encode(entry))
        self.storage.wal.sync()
        out = self.replica.apply(entry)
        self.replica.poll()
        return out

    def crash_and_recover(self, rng: random.Random) -> None:
        self.disk.crash(rng)
        self.open()
        self.replica.restore_latest()


def new_node(**policy: int) -> Node:
    return Node(MemoryDisk("n1"), CheckpointPolicy(**policy))


def state(kv: KvStateMachine) -> bytes:
    return b"".join(kv.snapshot().chunks())


# -------------------------------------------------------------------------------- exactly once


def test_retry_is_answered_from_the_session_table() -> None:
    node = new_node(every_entries=0, every_bytes=0)
    cas = req("c1", 1, CompareAndSet(key="k", expected=None, new=b"v"))
    (first,) = node.commit(command(1, cas))
    assert first.status is ApplyStatus.APPLIED
    # the same request committed again (a client retry that reached the log twice)
    (retry,) = node.commit(command(2, cas))
    assert retry.status is ApplyStatus.DUPLICATE
    assert retry.result == first.result  # the cached reply, not a failed second CAS
    (older,) = node.commit(command(3, req("c1", 0, Put(key="k", value=b"old"))))
    assert older.status is ApplyStatus.EXPIRED
    assert older.result == b""
    assert node.kv.get("k") == b"v"
    (other,) = node.commit(command(4, req("c2", 1, Put(key="k", value=b"c2"))))
    assert other.status is ApplyStatus.APPLIED
    assert node.kv.get("k") == b"c2"


def test_duplicates_inside_one_entry_and_read_only_requests() -> None:
    node = new_node(every_entries=0, every_bytes=0)
    put = req("c", 5, Put(key="a", value=b"1"))
    read = req("r", 1, Get(key="a"), read_only=True)
    out = node.commit(command(1, put, put, read, read))
    assert [a.status for a in out] == [
        ApplyStatus.APPLIED,
        ApplyStatus.DUPLICATE,
        ApplyStatus.READ,
        ApplyStatus.READ,
    ]
    assert kv_wire.decode_result(out[2].result) == Value(value=b"1")
    assert node.replica.session("r") is None  # reads do not create sessions


def test_redelivered_entries_are_skipped_and_gaps_are_errors() -> None:
    node = new_node(every_entries=0, every_bytes=0)
    e1 = command(1, req("c", 1, Put(key="a", value=b"1")))
    node.commit(e1)
    assert node.replica.apply(e1) == ()
    assert node.replica.status().skipped_entries == 1
    with pytest.raises(LocalProtocolError):
        node.replica.apply(command(3, req("c", 2, Put(key="a", value=b"3"))))
    assert node.replica.applied_index == 1
    assert node.kv.get("a") == b"1"


def test_noop_and_config_entries_only_advance_the_index() -> None:
    node = new_node(every_entries=0, every_bytes=0)
    new_config = Configuration(voters=(NodeId("n1"), NodeId("n2")))
    assert node.commit(Entry(index=1, term=2, kind=EntryKind.NOOP)) == ()
    assert node.commit(Entry(index=2, term=2, kind=EntryKind.CONFIG, config=new_config)) == ()
    assert node.replica.applied_index == 2
    assert len(node.kv) == 0
    assert node.replica.snapshot_meta() == SnapshotMeta(index=2, term=2, config=new_config)


# -------------------------------------------------------------------------------- checkpoints


def test_checkpoint_every_n_entries_compacts_the_wal_and_keeps_sessions() -> None:
    node = new_node(every_entries=4)
    for i in range(1, 10):
        node.commit(command(i, req("c", i, Put(key=f"k{i}", value=b"v"))))
    assert node.storage.checkpoints.indexes()[-1] == 8
    assert node.replica.status().checkpoint_index == 8
    assert node.storage.wal.first_index() == 9  # compacted up to the durable checkpoint
    node.crash_and_recover(random.Random(1))
    assert node.replica.applied_index == 9
    # the session table came back from the checkpoint (request 8) and the replay (9)
    (again,) = node.commit(command(10, req("c", 8, Put(key="k8", value=b"x"))))
    assert again.status is ApplyStatus.EXPIRED
    (again,) = node.commit(command(11, req("c", 9, Put(key="k9", value=b"x"))))
    assert again.status is ApplyStatus.DUPLICATE
    assert node.kv.get("k9") == b"v"


def test_checkpoint_by_bytes_and_compact_lag() -> None:
    node = new_node(every_entries=0, every_bytes=200, compact_lag=2)
    i = 0
    while node.replica.status().checkpoints_written == 0:
        i += 1
        node.commit(command(i, req("c", i, Put(key="k", value=b"x" * 40))))
    taken = node.storage.checkpoints.indexes()[-1]
    assert taken == i
    assert node.storage.wal.first_index() == taken - 1  # two entries kept below it


def test_poll_reports_checkpoint_taken_for_the_core() -> None:
    node = new_node(every_entries=0, every_bytes=0)
    node.commit(command(1, req("c", 1, Put(key="a", value=b"1"))))
    assert node.replica.checkpoint_now()
    assert not node.replica.checkpoint_now()  # nothing new since
    (taken,) = node.replica.poll()
    assert taken.index == 1
    other = Replica(KvStateMachine(), checkpoints=MemoryDisk("n2").open().checkpoints)
    meta = node.replica.snapshot_meta()
    assert meta is not None
    other.install(meta, taken.data)
    assert other.applied_index == 1
    machine = other.machine
    assert isinstance(machine, KvStateMachine)
    assert machine.get("a") == b"1"
    assert other.session("c") == node.replica.session("c")
    assert other.snapshot_meta() == meta


def test_install_rejects_bad_data_and_going_backwards() -> None:
    node = new_node(every_entries=0, every_bytes=0)
    node.commit(command(1, req("c", 1, Put(key="a", value=b"1"))))
    node.replica.checkpoint_now()
    (taken,) = node.replica.poll()
    meta = SnapshotMeta(index=1, term=1, config=CONFIG)
    fresh = Replica(KvStateMachine(), checkpoints=MemoryDisk("n3").open().checkpoints)
    with pytest.raises(SnapshotFormatError):
        fresh.install(meta, taken.data[:-1])
    with pytest.raises(SnapshotFormatError):
        fresh.install(SnapshotMeta(index=2, term=1, config=CONFIG), taken.data)
    assert fresh.applied_index == 0
    with pytest.raises(LocalProtocolError):
        node.replica.install(meta, taken.data)


def test_threaded_writer_produces_the_same_checkpoint() -> None:
    disk = MemoryDisk("t")
    storage = disk.open()
    writer = ThreadedCheckpointWriter(storage.checkpoints)
    threaded = Replica(KvStateMachine(), checkpoints=storage.checkpoints, writer=writer,
                       policy=CheckpointPolicy(every_entries=50, every_bytes=0), config=CONFIG)
    inline = new_node(every_entries=50, every_bytes=0)
    for i in range(1, 71):  # one checkpoint, at 50, while applies go on
        entry = command(i, req(f"c{i % 7}", i, Put(key=f"k{i % 13}", value=str(i).encode())))
        threaded.apply(entry)
        inline.commit(entry)
    writer.wait()
    (taken,) = threaded.poll()
    threaded.close()
    assert taken.index == 50
    assert threaded.applied_index == 70
    assert storage.checkpoints.indexes() == [50]
    ours = storage.checkpoints.load_latest().checkpoint
    theirs = inline.storage.checkpoints.load_latest().checkpoint
    assert ours is not None
    assert theirs is not None
    assert ours.index == theirs.index
    assert ours.data == theirs.data == taken.data[:]  # a view of the stored pieces
    assert ours.meta == theirs.meta


def test_recovery_refuses_a_wal_that_does_not_reach_the_checkpoint() -> None:
    node = new_node(every_entries=0, every_bytes=0)
    for i in range(1, 6):
        node.commit(command(i, req("c", i, Put(key="a", value=b"1"))))
    node.storage.wal.compact_prefix(3)  # entries 1..3 gone, and no checkpoint covers them
    node.storage.wal.sync()
    node.open()
    with pytest.raises(RecoveryError, match="missing"):
        node.replica.restore_latest()


# -------------------------------------------------------------------------------- property

clients = st.sampled_from(["c1", "c2", "c3"])
kv_keys = st.sampled_from(["a", "b", "c"])
values = st.sampled_from([b"", b"1", b"2"])
commands = st.one_of(
    st.builds(Put, key=kv_keys, value=values),
    st.builds(Delete, key=kv_keys),
    st.builds(CompareAndSet, key=kv_keys, expected=st.none() | values, new=values),
)
# (client, command, retry?) — a retry re-submits the client's previous request number
steps = st.lists(st.tuples(clients, commands, st.booleans()), min_size=1, max_size=40)


def build_entries(script: list[tuple[str, KvCommand, bool]]) -> list[Entry]:
    numbers: dict[str, int] = {}
    last: dict[str, ClientRequest] = {}
    entries: list[Entry] = []
    for i, (client, cmd, retry) in enumerate(script, start=1):
        if retry and client in last:
            request = last[client]
        else:
            numbers[client] = numbers.get(client, 0) + 1
            request = req(client, numbers[client], cmd)
            last[client] = request
        entries.append(command(i, request))
    return entries


@settings(max_examples=60, deadline=None)
@given(
    steps,
    st.integers(min_value=0, max_value=6),
    st.lists(st.integers(min_value=0, max_value=40), max_size=3),
    st.integers(min_value=0, max_value=2**32),
)
def test_crash_recover_equals_uninterrupted(
    script: list[tuple[str, KvCommand, bool]], every: int, crash_points: list[int], seed: int
) -> None:
    entries = build_entries(script)
    reference = new_node(every_entries=0, every_bytes=0)
    expected = [reference.commit(e) for e in entries]

    node = new_node(every_entries=every, every_bytes=0)
    rng = random.Random(seed)
    got = []
    for i, entry in enumerate(entries):
        if i in crash_points:
            node.crash_and_recover(rng)
            assert node.replica.applied_index == i
            assert state(node.kv) == state(reference_prefix(entries[:i]).kv)
        got.append(node.commit(entry))
    assert got == expected  # identical replies, duplicates and statuses included
    assert state(node.kv) == state(reference.kv)
    node.crash_and_recover(rng)
    assert node.replica.applied_index == len(entries)
    assert state(node.kv) == state(reference.kv)
    for client in ("c1", "c2", "c3"):
        assert node.replica.session(client) == reference.replica.session(client)


def reference_prefix(entries: list[Entry]) -> Node:
    node = new_node(every_entries=0, every_bytes=0)
    for e in entries:
        node.commit(e)
    return node


@settings(max_examples=60, deadline=None)
@given(steps, st.integers(min_value=1, max_value=4), st.integers(min_value=0, max_value=200),
       st.integers(min_value=0, max_value=2**32))
def test_crash_inside_a_storage_operation(
    script: list[tuple[str, KvCommand, bool]], every: int, countdown: int, seed: int
) -> None:
    """A crash in the middle of any disk operation (WAL append or sync, checkpoint save,
    compaction): every acknowledged entry survives, and the replica carries on correctly."""
    entries = build_entries(script)
    reference = new_node(every_entries=0, every_bytes=0)
    expected = [reference.commit(e) for e in entries]
    node = new_node(every_entries=every, every_bytes=0)
    node.disk.directory.crash_after(countdown)
    acked = 0
    try:
        for entry in entries:
            node.commit(entry)
            acked += 1
    except SimulatedCrash:
        pass
    node.disk.directory.crash_after(None)
    node.crash_and_recover(random.Random(seed))
    recovered = node.replica.applied_index
    # the entry being committed at the crash may or may not have become durable
    assert acked <= recovered <= min(acked + 1, len(entries))
    assert state(node.kv) == state(reference_prefix(entries[:recovered]).kv)
    for i in range(recovered, len(entries)):
        assert node.commit(entries[i]) == expected[i]
    assert state(node.kv) == state(reference.kv)


def test_maintain_reaches_a_machine_with_housekeeping_and_skips_one_without() -> None:
    calls: list[str] = []

    class Tidy(KvStateMachine):
        def maintain(self) -> None:
            calls.append("maintain")

    disk = MemoryDisk("m")
    storage = disk.open()
    tidy = Replica(Tidy(), checkpoints=storage.checkpoints, config=CONFIG)
    tidy.maintain()
    tidy.poll()  # polling alone never does housekeeping
    assert calls == ["maintain"]
    plain = Replica(_NoHousekeeping(), checkpoints=storage.checkpoints, config=CONFIG)
    plain.maintain()  # nothing to call, nothing raised


class _NoHousekeeping:
    def apply(self, command: bytes) -> bytes:
        return b""

    def query(self, request: bytes) -> bytes:
        return b""

    def snapshot(self) -> KvStateMachine:
        raise AssertionError("not called")

    def restore(self, data: bytes) -> None:
        raise AssertionError("not called")
