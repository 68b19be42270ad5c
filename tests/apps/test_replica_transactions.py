"""The replica in transaction mode: exactly once per transaction id in any order, GC after
deadlines, the table in checkpoints (`phalanx.apps.transactions`)."""

from __future__ import annotations

import random

import immutables
import msgpack  # type: ignore[import-untyped]  # no stubs shipped
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.apps import kv_ops, kv_wire
from phalanx.apps.envelope import envelope_chunks, parse_envelope
from phalanx.apps.interface import SnapshotFormatError
from phalanx.apps.kv import KvStateMachine
from phalanx.apps.kv_types import Add, Get, KvCommand, Put, Value
from phalanx.apps.replica import ApplyStatus, CheckpointPolicy, Replica
from phalanx.consensus.types import ClientRequest, Configuration, Entry, EntryKind, NodeId
from phalanx.net import wire
from phalanx.storage.files import Storage
from phalanx.storage.memory import MemoryDisk

CONFIG = Configuration(voters=(NodeId("n1"),))
HORIZON = 1_000


class FakeLayer:
    """A transaction is msgpack ``[tx_id, deadline_ms, command]``."""

    horizon_ms = HORIZON

    def unwrap(self, command: bytes) -> tuple[bytes, int, bytes, tuple[str, ...]] | None:
        try:
            tx_id, deadline, app = msgpack.unpackb(command)
        except Exception:
            return None
        return tx_id, deadline, app, ()


def tx(tx_id: bytes, deadline: int, cmd: KvCommand) -> bytes:
    return msgpack.packb([tx_id, deadline, kv_wire.encode_command(cmd)])


def entry(index: int, *commands: bytes, client: str = "c", no: int = 1,
          read_only: bool = False) -> Entry:
    return Entry(index=index, term=0, kind=EntryKind.COMMAND, requests=tuple(
        ClientRequest(client_id=client, request_no=no, command=c, read_only=read_only)
        for c in commands))


def decode_entry(data: bytes) -> Entry:
    return wire.decode(data, expected=Entry)


class Node:
    def __init__(self, disk: MemoryDisk | None = None, *, transactions: bool = True) -> None:
        self.disk = disk or MemoryDisk("n1")
        self.transactions = transactions
        self.open()

    def open(self) -> None:
        self.storage: Storage = self.disk.open()
        self.replica = Replica(KvStateMachine(), checkpoints=self.storage.checkpoints,
                               wal=self.storage.wal, decode_entry=decode_entry,
                               policy=CheckpointPolicy(every_entries=0, every_bytes=0),
                               config=CONFIG,
                               transactions=FakeLayer() if self.transactions else None)

    def commit(self, *commands: bytes, client: str = "c", no: int = 1) -> list[ApplyStatus]:
        e = entry(self.replica.applied_index + 1, *commands, client=client, no=no)
        self.storage.wal.append(e.index, wire.encode(e))
        self.storage.wal.sync()
        return [a.status for a in self.replica.apply(e)]

    @property
    def kv(self) -> KvStateMachine:
        machine = self.replica.machine
        assert isinstance(machine, KvStateMachine)
        return machine

    def state(self) -> bytes:
        return b"".join(self.kv.snapshot().chunks())


def test_a_later_transaction_applied_first_does_not_expire_an_earlier_one() -> None:
    # Issue 15's divergence: client c's transactions 1 and 2 touch different keys, so a
    # leaderless core may apply 2 first on a slow replica. The session rule calls 1 EXPIRED
    # there (and the replicas diverge); dedup by transaction id applies both.
    first, second = tx(b"t1", 100, Put(key="a", value=b"1")), tx(b"t2", 100,
                                                                  Put(key="b", value=b"2"))
    slow, fast = Node(), Node()
    assert fast.commit(first, no=1) + fast.commit(second, no=2) == [ApplyStatus.APPLIED] * 2
    assert slow.commit(second, no=2) + slow.commit(first, no=1) == [ApplyStatus.APPLIED] * 2
    assert slow.state() == fast.state()
    assert slow.kv.get("a") == b"1"
    # The session rule (no transaction mode) on the same order: the earlier one is lost.
    session = Node(transactions=False)
    session.commit(kv_wire.encode_command(Put(key="b", value=b"2")), no=2)
    assert session.commit(kv_wire.encode_command(Put(key="a", value=b"1")), no=1) == [
        ApplyStatus.EXPIRED]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 30), min_size=1, max_size=25), st.randoms(use_true_random=False))
