"""The leaderless runtime half (`phalanx.protocols.leaderless_node`): the wire transaction
codec, the replica's transaction layer and the core's view of the app over a replica."""

from __future__ import annotations

import dataclasses

import pytest

from phalanx.apps import kv_ops, kv_wire
from phalanx.apps.interface import KeyAccess
from phalanx.apps.kv import KvStateMachine
from phalanx.apps.kv_types import Add, Delete, Get, KvCommand, Put, SAdd, SRem
from phalanx.apps.replica import ApplyStatus, Replica
from phalanx.consensus.leaderless.messages import (
    Endorsement,
    Requirement,
    Transaction,
    transaction_id,
)
from phalanx.consensus.leaderless.tx_codec import TxIds
from phalanx.consensus.types import ClientRequest, Entry, EntryKind, NodeId
from phalanx.net import wire
from phalanx.ops.signing_keys import TransactionSigner, client_verifier
from phalanx.protocols import leaderless_node
from phalanx.protocols.leaderless_node import (
    REPLICA_HORIZON_MS,
    ReplicaAppView,
    TxLayer,
    WireTxCodec,
)
from phalanx.protocols.spec import ProtocolError
from phalanx.storage.memory import MemoryDisk

enc = kv_wire.encode_command


def transaction(cmd: KvCommand, *, no: int = 1, deadline: int = 1_700_000_060_000,
                signer: TransactionSigner | None = None) -> Transaction:
    tx = Transaction(client="alice", client_id="c1", request_no=no, deadline_ms=deadline,
                     requirements=(), command=enc(cmd))
    return tx if signer is None else dataclasses.replace(tx, signature=signer.signature(tx))


def replica() -> Replica:
    storage = MemoryDisk("n1").open()
    return Replica(KvStateMachine(), checkpoints=storage.checkpoints, transactions=TxLayer())


def test_codec_round_trips_and_refuses_garbage_and_other_types() -> None:
    codec = WireTxCodec()
    signer = TransactionSigner("alice", bytes(range(32)))
    tx = transaction(Put(key="k", value=b"v"), signer=signer)
    assert codec.decode(codec.encode(tx)) == tx
    assert client_verifier({"alice": signer.public_key}).verify(NodeId("alice"), tx,
                                                                tx.signature)
    assert codec.decode(b"") is None
    assert codec.decode(b"\xc1garbage") is None
    assert codec.decode(wire.encode(Endorsement(tx_id=b"x", endorser=NodeId("n1")))) is None


def test_tx_layer_unwraps_with_the_cores_transaction_id() -> None:
    layer = TxLayer()
    assert layer.horizon_ms == REPLICA_HORIZON_MS
    signed = transaction(Add(key="n", amount=2),
                         signer=TransactionSigner("alice", bytes(32)))
    data = WireTxCodec().encode(signed)
    tx_id, deadline, command, pinned = layer.unwrap(data) or (b"", 0, b"", ("?",))
    assert tx_id == transaction_id(signed, wire.encode)
    assert tx_id == transaction_id(dataclasses.replace(signed, signature=b""), wire.encode)
    assert (deadline, command, pinned) == (signed.deadline_ms, enc(Add(key="n", amount=2)), ())
    assert layer.unwrap(b"junk") is None


def test_a_commuting_update_pinned_by_a_full_requirement_moves_the_base() -> None:
    """The replica hands `apply_tx` the keys a transaction requires by FULL version
    (`TxLayer.unwrap`): such an update moves the base, one required by base joins the run
    (docs/LEADERLESS.md "Simulation", seeds 108 218 402 564)."""
    r, codec = replica(), WireTxCodec()
    machine = r.machine
    assert isinstance(machine, KvStateMachine)
    layer = TxLayer()
    for no, (member, base) in enumerate([(b"a", True), (b"b", True), (b"c", False)], start=1):
        before = machine.base_versions(["s"])
        reqs = (Requirement(key="s", version=before[0] if base else machine.versions(["s"])[0],
                            base=base),)
        data = codec.encode(dataclasses.replace(transaction(SAdd(key="s", member=member),
                                                            no=no), requirements=reqs))
        assert (layer.unwrap(data) or ((),) * 4)[3] == (() if base else ("s",))
        request = ClientRequest(client_id="c1", request_no=no, command=data)
        (out,) = r.apply(Entry(index=no, term=0, kind=EntryKind.COMMAND, requests=(request,)))
        assert out.status is ApplyStatus.APPLIED
        assert (machine.base_versions(["s"]) == before) is base


