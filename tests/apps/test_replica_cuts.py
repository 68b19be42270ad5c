"""Content-defined checkpoints of a transaction-mode replica (`CheckpointPolicy.cut_every`):
replicas that pass through one applied set, in any order, checkpoint it alike; the table's
order-free sum (`TransactionTable.id_sum`) is a function of its id set (through GC and a
checkpoint load)."""

from __future__ import annotations

import random

import msgpack  # type: ignore[import-untyped]  # no stubs shipped
from hypothesis import given, settings
from hypothesis import strategies as st

from phalanx.apps import kv_wire
from phalanx.apps.envelope import parse_envelope
from phalanx.apps.kv import KvStateMachine
from phalanx.apps.kv_types import Add
from phalanx.apps.replica import CheckpointPolicy, Replica
from phalanx.apps.transactions import id_weight
from phalanx.consensus.types import ClientRequest, Configuration, Entry, EntryKind, NodeId
from phalanx.net import wire
from phalanx.storage.memory import MemoryDisk

HORIZON = 1_000


class Layer:
    """A transaction is msgpack ``[tx_id, deadline_ms, command]``."""

    horizon_ms = HORIZON

    def unwrap(self, command: bytes) -> tuple[bytes, int, bytes, tuple[str, ...]] | None:
        tx_id, deadline, app = msgpack.unpackb(command)
        return tx_id, deadline, app, ()


def make(cut_every: int) -> tuple[Replica, MemoryDisk]:
    disk = MemoryDisk("n1")
    storage = disk.open()
    replica = Replica(KvStateMachine(), checkpoints=storage.checkpoints, wal=storage.wal,
                      decode_entry=lambda d: wire.decode(d, expected=Entry),
                      policy=CheckpointPolicy(every_entries=0, every_bytes=0,
                                              cut_every=cut_every),
                      config=Configuration(voters=(NodeId("n1"),)), transactions=Layer())
    return replica, disk


def apply_all(replica: Replica, txs: list[tuple[bytes, int]]) -> dict[frozenset[bytes], bytes]:
    """Apply `txs` (id, deadline) as adds, one per entry; the checkpoints taken, by the id
    set of their table (their application state)."""
    cuts: dict[frozenset[bytes], bytes] = {}
    for i, (tx_id, deadline) in enumerate(txs, start=1):
        command = msgpack.packb([tx_id, deadline, kv_wire.encode_command(
            Add(key="n", amount=len(tx_id)))])
        replica.apply(Entry(index=i, term=0, kind=EntryKind.COMMAND, requests=(
            ClientRequest(client_id="c", request_no=i, command=command),)))
        for taken in replica.poll():
            parsed = parse_envelope(bytes(taken.data[:]))
            cuts[frozenset(parsed.transactions)] = parsed.app_data
    return cuts


def prefixes(txs: list[tuple[bytes, int]]) -> set[frozenset[bytes]]:
    return {frozenset(t for t, _ in txs[:k]) for k in range(1, len(txs) + 1)}


@settings(max_examples=15, deadline=None)
@given(st.integers(4, 30), st.randoms(use_true_random=False))
def test_replicas_checkpoint_the_cuts_they_share(count: int, rng: random.Random) -> None:
    txs = [(b"t%03d" % i, 10_000 + i) for i in range(count)]  # no GC: one horizon
    other = list(txs)
    for i in range(len(other) - 1):  # local swaps, as concurrent commits reorder
        if rng.random() < 0.3:
            other[i], other[i + 1] = other[i + 1], other[i]
    a, b = apply_all(make(3)[0], txs), apply_all(make(3)[0], other)
    shared = prefixes(txs) & prefixes(other)
    for ids in shared:
        selected = sum(id_weight(t) for t in ids) % (1 << 256) % 3 == 0
        assert (ids in a) == selected
        assert (ids in b) == selected
        if selected:
            assert a[ids] == b[ids]
    assert set(a) <= prefixes(txs)


def test_the_sum_follows_gc_and_a_load() -> None:
    replica, _ = make(0)
    txs = [(b"t%03d" % i, 100 * i) for i in range(40)]  # the early ones are collected
    apply_all(replica, txs)
    table = replica.transactions
    assert table is not None
    assert 0 < len(table) < 40
    assert table.id_sum == sum(id_weight(t) for t in table.records) % (1 << 256)
    fresh, _ = make(0)
    assert fresh.transactions is not None
    fresh.transactions.load(table.records, table.max_deadline_ms)
    assert fresh.transactions.id_sum == table.id_sum