def test_exactly_once_under_reordering_replay_and_restart(amounts: list[int],
                                                          rnd: random.Random) -> None:
    txs = [tx(b"t%d" % i, 100 + i, Add(key="n", amount=a)) for i, a in enumerate(amounts)]
    a, b = Node(), Node()
    for one in txs:
        assert a.commit(one) == [ApplyStatus.APPLIED]
    shuffled = txs + rnd.sample(txs, k=len(txs) // 2)  # every one, then replays
    rnd.shuffle(shuffled)
    seen: set[bytes] = set()
    for one in shuffled:
        (status,) = b.commit(one)
        assert status is (ApplyStatus.DUPLICATE if one in seen else ApplyStatus.APPLIED)
        seen.add(one)
    assert b.state() == a.state()
    assert kv_ops.decode_int(b.kv.get("n")) == sum(amounts)
    # A restart replays the WAL through the same rule (no checkpoint: all of it).
    b.open()
    b.replica.restore_latest()
    assert b.state() == a.state()
    assert len(b.replica.transactions or ()) == len(txs)


def test_duplicates_get_the_cached_result_and_malformed_ones_run_nothing() -> None:
    node = Node()
    add = tx(b"t", 10, Add(key="n", amount=5))
    assert node.commit(add, add, b"\xc1junk") == [
        ApplyStatus.APPLIED, ApplyStatus.DUPLICATE, ApplyStatus.INVALID]
    out = node.replica.apply(entry(2, add))
    assert out[0].result == node.replica.apply(entry(3, add))[0].result != b""
    assert node.kv.get("n") == b"5"


def test_read_only_transactions_are_queries() -> None:
    node = Node()
    node.commit(tx(b"w", 10, Put(key="k", value=b"v")))
    (read,) = node.replica.apply(entry(2, tx(b"r", 10, Get(key="k")), read_only=True))
    assert read.status is ApplyStatus.READ
    assert kv_wire.decode_result(read.result) == Value(value=b"v")
    assert node.replica.transactions is not None
    assert b"r" not in node.replica.transactions.records


def test_gc_bounds_the_table_and_refuses_what_it_forgot() -> None:
    node = Node()
    for i in range(200):
        node.commit(tx(b"t%03d" % i, 1_000 + 100 * i, Add(key="n", amount=1)))
    table = node.replica.transactions
    assert table is not None
    # deadlines 1000..20900, kept: those >= 20900 - HORIZON
    assert len(table) == HORIZON // 100 + 1
    assert table.collected == 200 - len(table)
    assert node.replica.status().transactions == len(table)
    # A replay of a collected transaction: it may have run, so it never runs again.
    assert node.commit(tx(b"t000", 1_000, Add(key="n", amount=1))) == [ApplyStatus.EXPIRED]
    assert node.kv.get("n") == b"200"


def test_the_table_is_the_same_whatever_the_apply_order() -> None:
    # Any order in which no transaction arrives below the cutoff (a correct core never
    # releases one: it ignores transactions older than its own horizon).
    deadlines = {b"low1": 100, b"low2": 200, b"h1": 3_900, b"h2": 4_000, b"h3": 4_500,
                 b"h4": 5_000}
    a, b = Node(), Node()
    for name in (b"low1", b"low2", b"h1", b"h2", b"h3", b"h4"):
        a.commit(tx(name, deadlines[name], Add(key="n", amount=1)))
    for name in (b"low2", b"low1", b"h2", b"h1", b"h3", b"h4"):
        b.commit(tx(name, deadlines[name], Add(key="n", amount=1)))
    ta, tb = a.replica.transactions, b.replica.transactions
    assert ta is not None
    assert tb is not None
    assert dict(ta.records) == dict(tb.records)
    assert sorted(ta.records) == [b"h2", b"h3", b"h4"]  # deadline >= 5000 - HORIZON
    assert a.state() == b.state()
    assert a.kv.get("n") == b"6"


def test_checkpoint_round_trip_keeps_the_table() -> None:
    node = Node()
    for i in range(5):
        node.commit(tx(b"t%d" % i, 100 + i, Add(key="n", amount=1)))
    assert node.replica.checkpoint_now()
    node.replica.poll()
    data = node.storage.checkpoints.load_latest().checkpoint
    assert data is not None
    parsed = parse_envelope(data.data)
    assert parsed.version == 3
    assert sorted(parsed.transactions) == [b"t%d" % i for i in range(5)]
    assert parsed.max_deadline_ms == 104
    fresh = Node(node.disk)
    fresh.replica.restore_latest()
    assert fresh.state() == node.state()
    assert fresh.commit(tx(b"t3", 103, Add(key="n", amount=1))) == [ApplyStatus.DUPLICATE]
    assert fresh.kv.get("n") == b"5"
    # A session-mode replica refuses it (another protocol's checkpoint).
    with pytest.raises(SnapshotFormatError, match="transaction table"):
        Node(node.disk, transactions=False).replica.restore_latest()


def test_session_mode_checkpoints_are_version_2_and_load_in_transaction_mode() -> None:
    session = Node(transactions=False)
    session.commit(kv_wire.encode_command(Put(key="k", value=b"v")))
    assert session.replica.checkpoint_now()
    session.replica.poll()
    stored = session.storage.checkpoints.load_latest().checkpoint
    assert stored is not None
    assert parse_envelope(stored.data).version == 2
    node = Node(session.disk)
    node.replica.restore_latest()
    assert node.kv.get("k") == b"v"
    assert node.replica.transactions is not None
    assert len(node.replica.transactions) == 0


def test_malformed_transaction_records_are_refused() -> None:
    good = b"".join(envelope_chunks(index=1, sessions=immutables.Map(),
                                    app=KvStateMachine().snapshot(),
                                    transactions=immutables.Map(),
                                    max_deadline_ms=0))
    assert parse_envelope(good).version == 3
    header = msgpack.packb(["phalanx.replica", 3, 1, 0, 0, 1, 5])
    for record in ([b"id", "x", b""], [b"id", 1], ["id", 1, b""]):
        with pytest.raises(SnapshotFormatError):
            parse_envelope(header + msgpack.packb(record))
    with pytest.raises(SnapshotFormatError):
        parse_envelope(msgpack.packb(["phalanx.replica", 3, 1, 0, 0, 1]))


def test_admit_reads_the_transaction_inside() -> None:
    node = Node()
    assert node.replica.admit("c", b"\xc1", False) == "malformed transaction"
    huge = tx(b"t", 1, Put(key="k", value=b"x" * (2 << 20)))
    assert node.replica.admit("c", huge, False) is not None
    assert node.replica.admit("c", tx(b"t", 1, Put(key="k", value=b"x")), False) is None


def test_admit_takes_a_stale_read_as_a_plain_command() -> None:
    """A STALE read is answered by `query` from local state (the client sends the plain
    command: it has no effect, so nothing to sign); only what goes to the core is wrapped."""
    node = Node()
    get = kv_wire.encode_command(Get(key="k"))
    assert node.replica.admit("c", get, True) == "malformed transaction"
    assert node.replica.admit("c", get, True, local=True) is None