def test_a_replica_in_transaction_mode_applies_wire_transactions_once() -> None:
    r = replica()
    codec = WireTxCodec()
    add = codec.encode(transaction(Add(key="n", amount=3)))
    other = codec.encode(transaction(Add(key="n", amount=3), no=2))  # another id
    statuses = []
    for i, command in enumerate((add, other, add), start=1):
        request = ClientRequest(client_id="c1", request_no=1, command=command)
        (out,) = r.apply(Entry(index=i, term=0, kind=EntryKind.COMMAND, requests=(request,)))
        statuses.append(out.status)
    assert statuses == [ApplyStatus.APPLIED, ApplyStatus.APPLIED, ApplyStatus.DUPLICATE]
    machine = r.machine
    assert isinstance(machine, KvStateMachine)
    assert kv_ops.decode_int(machine.get("n")) == 6


def test_app_view_reads_conflicts_versions_votes_and_the_applied_index() -> None:
    r = replica()
    view = ReplicaAppView(r, policies={"small": lambda c: len(c) < 20})
    add, add2 = enc(Add(key="n", amount=1)), enc(Add(key="n", amount=5))
    put, put2 = enc(Put(key="k", value=b"a")), enc(Put(key="k", value=b"b"))
    assert not view.conflicts(add, add2)
    assert view.conflicts(put, put2)
    assert not view.conflicts(put, put)  # identical sets commute (PnyxDB's matrix)
    assert view.conflicts(add, enc(Get(key="n")))
    assert not view.conflicts(enc(SAdd(key="s", member=b"a")), enc(SRem(key="s", member=b"b")))
    assert view.writes(put) == ("k",)
    assert view.needs_requirements(put) == ("k",)
    assert view.needs_requirements(add) == ()
    assert view.accepts(put, "")
    assert not view.accepts(b"\xc1", "")  # the app's check refuses what does not decode
    assert not view.accepts(put, "nobody-defined-this")
    assert view.accepts(put, "small")
    assert not view.accepts(enc(Put(key="k", value=b"x" * 40)), "small")
    assert view.versions(["k"]) == (b"",)
    assert view.applied() == 0
    tx = transaction(Put(key="k", value=b"a"))
    request = ClientRequest(client_id="c1", request_no=1, command=WireTxCodec().encode(tx))
    r.apply(Entry(index=1, term=0, kind=EntryKind.COMMAND, requests=(request,)))
    assert view.applied() == 1
    # Transaction mode: the version is the KV chain version of the applied transaction.
    model = KvStateMachine()
    model.apply_tx(transaction_id(tx, wire.encode),
                   kv_wire.encode_command(Put(key="k", value=b"a")))
    assert view.versions(["k", "n"]) == (model.versions(["k"])[0], b"")
    assert view.versions(["k"]) != (kv_ops.version_of(b"a"),)


def test_the_access_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(leaderless_node, "ACCESS_CACHE", 8)
    view = ReplicaAppView(replica())
    for i in range(50):
        assert view.access(enc(Delete(key=f"k{i}"))) == KeyAccess(writes=(f"k{i}",))
    assert len(view._access) == 8
    assert view.access(enc(Delete(key="k0"))) == KeyAccess(writes=("k0",))  # recomputed


