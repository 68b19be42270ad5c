"""The durable record's parts are kept up to date incrementally (an addition appends, a
collected head is sliced off): `ReleaseGate.proofs()` after any sequence of gate
operations, `SafetyKernel.record_parts()` after any sequence of signatures and GC, and
`TxStore.tombstone_tuple()` after any sequence of decisions and GC, equal the parts rebuilt
from their tables, and an unchanged part is the very same tuple (the journal diffs the
durable record by identity). The parts are read only now and then (the core reads them
once per Ready), so several additions are appended at once in between."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st
from leaderless_harness import EPOCH, make_tx, tx_id

from phalanx.consensus.crypto import FastCrypto
from phalanx.consensus.leaderless.messages import TransactionProof
from phalanx.consensus.leaderless.release import Committed, ReleaseGate
from phalanx.consensus.leaderless.safety import SafetyKernel
from phalanx.consensus.leaderless.store import TxRecord, TxState, TxStore
from phalanx.consensus.types import NodeId


class _App:
    def __init__(self) -> None:
        self.index = 0

    def applied(self) -> int:
        return self.index

    def versions(self, keys: object) -> tuple[bytes, ...]:
        return ()

    def base_versions(self, keys: object) -> tuple[bytes, ...]:
        return ()


def _rebuilt(gate: ReleaseGate) -> tuple[tuple[TransactionProof, ...], tuple[int, ...]]:
    done = [c for c in gate.unsynced.values() if c.proof is not None]
    gated = [c.proof for c in gate.gated.values() if c.proof is not None]
    return (tuple(c.proof for c in done if c.proof is not None) + tuple(gated),
            tuple(c.index for c in done))


OPS = st.lists(st.tuples(st.sampled_from(
    ["add", "add", "release", "apply", "collect", "collect_any", "skip", "sync"]),
    st.integers(0, 50)), max_size=80)


@settings(max_examples=200, deadline=None)
@given(OPS)
@example([("add", 1), ("add", 2), ("release", 0), ("apply", 0), ("collect", 0), ("add", 3),
          ("release", 0), ("collect_any", 1), ("sync", 9), ("add", 4), ("release", 0)])
def test_proofs_match_a_rebuild_after_any_operations(ops: list[tuple[str, int]]) -> None:
    app = _App()
    gate = ReleaseGate(app, start_index=0)  # type: ignore[arg-type]
    ids: list[bytes] = []
    no = 0
    for op, k in ops:
        if op == "add":
            no += 1
            tx = make_tx(f"add x{no} 1", no=no, read_only=k % 5 == 0,
                         deadline=EPOCH + k)
            proof = TransactionProof(tx=tx)
            gate.add(Committed(tx_id=tx_id(tx), proof=proof, request_command=b"",
                               writes=() if k % 5 == 0 else (f"x{no}",)))
            ids.append(tx_id(tx))
        elif op == "release":
            gate.release()
        elif op == "apply":
            app.index = gate.last_index
        elif op == "collect" and ids:
            gate.collect(ids.pop(0))  # the oldest: the usual GC order
        elif op == "collect_any" and ids:
            gate.collect(ids.pop(k % len(ids)))
        elif op == "skip":
            gate.skip_stale_reads(EPOCH + k, 0)
        elif op == "sync":
            gate.stamp(k)
            gate.mark_synced(k)
        if k % 2 == 0:  # read now and then: releases in between are appended together
            first = gate.proofs()
            assert first == _rebuilt(gate)
            assert gate.proofs() is first
    assert gate.proofs() == _rebuilt(gate)


KERNEL_OPS = st.lists(st.tuples(st.sampled_from(["endorse", "endorse", "refuse",
                                                 "forget_oldest", "forget_any", "learn",
                                                 "read"]),
                                st.integers(0, 40)), max_size=60)


@settings(max_examples=200, deadline=None)
@given(KERNEL_OPS)
def test_record_parts_match_a_rebuild_after_any_operations(ops: list[tuple[str, int]]) -> None:
    kernel = SafetyKernel(FastCrypto(NodeId("n1")), NodeId("n1"))
    txs = [make_tx(f"add x{i} 1", no=i + 1) for i in range(41)]
    signed: list[bytes] = []
    for op, k in ops:
        tx = txs[k]
        if op.startswith("forget"):
            kernel.seal()  # the core seals at the end of every step, before GC can run
        if op in ("endorse", "refuse") and not kernel.touched(tx_id(tx)):
            if op == "endorse":
                kernel.endorse(tx_id(tx), tx, (), lambda _t, _x: [])
            else:
                kernel.refuse(tx_id(tx), tx)
            signed.append(tx_id(tx))
        elif op == "forget_oldest" and signed:
            kernel.forget(signed.pop(0))
        elif op == "forget_any" and signed:
            kernel.forget(signed.pop(k % len(signed)))
        elif op == "learn":
            kernel.learn(tx_id(tx), tx)
        if op == "read":  # a step's end: several endorsements sealed (and appended) at once
            kernel.seal()  # as the core does before it reads the record
            first = kernel.record_parts()
            assert first == (tuple(kernel.endorsements()), tuple(kernel.refusals()),
                             tuple(kernel._txs.values()))
            assert all(a is b for a, b in zip(kernel.record_parts(), first, strict=True))
    kernel.seal()
    assert kernel.record_parts() == (tuple(kernel.endorsements()), tuple(kernel.refusals()),
                                     tuple(kernel._txs.values()))


STORE_OPS = st.lists(st.tuples(st.sampled_from(["commit", "commit", "drop", "unknown", "gc",
                                                "read"]),
                               st.integers(0, 40)), max_size=80)


@settings(max_examples=200, deadline=None)
@given(STORE_OPS)
@example([("commit", 1), ("commit", 2), ("read", 0), ("commit", 3), ("drop", 4),
          ("gc", 2), ("commit", 5), ("read", 0), ("unknown", 6), ("commit", 7), ("read", 0)])
def test_tombstones_match_a_rebuild_after_any_operations(ops: list[tuple[str, int]]) -> None:
    store = TxStore(max_buffered=16)
    txs = [make_tx(f"add x{i} 1", no=i + 1, deadline=EPOCH + i) for i in range(41)]
    for op, k in ops:
        tx = txs[k]
        if op in ("commit", "drop") and store.state_of(tx_id(tx)) is None:
            record = TxRecord(tx_id=tx_id(tx), tx=tx, request=None,  # type: ignore[arg-type]
                              writes=(), needs=())
            store.add(record)
            store.decide(record, TxState.COMMITTED if op == "commit" else TxState.DROPPED)
        elif op == "unknown":
            store.drop_unknown(tx_id(tx), EPOCH + k)
        elif op == "gc":
            store.gc(EPOCH + k, keep=lambda _r: False)
        elif op == "read":
            first = store.tombstone_tuple()
            assert first == tuple(store.tombstones.values())
            assert store.tombstone_tuple() is first
    assert store.tombstone_tuple() == tuple(store.tombstones.values())