def test_an_app_without_endorsement_hooks_is_refused() -> None:
    class Plain:
        def apply(self, command: bytes) -> bytes:
            return b""

        def query(self, request: bytes) -> bytes:
            return b""

        def snapshot(self) -> KvStateMachine:  # pragma: no cover - never called
            raise AssertionError("this test's app without hooks is never checkpointed")

        def restore(self, data: bytes) -> None:  # pragma: no cover - never called
            raise AssertionError("this test's app without hooks is never restored")

    storage = MemoryDisk("n1").open()
    plain = Replica(Plain(), checkpoints=storage.checkpoints)  # type: ignore[arg-type]
    with pytest.raises(ProtocolError, match="EndorsementHooks"):
        ReplicaAppView(plain)


def test_app_view_names_the_applied_ids_a_table_would_still_record() -> None:
    """`applied_within(D)`: the replica's table ids whose deadline is at least D minus the
    table's horizon, sorted (state transfer's coverage rule); none without a table."""
    r = replica()
    view = ReplicaAppView(r)
    codec = WireTxCodec()
    base = 1_700_000_060_000
    ids = []
    for no, deadline in enumerate((base, base + 5_000), start=1):
        tx = transaction(Add(key="n", amount=1), no=no, deadline=deadline)
        ids.append(transaction_id(tx, codec.encode))
        request = ClientRequest(client_id="c1", request_no=no, command=codec.encode(tx))
        r.apply(Entry(index=no, term=0, kind=EntryKind.COMMAND, requests=(request,)))
    assert view.applied_within(base) == sorted(ids)
    assert view.applied_within(base + REPLICA_HORIZON_MS) == sorted(ids)
    assert view.applied_within(base + REPLICA_HORIZON_MS + 1) == [ids[1]]
    assert view.applied_within(base + 5_000 + REPLICA_HORIZON_MS + 1) == []
    storage = MemoryDisk("n2").open()
    assert ReplicaAppView(Replica(KvStateMachine(), checkpoints=storage.checkpoints)
                          ).applied_within(base) == []


def test_the_wire_codec_remembers_bounded_decodes_and_ids(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A `WireTxCodec` remembers decodes and ids (bounded) and gives what a fresh decode and
    `transaction_id` give; a real node's `TxLayer` and core share one (`shared_codec`)."""
    monkeypatch.setattr(leaderless_node, "TX_MEMO", 8)
    codec = WireTxCodec()
    assert isinstance(codec, TxIds)
    signer = TransactionSigner("alice", bytes(32))
    txs = [transaction(Put(key=f"k{i}", value=b"v"), no=i, signer=signer) for i in range(20)]
    layer = TxLayer(codec)
    for tx in txs:
        data = codec.encode(tx)
        got = codec.decode(data)
        assert got == tx
        assert layer.unwrap(data) == (transaction_id(tx, wire.encode), tx.deadline_ms,
                                      tx.command, ())
        assert codec.decode(data) is got  # remembered: the core's decode after admission
        assert codec.transaction_id(got) == transaction_id(tx, wire.encode)
    assert len(codec._decoded) == 8
    assert len(codec._ids) == 8
    assert codec.decode(codec.encode(txs[0])) == txs[0]  # decoded again
    assert codec.decode(b"\xc1garbage") is None
    assert len(codec._decoded) == 8
    assert leaderless_node.shared_codec() is leaderless_node.shared_codec()


def test_large_transactions_stay_out_of_the_codec_memos() -> None:
    """A transaction frame above `TX_MEMO_MAX_BYTES` (a command may be ~2 MiB: 4,096 of them
    would hold gigabytes) is decoded and identified each time, never kept."""
    codec = WireTxCodec()
    signer = TransactionSigner("alice", bytes(32))
    big = transaction(Put(key="big", value=b"x" * leaderless_node.TX_MEMO_MAX_BYTES), no=1,
                      signer=signer)
    data = codec.encode(big)
    assert codec.decode(data) == big
    assert codec.transaction_id(big) == transaction_id(big, wire.encode)
    assert TxLayer(codec).unwrap(data) is not None
    assert (len(codec._decoded), len(codec._ids)) == (0, 0)
